"""The GPU device check's runner on a machine without CUDA: what it skips, how it records a
failure and goes on, its child-process plumbing, and the gpu_run check's parser (fed a
fake command). The CUDA checks themselves only run on a GPU host."""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from backends.gpu import devcheck, devcheck_checks, devcheck_children, devcheck_run
from backends.gpu.devcheck import CHECKS, run_devcheck
from backends.gpu.devcheck_children import CheckFailed, Context, run_children

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the no-CUDA path")


def _read(out: Path) -> dict:
    return json.loads((out / "devcheck.json").read_text())


@pytest.fixture
def with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devcheck, "cuda_status", lambda: (True, "a pretend GPU"))


@no_cuda
def test_without_cuda_the_environment_runs_and_every_cuda_check_is_skipped(
    tmp_path, monkeypatch, capsys
):
    # Two modules stand in for the six (one imports, one does not) to keep this quick.
    monkeypatch.setattr(devcheck_checks, "MODULES", ("json", "no_such_module_for_devcheck"))
    code, report = run_devcheck(tmp_path / "out")
    assert code == devcheck.NOTHING_CHECKED == 3  # no GPU was checked: not a pass
    assert _read(tmp_path / "out") == json.loads(json.dumps(report, default=str))
    env = report["checks"]["environment"]
    assert env["status"] == "passed"
    figures = env["figures"]
    assert figures["torch"] == torch.__version__ and figures["cuda_available"] is False
    assert figures["modules"]["json"] and figures["modules"]["no_such_module_for_devcheck"] is None
    assert "ModuleNotFoundError" in figures["import_errors"]["no_such_module_for_devcheck"]
    assert list(report["checks"]) == list(CHECKS)
    for name in CHECKS[1:]:
        entry = report["checks"][name]
        assert entry["status"] == "skipped", name
        assert entry["reason"].startswith("no CUDA device: "), entry
    assert report["counts"] == {"passed": 1, "failed": 0, "skipped": len(CHECKS) - 1}
    assert report["exit_code"] == 3 and report["cuda"]["available"] is False
    assert "nothing was checked on a GPU (no CUDA device: " in capsys.readouterr().err


def test_a_check_that_raises_is_recorded_as_failed_and_the_next_one_runs(
    tmp_path, monkeypatch, with_cuda
):
    def boom(ctx: Context) -> dict:
        raise RuntimeError("the copy went wrong")

    def bad_figures(ctx: Context) -> dict:
        raise CheckFailed("bits differ", {"bitwise": False})

    monkeypatch.setattr(devcheck_checks, "copy_ceiling", boom)
    monkeypatch.setattr(devcheck_checks, "cuda_ipc", lambda ctx: {"gbps": 1.0, "t": ctx.timeout_s})
    monkeypatch.setattr(devcheck_checks, "nccl_two_hosts", bad_figures)
    code, report = run_devcheck(tmp_path, checks=["nccl_two_hosts", "cuda_ipc", "copy_ceiling"])
    assert code == 1 and report["exit_code"] == 1
    assert report["planned"] == ["copy_ceiling", "cuda_ipc", "nccl_two_hosts"]  # CHECKS order
    failed = report["checks"]["copy_ceiling"]
    assert failed["status"] == "failed"
    assert failed["error"] == "RuntimeError: the copy went wrong"
    assert "boom" in failed["traceback"] and "the copy went wrong" in failed["traceback"]
    passed = report["checks"]["cuda_ipc"]
    assert passed["status"] == "passed" and passed["figures"]["gbps"] == 1.0
    assert 0 < passed["figures"]["t"] <= devcheck.PLAN["cuda_ipc"].limit_s
    kept = report["checks"]["nccl_two_hosts"]
    assert kept["status"] == "failed" and kept["figures"] == {"bitwise": False}
    assert _read(tmp_path)["checks"]["copy_ceiling"]["status"] == "failed"


@no_cuda
def test_without_cuda_a_failing_environment_still_skips_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(devcheck_checks, "environment", lambda ctx: 1 / 0)
    code, report = run_devcheck(tmp_path)
    assert code == 1
    assert report["checks"]["environment"]["error"].startswith("ZeroDivisionError")
    assert {report["checks"][n]["status"] for n in CHECKS[1:]} == {"skipped"}


