"""Any cluster from a file (issue 51, item 5): every anchor preset is a file in clusters/
that predicts exactly what the preset does, every layout that cannot exist is refused
naming its key before any work, and docs/clusters.md's examples print what they quote."""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_core.errors import ConfigError
from miles_core.scenario import PRESETS
from miles_core.scenario.anchor_presets import ANCHOR_PRESETS, CLUSTERS, SYSTEM_MODES, SYSTEMS
from sim.cli.predict import main as predict
from sim.timing import cluster_setup as setup_mod  # (not "setup_module": pytest calls that)
from sim.timing.anchors import update_terms
from sim.timing.calibration import predict_update_seconds
from sim.timing.cluster_file import load_cluster
from sim.timing.cluster_setup import ClusterSetup, cluster_setup, predict_cluster

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_FILES = ROOT / "clusters"
DOC = ROOT / "docs" / "clusters.md"
GIB = 1 << 30

BASE: dict[str, dict[str, Any]] = {
    "model": {
        "name": "Qwen3-30B-A3B",
        "params_billions": 30.5,
        "dtype": "bf16",
        "layers": 48,
        "experts": 128,
    },
    "trainer": {"nodes": 2, "gpus_per_node": 8, "tp": 4, "pp": 2, "ep": 8},
    "engines": {"count": 2, "gpus": 8, "tp": 8, "ep": 8},
    "transfer": {"system": "miles-rdma", "bucket_mib": 1024},
}
"""A valid file: 16 trainer GPUs (TP 4 x PP 2, EP 8 within a stage of 8), 2 engines of 8."""


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    return json.dumps(value)


def _toml(data: dict[str, Any]) -> str:
    top = [f"{k} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [
        "\n".join([f"[{name}]", *(f"{k} = {_value(v)}" for k, v in table.items())])
        for name, table in data.items()
        if isinstance(table, dict)
    ]
    return "\n".join(top) + "\n" + "\n\n".join(tables) + "\n"


def _edit(*changes: tuple[str, str | None, Any]) -> str:
    """BASE with (section, key, value) set; value None deletes the key (key None: the
    section)."""
    data = copy.deepcopy(BASE)
    for section, key, value in changes:
        if key is None:
            data.pop(section, None) if value is None else data.__setitem__(section, value)
        elif value is None:
            data[section].pop(key, None)
        else:
            data.setdefault(section, {})[key] = value
    return _toml(data)


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return str(path)


def _setup(tmp_path: Path, text: str) -> ClusterSetup:
    return cluster_setup(load_cluster(_write(tmp_path, text)))


MODE_ONLY = ("transfer", None, {"mode": "broadcast"})

