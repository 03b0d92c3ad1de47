"""The real backends' ``run`` command refuses what it cannot use before Ray starts.

``--load /nonexistent`` exited 2 only after 23 s of Ray start-up; ``--address`` to a host
nobody answers at printed Ray's 72 lines and three tracebacks; ``--save`` into a folder that
cannot be made failed after the whole run; ``--trace`` and ``--metrics`` on one file wrote
one over the other. Each is now one ``error:`` line naming the flag, exit 2, and the run
(``run_real``, which starts Ray) is never called. No test here starts Ray.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from backends.common.run import command as cli
from backends.common.run import preflight
from backends.common.session import address as join
from backends.cpu.__main__ import main as cpu_main
from miles_core.errors import ConfigError


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "run_real", lambda *a, **k: pytest.fail("the run (Ray) started"))


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Exit 2, one error line and no traceback; the stderr text."""
    with pytest.raises(SystemExit) as caught:
        cpu_main(["run", "--steps", "1", *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1, err
    return err


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_load_is_checked_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None
) -> None:
    err = run_error(capsys, "--load", "/nonexistent")
    assert "--load: '/nonexistent' does not exist" in err and "written by --save" in err
    assert "holds no checkpoint.pt" in run_error(capsys, "--load", str(tmp_path))
    (tmp_path / "file").write_text("")
    assert "is not a directory" in run_error(capsys, "--load", str(tmp_path / "file"))


def test_save_is_checked_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None
) -> None:
    """/proc/x: os.access says root may write /proc; making a file there fails."""
    err = run_error(capsys, "--save", "/proc/x")
    assert "--save: cannot make '/proc/x'" in err
    (tmp_path / "file").write_text("")
    assert "--save: " in run_error(capsys, "--save", str(tmp_path / "file" / "ckpt"))
    assert "is a file" in run_error(capsys, "--save", str(tmp_path / "file"))


def test_a_folder_that_can_be_made_is_left_unmade(tmp_path: Path) -> None:
    """The control: a good --save passes, and nothing is left behind by the probe."""
    assert preflight.check_save(str(tmp_path / "a" / "b")) == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []


def test_two_outputs_on_one_path_are_refused_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None
) -> None:
    out = str(tmp_path / "out.json")
    err = run_error(capsys, "--trace", out, "--metrics", out)
    assert "--metrics: " in err and "the path of --trace too" in err
    scenario = tmp_path / "s.toml"
    scenario.write_text("[loop]\nsteps = 2\n")
    err = run_error(capsys, "--scenario", str(scenario), "--metrics", str(scenario))
    assert "the path of --scenario too" in err and "destroy the input" in err


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("127.0.0.1:{port}", ("Connection refused",)),
        ("ray://127.0.0.1:{port}", ("Connection refused",)),
        ("no-such-host.invalid:6379", ("does not resolve",)),
        ("10.0.0.1", ("write HOST:PORT",)),
        ("127.0.0.1:port", ("write HOST:PORT",)),
    ],
)
def test_an_address_nobody_answers_at_is_one_line_before_ray(
    capsys: pytest.CaptureFixture[str], no_ray: None, address: str, words: tuple[str, ...]
) -> None:
    err = run_error(capsys, "--address", address.format(port=closed_port()))
    assert "--address: " in err and ("leave --address out" in err or "HOST:PORT" in err)
    for word in words:
        assert word in err, (word, err)


def test_auto_and_local_are_left_to_ray() -> None:
    for word in ("auto", "local", None):
        assert join.check_address(word) is None


def _probe(monkeypatch: pytest.MonkeyPatch, script: str) -> str | None:
    """``_not_a_gcs`` with the child's script replaced (Ray's GcsClient stands apart)."""
    monkeypatch.setattr(join, "_GCS_PROBE", script)
    return join._not_a_gcs("127.0.0.1:1", seconds=5.0)


def test_what_the_gcs_probe_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Something accepts the connection but is no GCS (the sandbox's HTTP proxy answered
    ray.init with a 404 for 20 s): refused with Ray's own words. A probe that cannot tell
    (a Ray whose private API moved) leaves the address to ray.init."""
    said = _probe(monkeypatch, "print('RpcError: RPC error: Received http2 header: 404')")
    assert said is not None and "Ray cannot join it: RpcError" in said
    assert _probe(monkeypatch, "print('ok')") is None
    assert _probe(monkeypatch, "print('unknown')") is None
    assert _probe(monkeypatch, "import sys; sys.exit(1)") is None
    monkeypatch.setattr(join, "_GCS_PROBE", "import time; time.sleep(30)")
    said = join._not_a_gcs("127.0.0.1:1", seconds=0.5)
    assert said == "no answer as a Ray GCS in 0.5 s"


def test_a_probe_refusal_names_the_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(join, "_unreachable", lambda *a: None)
    monkeypatch.setattr(join, "_not_a_gcs", lambda *a: "something answers there, but...")
    with pytest.raises(ConfigError) as caught:
        join.check_address("10.1.2.3:6379")
    assert caught.value.field == "--address" and "'10.1.2.3:6379'" in str(caught.value)


def test_the_bench_refuses_a_plot_over_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out x.png made the default plot (--out as .png) the JSON's own path."""
    from backends.bench.__main__ import main as bench

    with pytest.raises(SystemExit) as caught:
        bench(["transfer", "--out", str(tmp_path / "x.png")])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--plot (default: --out as .png)" in err and "the path of --out too" in err


def test_the_sweep_checks_its_address_before_ray(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli.sweep import main as sweep

    with pytest.raises(SystemExit) as caught:
        sweep(["--seeds", "1", "--address", f"127.0.0.1:{closed_port()}"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--address: cannot join a Ray cluster" in err and "Traceback" not in err