def test_a_spent_budget_skips_checks_and_unknown_names_are_refused(tmp_path, with_cuda):
    code, report = run_devcheck(tmp_path, budget_s=0.0, checks=["environment"])
    assert code == 0  # no check that needs a GPU was asked for
    code, report = run_devcheck(tmp_path, budget_s=0.0, checks=["environment", "cuda_ipc"])
    assert code == 3 and report["checks"]["cuda_ipc"]["reason"].startswith("time budget")
    assert report["checks"]["environment"]["reason"].startswith("time budget spent")
    with pytest.raises(ValueError, match="unknown checks"):
        run_devcheck(tmp_path, checks=["environment", "warp_drive"])


def test_children_report_values_errors_deaths_and_timeouts(tmp_path, monkeypatch):
    monkeypatch.setenv("DEVCHECK_GONE", "parent's")
    entries = [
        (os.getenv, ("DEVCHECK_PROBE",), {"DEVCHECK_PROBE": "set for the child"}),
        (os.getenv, ("DEVCHECK_GONE",), {"DEVCHECK_GONE": None}),
        (operator.truediv, (1, 0), {}),
        (os._exit, (3,), {}),
        (time.sleep, (60,), {}),
    ]
    t0 = time.monotonic()
    outcomes = run_children("probe", Context(out=tmp_path), entries, timeout_s=5.0)
    assert time.monotonic() - t0 < 30
    kinds = [kind for kind, _ in outcomes]
    assert kinds == ["ok", "ok", "error", "exited", "timeout"], outcomes
    assert outcomes[0][1] == "set for the child" and outcomes[1][1] is None
    assert "ZeroDivisionError" in outcomes[2][1] and "exit code 3" in outcomes[3][1]
    assert "DEVCHECK_PROBE" not in os.environ and os.environ["DEVCHECK_GONE"] == "parent's"
    assert "ZeroDivisionError" in (tmp_path / "logs" / "probe.2.log").read_text()
    with pytest.raises(CheckFailed) as failure:
        devcheck_children.all_ok("probe", outcomes)
    assert set(failure.value.figures) == {"child_2", "child_3", "child_4"}


def test_every_planned_check_is_a_function_the_runner_finds_by_name() -> None:
    for name in CHECKS:
        check = devcheck._check(name)
        assert callable(check) and check.__name__ == name, name
    assert devcheck._check("gpu_run") is devcheck_run.gpu_run


def test_the_runner_starts_without_torch() -> None:
    """It asks whether torch imports (cuda_status): its own imports must not need torch."""
    code = "import sys, backends.gpu.devcheck\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False"], done.stderr


SUMMARY = {
    "status": "finished",
    "oracles": {"bounded_staleness": "pass", "reward_rises": "pass"},
    "violations": {},
    "mean_reward_first": 0.41,
    "mean_reward_last": 0.93,
    "transfer": {"updates": 9, "median_gbps": 12.5},
    "history_hash": "ignored",
}


def _fake(summary: dict, code: int = 0, stderr: str = "") -> list[str]:
    script = (
        "import sys\nprint('step 1 reward 0.4')\nprint('{not json')\n"
        f"print({json.dumps(json.dumps(summary))})\nprint({stderr!r}, file=sys.stderr)\n"
        f"sys.exit({code})\n"
    )
    return [sys.executable, "-c", script]


def test_gpu_run_reports_the_last_json_line_of_a_fake_run(tmp_path, with_cuda):
    figures = devcheck_run.gpu_run(Context(out=tmp_path, run_command=_fake(SUMMARY)))
    assert figures["returncode"] == 0
    assert figures["oracles"] == SUMMARY["oracles"]
    assert (figures["mean_reward_first"], figures["mean_reward_last"]) == (0.41, 0.93)
    assert figures["transfer"] == SUMMARY["transfer"] and "history_hash" not in figures
    code, report = run_devcheck(tmp_path, checks=["gpu_run"], run_command=_fake(SUMMARY))
    assert code == 0 and report["checks"]["gpu_run"]["figures"]["status"] == "finished"


def test_the_checkpoint_run_reports_its_rewards_and_fails_on_a_failed_oracle(tmp_path, with_cuda):
    figures = devcheck_run.gpu_run_checkpoint(Context(out=tmp_path, run_command=_fake(SUMMARY)))
    assert (figures["mean_reward_first"], figures["mean_reward_last"]) == (0.41, 0.93)
    failing = {**SUMMARY, "oracles": {**SUMMARY["oracles"], "resume": "fail"}}
    with pytest.raises(CheckFailed, match="resume"):
        devcheck_run.gpu_run_checkpoint(Context(out=tmp_path, run_command=_fake(failing)))