REFUSALS: list[tuple[str, str, str]] = [
    ("not TOML", "[model\nname = 1\n", "--cluster"),
    ("an unknown section", _edit(("gpus", None, {"count": 8})), "[gpus]"),
    ("a key outside every section", "nodes = 2\n" + _edit(), "nodes"),
    ("an unknown key", _edit(("trainer", "tpp", 4)), "[trainer].tpp"),
    ("a missing section", _edit(("engines", None, None)), "[engines]"),
    ("a section that is a value", _edit(("engines", None, 8)), "[engines]"),
    ("a missing key", _edit(("model", "dtype", None)), "[model].dtype"),
    ("a count as a string", _edit(("trainer", "nodes", "2")), "[trainer].nodes"),
    ("a fractional count", _edit(("trainer", "nodes", 2.5)), "[trainer].nodes"),
    ("a count that is a bool", _edit(("engines", "count", True)), "[engines].count"),
    ("a count of 0", _edit(("engines", "gpus", 0)), "[engines].gpus"),
    ("a negative count", _edit(("trainer", "gpus_per_node", -8)), "[trainer].gpus_per_node"),
    ("no layers", _edit(("model", "layers", 0)), "[model].layers"),
    ("no experts", _edit(("model", "experts", 0)), "[model].experts"),
    ("an empty name", _edit(("model", "name", " ")), "[model].name"),
    ("no parameters", _edit(("model", "params_billions", 0)), "[model].params_billions"),
    ("NaN parameters", _edit(("model", "params_billions", math.nan)), "[model].params_billions"),
    ("an unknown dtype", _edit(("model", "dtype", "int4")), "[model].dtype"),
    ("TP not dividing the GPUs", _edit(("trainer", "tp", 3)), "[trainer].tp"),
    ("TP x PP not dividing the GPUs", _edit(("trainer", "pp", 3)), "[trainer].pp"),
    ("TP x PP x CP not dividing the GPUs", _edit(("trainer", "cp", 3)), "[trainer].cp"),
    (
        "more stages than layers",
        _edit(
            ("trainer", "tp", 1), ("trainer", "pp", 8), ("trainer", "ep", 2), ("model", "layers", 4)
        ),
        "[trainer].pp",
    ),
    ("EP not dividing a stage", _edit(("trainer", "pp", 4)), "[trainer].ep"),
    ("EP on a dense model", _edit(("model", "experts", None)), "[trainer].ep"),
    ("EP not dividing the experts", _edit(("model", "experts", 12)), "[trainer].ep"),
    (
        "engine EP not dividing the experts",
        _edit(("model", "experts", 4), ("trainer", "ep", 4)),
        "[engines].ep",
    ),
    ("engine TP not dividing its GPUs", _edit(("engines", "tp", 3)), "[engines].tp"),
    ("engine EP not dividing its GPUs", _edit(("engines", "ep", 16)), "[engines].ep"),
    (
        "an engine straddling a node",
        _edit(("engines", "gpus", 12), ("engines", "tp", 12), ("engines", "ep", 4)),
        "[engines].gpus",
    ),
    (
        "colocated on other GPUs",
        _edit(("engines", "colocated", True), ("engines", "count", 1)),
        "[engines].count",
    ),
    ("colocated not a bool", _edit(("engines", "colocated", "yes")), "[engines].colocated"),
    (
        "no requantization time",
        _edit(("engines", "requantize_seconds", 0)),
        "[engines].requantize_seconds",
    ),
    ("an unknown system", _edit(("transfer", "system", "nccl")), "[transfer].system"),
    ("an unknown mode", _edit(("transfer", "mode", "multicast")), "[transfer].mode"),
    ("a mode against the system", _edit(("transfer", "mode", "broadcast")), "[transfer].mode"),
    ("neither system nor mode", _edit(("transfer", "system", None)), "[transfer]"),
    ("a bucket of 0", _edit(("transfer", "bucket_mib", 0)), "[transfer].bucket_mib"),
    ("a mode and no links", _edit(MODE_ONLY), "[links].inter_node_gbps"),
    (
        "a negative rate",
        _edit(MODE_ONLY, ("links", "inter_node_gbps", -1)),
        "[links].inter_node_gbps",
    ),
    (
        "an RDMA rate for a broadcast",
        _edit(MODE_ONLY, ("links", "inter_node_gbps", 47), ("links", "rdma_gbps", 45)),
        "[links].rdma_gbps",
    ),
    ("a typo of a GPU count", _edit(("trainer", "nodes", 10_000)), "[trainer].nodes"),
    ("a typo of a model size", _edit(("model", "params_billions", 1e5)), "[model].params_billions"),
    (
        "a model too big for a float",
        _edit(("model", "params_billions", 1e300)),
        "[model].params_billions",
    ),
    (
        "a replay of millions of sends",
        _edit(
            ("model", "params_billions", 1040),
            ("engines", "count", 4096),
            ("engines", "gpus", 1),
            ("engines", "tp", 1),
            ("engines", "ep", 1),
        ),
        "[engines].count",
    ),
]