def test_gpu_run_fails_on_a_failed_oracle_an_exit_code_or_a_timeout(tmp_path):
    failing = {**SUMMARY, "oracles": {"bounded_staleness": "fail", "reward_rises": "pass"}}
    with pytest.raises(CheckFailed, match="exit code 1") as failure:
        devcheck_run.gpu_run(
            Context(out=tmp_path, run_command=_fake(failing, 1, "Traceback: engine died"))
        )
    assert failure.value.figures["returncode"] == 1
    assert "engine died" in failure.value.figures["stderr_tail"]
    with pytest.raises(CheckFailed, match=r"oracles failed: \['bounded_staleness'\]"):
        devcheck_run.gpu_run(Context(out=tmp_path, run_command=_fake(failing, 0)))
    with pytest.raises(CheckFailed, match="no JSON line"):
        devcheck_run.gpu_run(Context(out=tmp_path, run_command=[sys.executable, "-c", "1"]))
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    with pytest.raises(CheckFailed, match="did not end") as failure:
        devcheck_run.gpu_run(Context(out=tmp_path, timeout_s=1.0, run_command=sleeper))
    assert "started" in failure.value.figures["stdout_tail"]


def test_the_checks_read_their_children_outcomes(tmp_path, monkeypatch):
    """The parent side of the CUDA checks, fed what their children would send back."""
    ctx = Context(out=tmp_path, results={"copy_ceiling": {"figures": {"gbps": 2000.0}}})

    def children(*outcomes):
        monkeypatch.setattr(devcheck_checks, "run_children", lambda *a, **k: list(outcomes))

    refusal = (
        "DistBackendError: NCCL error\nLast error:\nDuplicate GPU detected : rank 1 and rank 0"
    )
    children(("error", refusal), ("timeout", "no report in 60 s; killed"))
    figures = devcheck_checks.nccl_duplicate_gpu_refused(ctx)
    assert figures["refused"] and figures["duplicate_gpu_message"]
    assert figures["message"].startswith("Duplicate GPU detected")
    children(("ok", {}), ("ok", {}))
    assert "note" in devcheck_checks.nccl_duplicate_gpu_refused(ctx)

    rank = {"init_seconds": 1.0, "broadcast_seconds": [0.5, 0.25], "bitwise": True, "nccl": "2"}
    children(("ok", rank), ("ok", {**rank, "p2p_ok": True}))
    figures = devcheck_checks.nccl_two_hosts(ctx, nbytes=10**9)
    assert figures["gbps"] == 4.0 and figures["bitwise"] and figures["p2p_ok"]
    children(("ok", rank), ("ok", {**rank, "bitwise": False, "p2p_ok": True}))
    with pytest.raises(CheckFailed, match="differ"):
        devcheck_checks.nccl_two_hosts(ctx)

    consumer = {"gbps": 1000.0, "bitwise": True, "matches_seeded_pattern": True}
    children(("ok", {"share_seconds": 0.1}), ("ok", consumer))
    assert devcheck_checks.cuda_ipc(ctx)["ratio_to_ceiling"] == 0.5
    children(("ok", {"share_seconds": 0.1}), ("error", "Traceback\nRuntimeError: invalid handle"))
    with pytest.raises(CheckFailed, match="child_1") as failure:
        devcheck_checks.cuda_ipc(ctx)
    assert "invalid handle" in failure.value.figures["child_1"]


@pytest.mark.parametrize("entry", [devcheck.main, None], ids=["devcheck-main", "gpu-cli"])
def test_an_out_folder_that_cannot_be_made_exits_2_naming_out(tmp_path, capsys, entry):
    """/proc/x cannot be made (root's os.access says yes): exit 2 naming --out, before any
    check runs, with no traceback."""
    from backends.gpu.__main__ import main as gpu_main

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for out in ("/proc/x/devcheck", str(blocked / "sub")):
        with pytest.raises(SystemExit) as exit_:
            (entry or (lambda argv: gpu_main(["devcheck", *argv])))(["--out", out])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--out: cannot write" in err and out in err and "Traceback" not in err
        assert "devcheck: environment" not in err  # no check ran


@pytest.mark.parametrize("budget", ["1e300", "inf", "nan", "-5"])
@pytest.mark.parametrize("entry", [devcheck.main, None], ids=["devcheck-main", "gpu-cli"])
def test_a_budget_past_a_day_or_not_a_number_exits_2_naming_it(tmp_path, capsys, entry, budget):
    """--budget was unbounded (issue 52): inf let every check run with no time cap."""
    from backends.gpu.__main__ import main as gpu_main

    with pytest.raises(SystemExit) as exit_:
        (entry or (lambda argv: gpu_main(["devcheck", *argv])))(
            ["--out", str(tmp_path / "out"), "--budget", budget]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--budget: got" in err and "86400" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything was written