def test_the_base_of_the_refusals_is_a_valid_file(tmp_path: Path) -> None:
    result = predict_cluster(_setup(tmp_path, _edit()))
    assert result["seconds"] > 0 and result["system"] == "miles-rdma"


@pytest.mark.parametrize(("text", "field"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_each_impossible_file_is_refused_naming_its_key_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    field: str,
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        cluster_setup(load_cluster(path))
    assert error.value.field == field
    assert error.value.fix
    monkeypatch.setattr(setup_mod, "predict_update_seconds", _no_work)
    with pytest.raises(SystemExit) as exited:
        predict(["--cluster", path])
    assert exited.value.code == 2
    assert f"error: {field}: " in capsys.readouterr().err


def _no_work(*args: object, **kwargs: object) -> dict[str, Any]:
    raise AssertionError("the update was replayed before the file was checked")


def test_a_missing_file_is_refused_naming_the_flag_and_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        predict(["--cluster", str(tmp_path / "nowhere.toml")])
    assert exited.value.code == 2
    assert "error: --cluster: file " in (err := capsys.readouterr().err) and "nowhere.toml" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["miles-kimi-k2-32+32-rdma"],
        ["--anchors"],
        ["--mode", "p2p"],
        ["--calibration", "fit.json"],
        ["--bucket-mib", "0"],
    ],
)
def test_cluster_takes_no_preset_mode_or_calibration(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        predict(["--cluster", str(CLUSTER_FILES / "miles-kimi-k2-32+32-rdma.toml"), *argv])
    assert exited.value.code == 2
    assert (
        f"error: {argv[0] if argv[0].startswith('--') else 'preset'}: " in capsys.readouterr().err
    )


@pytest.mark.parametrize("name", sorted(ANCHOR_PRESETS))
def test_each_anchor_preset_is_a_file_that_predicts_what_the_preset_does(name: str) -> None:
    cluster, system = ANCHOR_PRESETS[name]
    setup = cluster_setup(load_cluster(str(CLUSTER_FILES / f"{name}.toml")))
    assert (setup.file.transfer.system, setup.file.transfer.mode) == (system, SYSTEM_MODES[system])
    assert setup.cluster == CLUSTERS[cluster]
    assert setup.preset == PRESETS[name]
    got = predict_cluster(setup)
    want = predict_update_seconds(PRESETS[name], GIB, SYSTEM_MODES[system])
    assert (got["bytes"], got["buckets"]) == (want["bytes"], want["buckets"])
    assert got["seconds"] == pytest.approx(want["seconds"], rel=1e-9, abs=0)
    terms = update_terms(PRESETS[name], system, GIB)
    assert list(got["terms"]) == list(terms)
    for term, seconds in terms.items():
        assert got["terms"][term] == pytest.approx(seconds, rel=1e-9, abs=1e-12), term


@pytest.mark.parametrize("path", sorted(CLUSTER_FILES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_file_in_clusters_prints_terms_that_add_up_to_its_time(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert predict(["--cluster", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["seconds"] > 0
    assert sum(result["terms"].values()) == pytest.approx(result["seconds"], rel=1e-9)
    assert result["rates"]["wire"]["unit"] == "GB/s" and result["rates"]["wire"]["source"]


def test_the_text_output_names_each_term_and_where_each_rate_came_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(CLUSTER_FILES / "miles-kimi-k2-32+32-rdma.toml")
    assert predict(["--cluster", path]) == 0
    out = capsys.readouterr().out
    for term in ("fixed", "prepare", "wire", "land"):
        assert re.search(rf"^    {term} +\d+\.\d{{3}} s", out, re.M), term
    assert re.search(r"^    wire +45\.4 GB/s +fitted: miles-rdma$", out, re.M)
    assert re.search(r"requantize .* \[engines\] requantize_seconds = 0\.884$", out, re.M)
    assert "  weights: 2,080.0 GB in 2,032 buckets of 1024 MiB\n" in out


def test_a_rate_in_the_file_wins_over_the_systems_fit_and_says_so(tmp_path: Path) -> None:
    fitted = _setup(tmp_path, _edit())
    assert fitted.preset.timing.link_bytes_per_second == SYSTEMS["miles-rdma"].link_bytes_per_second
    assert fitted.rates["wire"].source == "fitted: miles-rdma"
    slow = _setup(tmp_path, _edit(("links", "inter_node_gbps", 20)))
    assert slow.preset.timing.link_bytes_per_second == 20e9
    assert slow.rates["wire"].source == "[links] inter_node_gbps"
    assert slow.rates["gather + convert"].source == "fitted: miles-rdma"
    assert predict_cluster(slow)["terms"]["wire"] > predict_cluster(fitted)["terms"]["wire"]
    both = _setup(tmp_path, _edit(("links", "inter_node_gbps", 20), ("links", "rdma_gbps", 30)))
    assert both.preset.timing.link_bytes_per_second == 30e9  # p2p: the RDMA rate times the wire
    assert both.rates["inter_node_gbps"].source.startswith("[links] inter_node_gbps, unused")


def test_a_mode_alone_is_the_links_and_nothing_fitted(tmp_path: Path) -> None:
    setup = _setup(tmp_path, _edit(MODE_ONLY, ("links", "inter_node_gbps", 50)))
    result = predict_cluster(setup)
    assert result["terms"]["fixed"] == result["terms"]["prepare"] == result["terms"]["land"] == 0
    latency = setup.preset.timing.link_latency_seconds
    assert result["terms"]["wire"] == pytest.approx(
        result["bytes"] / 50e9 + latency * result["buckets"]
    )
    assert set(setup.rates) == {"wire", "latency per bucket"}


def test_a_colocated_job_on_one_node_updates_over_nvlink(tmp_path: Path) -> None:
    text = _edit(
        MODE_ONLY,
        ("trainer", "nodes", 1),
        ("trainer", "ep", 4),
        ("engines", "count", 1),
        ("engines", "colocated", True),
        ("links", "nvlink_gbps", 370),
        ("links", "inter_node_gbps", 47),
    )
    setup = _setup(tmp_path, text)
    assert setup.preset.timing.link_bytes_per_second == 370e9
    assert setup.rates["wire"].source == "[links] nvlink_gbps"
    assert "unused" in setup.rates["inter_node_gbps"].source


def test_the_requantization_time_is_what_the_engines_spend_on_an_update(tmp_path: Path) -> None:
    result = predict_cluster(_setup(tmp_path, _edit(("engines", "requantize_seconds", 0.5))))
    assert result["terms"]["land"] == pytest.approx(0.5, rel=1e-6)


def test_bucket_mib_on_the_command_line_replaces_the_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(CLUSTER_FILES / "miles-glm-4.5-air-4+4-nccl.toml")
    predict(["--cluster", path, "--json"])
    whole = json.loads(capsys.readouterr().out)
    predict(["--cluster", path, "--json", "--bucket-mib", "256"])
    small = json.loads(capsys.readouterr().out)
    assert (whole["bucket_mib"], small["bucket_mib"]) == (1024, 256)
    assert small["buckets"] > whole["buckets"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def layouts(draw: st.DrawFn) -> str:
    """Any layout the rules allow, small enough to replay quickly."""
    per_node, nodes = draw(st.sampled_from([4, 8])), draw(st.integers(1, 4))
    gpus = per_node * nodes
    tp = draw(st.sampled_from(_divisors(gpus)))
    pp = draw(st.sampled_from(_divisors(gpus // tp)))
    cp = draw(st.sampled_from(_divisors(gpus // (tp * pp))))
    experts = draw(st.sampled_from([None, 8, 64]))
    shards = [d for d in _divisors(gpus // pp) if experts and experts % d == 0] or [1]
    engine_gpus = draw(st.sampled_from([*_divisors(per_node), 2 * per_node]))
    engine_shards = [d for d in _divisors(engine_gpus) if experts and experts % d == 0] or [1]
    system = draw(st.sampled_from([*SYSTEMS, None]))
    transfer = (
        {"system": system} if system else {"mode": draw(st.sampled_from(["broadcast", "p2p"]))}
    )
    return _toml(
        {
            "model": {
                "name": "m",
                "params_billions": draw(st.floats(0.5, 50)),
                "dtype": draw(st.sampled_from(["bf16", "fp16", "fp8", "fp32"])),
                "layers": draw(st.integers(pp, 80)),
                **({"experts": experts} if experts else {}),
            },
            "trainer": {
                "nodes": nodes,
                "gpus_per_node": per_node,
                "tp": tp,
                "pp": pp,
                "cp": cp,
                "ep": draw(st.sampled_from(shards)),
            },
            "engines": {
                "count": draw(st.integers(1, 4)),
                "gpus": engine_gpus,
                "tp": draw(st.sampled_from(_divisors(engine_gpus))),
                "ep": draw(st.sampled_from(engine_shards)),
            },
            "links": {"inter_node_gbps": draw(st.floats(5, 100))},
            "transfer": transfer | {"bucket_mib": draw(st.sampled_from([64, 512, 1024]))},
        }
    )


@settings(max_examples=25)
@given(text=layouts())
def test_any_layout_the_rules_allow_predicts_a_time_its_terms_add_up_to(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    result = predict_cluster(_setup(tmp_path_factory.mktemp("c"), text))
    assert result["seconds"] > 0
    assert sum(result["terms"].values()) == pytest.approx(result["seconds"], rel=1e-9)


@settings(max_examples=50)
@given(nodes=st.integers(1, 8), per_node=st.integers(1, 16), tp=st.integers(2, 64))
def test_any_tp_not_dividing_the_trainers_gpus_is_refused_naming_it(
    tmp_path_factory: pytest.TempPathFactory, nodes: int, per_node: int, tp: int
) -> None:
    if (nodes * per_node) % tp == 0:
        return
    text = _edit(
        ("trainer", "nodes", nodes), ("trainer", "gpus_per_node", per_node), ("trainer", "tp", tp)
    )
    with pytest.raises(ConfigError) as error:
        load_cluster(_write(tmp_path_factory.mktemp("c"), text))
    assert error.value.field == "[trainer].tp"
    assert f"TP {tp} does not divide the trainer's {nodes * per_node} GPUs" in error.value.problem


def _doc_examples() -> list[tuple[str, str, str]]:
    """(language, text, quoted output) of each fenced block that an unlabelled one follows."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", DOC.read_text(), re.S | re.M)
    return [
        (lang, text, out)
        for (lang, text), (nxt, out) in itertools.pairwise(blocks)
        if lang and not nxt
    ]


def test_the_docs_show_three_worked_examples_and_a_refusal() -> None:
    langs = [lang for lang, _, _ in _doc_examples()]
    assert langs.count("bash") >= 3 and langs.count("toml") >= 1


@pytest.mark.parametrize("example", range(len(_doc_examples())))
def test_each_docs_example_prints_what_it_quotes(
    example: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command's quoted output is what it prints; a file's quoted error is its refusal."""
    lang, text, quoted = _doc_examples()[example]
    monkeypatch.chdir(ROOT)
    if lang == "bash":
        words = text.split()
        assert words[:4] == ["python", "-m", "sim", "predict"], text
        assert predict(words[4:]) == 0
        assert capsys.readouterr().out == quoted
    else:
        with pytest.raises(SystemExit):
            predict(["--cluster", _write(tmp_path, text)])
        err = capsys.readouterr().err.replace(_write(tmp_path, text), "cluster.toml")
        assert quoted.strip() in err
