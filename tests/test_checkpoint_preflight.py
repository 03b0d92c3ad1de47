"""A corrupt ``model.safetensors`` or a config.json that disagrees with its weights is refused
before Ray starts, naming the file and the tensor (issue 52, item 5).

A truncated file gave safetensors' Rust error in a 27-line traceback; a config.json whose
sizes differ from the weights started Ray and died in ``from_pretrained`` (allocating what
the config said: 16 TiB for a large vocab). Now ``inspect_checkpoint`` reads each header
itself (bounded, checked against the file's size) and builds the config's model on the meta
device to compare every tensor's shape, so nothing is allocated before the check.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from backends.common.run import command as cli
from backends.common.training import hf_checkpoint
from backends.common.training.hf_checkpoint import inspect_checkpoint, write_random_checkpoint
from backends.common.training.safetensors_header import MAX_HEADER, read_header
from backends.cpu.__main__ import main as cpu_main
from miles_core.errors import ConfigError

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One good checkpoint (llama, 2 layers, tied embeddings), copied by each test."""
    folder = tmp_path_factory.mktemp("good") / "ckpt"
    write_random_checkpoint(folder, hidden_size=16, layers=2, heads=4)
    return folder


@pytest.fixture
def ckpt(written: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for path in written.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


@pytest.fixture
def no_weights_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check must come before any weight or model is loaded."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were loaded before the checkpoint was checked")

    monkeypatch.setattr(hf_checkpoint.AutoModelForCausalLM, "from_pretrained", refuse)


def refused(folder: Path) -> str:
    """inspect_checkpoint's ConfigError, naming --hf-checkpoint; its problem text."""
    with pytest.raises(ConfigError) as error:
        inspect_checkpoint(folder)
    assert error.value.field == "--hf-checkpoint" and error.value.fix
    return error.value.problem


def header_of(path: Path) -> tuple[dict[str, object], bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def rewrite(path: Path, header: dict[str, object], data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def set_config(folder: Path, **changes: object) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return path


def test_a_good_checkpoint_passes_and_counts_its_parameters(ckpt: Path) -> None:
    """The control: every tensor found, counted as safetensors' own reader counts them."""
    from safetensors import safe_open

    entries = read_header(ckpt / WEIGHTS)
    with safe_open(str(ckpt / WEIGHTS), framework="pt") as handle:
        assert sorted(e.name for e in entries) == sorted(handle.keys())
        assert all(list(e.shape) == handle.get_slice(e.name).get_shape() for e in entries)
    info = inspect_checkpoint(ckpt)
    assert info.param_count == sum(e.numel for e in entries) and info.param_bytes == (
        4 * info.param_count
    )


@pytest.mark.parametrize("keep", [0, 5, 8, 20, 400, -1000, -4])
def test_a_truncated_weights_file_is_refused_naming_it(
    ckpt: Path, no_weights_load: None, keep: int
) -> None:
    path = ckpt / WEIGHTS
    raw = path.read_bytes()
    path.write_bytes(raw[:keep])
    problem = refused(ckpt)
    assert str(path) in problem
    if keep < 0:  # the header is whole: the tensor the cut falls in is named
        assert "truncated: tensor 'model." in problem


def test_a_header_length_beyond_the_file_or_the_limit_is_not_read(
    ckpt: Path, no_weights_load: None
) -> None:
    path = ckpt / WEIGHTS
    for length in (2**64 - 1, MAX_HEADER + 1, path.stat().st_size):
        path.write_bytes(struct.pack("<Q", length) + b"{}" + b" " * 64)
        assert f"declares a {length}-byte header" in refused(ckpt)


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda h, d: (b"\xff\xfe not json", d), "header is not JSON"),
        (lambda h, d: ([1, 2], d), "JSON list, not an object"),
        (lambda h, d: ({**h, "x": {"dtype": "F32"}}, d), "tensor 'x' has no dtype"),
        (lambda h, d: (_entry(h, dtype="Q7"), d), "unknown dtype 'Q7'"),
        (lambda h, d: (_entry(h, shape=[-1, 4]), d), "not a list of ints >= 0"),
        (lambda h, d: (_entry(h, shape=[10**6, 10**6]), d), "needs 4000000000000 bytes"),
        (lambda h, d: (_entry(h, data_offsets=[0]), d), "data_offsets [0]"),
        (lambda h, d: (h, d + b"\0" * 16), "16 bytes follow the last tensor"),
    ],
)
def test_a_corrupt_header_is_refused_naming_the_file_and_tensor(
    ckpt: Path, no_weights_load: None, damage: object, words: str
) -> None:
    path = ckpt / WEIGHTS
    header, data = header_of(path)
    new_header, new_data = damage(header, data)  # type: ignore[operator]
    if isinstance(new_header, bytes):
        path.write_bytes(struct.pack("<Q", len(new_header)) + new_header + new_data)
    else:
        rewrite(path, new_header, new_data)
    problem = refused(ckpt)
    assert str(path) in problem and words in problem, problem


def _entry(header: dict[str, object], **changes: object) -> dict[str, object]:
    """The header with its first tensor's fields changed."""
    name = _first(header)
    return {**header, name: {**header[name], **changes}}  # type: ignore[dict-item]


def test_overlapping_tensors_are_refused(ckpt: Path, no_weights_load: None) -> None:
    """Two tensors over the same bytes (the file's size still adds up with a gap elsewhere
    closed): safetensors refuses this, so must the check."""
    path = ckpt / WEIGHTS
    header, data = header_of(path)
    rewrite(path, {**header, "twin": _entry(header)[_first(header)]}, data)
    assert "overlaps the tensor before it" in refused(ckpt)


def _first(header: dict[str, object]) -> str:
    return next(k for k in header if k != "__metadata__")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"vocab_size": 2**33, "hidden_size": 1024}, "'model.embed_tokens.weight' is [106, 16]"),
        ({"hidden_size": 32, "head_dim": 8}, "is [106, 16] in "),
        ({"intermediate_size": 999}, "mlp"),
        ({"num_hidden_layers": 10**6}, "num_hidden_layers=1000000, the weights hold layers 0..1"),
        ({"num_hidden_layers": 1}, "num_hidden_layers=1"),
        ({"num_hidden_layers": "two"}, "num_hidden_layers='two'"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0, the weights hold layers 0..1"),
        ({"tie_word_embeddings": False}, "lack tensor 'lm_head.weight'"),
        ({"num_attention_heads": 0}, "does not describe a model (ZeroDivisionError"),
        ({"hidden_size": "abc"}, "does not describe a model"),
    ],
)
def test_a_config_that_disagrees_with_its_weights_is_refused(
    ckpt: Path, no_weights_load: None, changes: dict[str, object], words: str
) -> None:
    config = set_config(ckpt, **changes)
    problem = refused(ckpt)
    assert str(config) in problem and words in problem, problem
    if "is [106, 16]" in words:  # a shape: the weights file is named too
        assert str(ckpt / WEIGHTS) in problem


def test_layers_with_gaps_are_refused_before_a_model_of_them_is_built(
    ckpt: Path, no_weights_load: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layers 0 and 999999 in the weights, a config of 10**6: refused from the names alone."""
    path = ckpt / WEIGHTS
    header, data = header_of(path)
    renamed = {k.replace("model.layers.1.", "model.layers.999999."): v for k, v in header.items()}
    rewrite(path, renamed, data)
    set_config(ckpt, num_hidden_layers=10**6)
    monkeypatch.setattr(
        hf_checkpoint.AutoModelForCausalLM, "from_config", lambda *a, **k: pytest.fail("built")
    )
    assert "the weights hold 2 layers numbered 0..999999, with gaps" in refused(ckpt)


def test_a_tensor_the_config_has_no_place_for_is_refused(ckpt: Path, no_weights_load: None) -> None:
    path = ckpt / WEIGHTS
    header, data = header_of(path)
    extra = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    rewrite(path, {**header, "model.extra.weight": extra}, data + b"\0" * 8)
    assert f"tensor 'model.extra.weight' of {path} has no place" in refused(ckpt)


def test_the_run_command_exits_2_before_ray(
    ckpt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The reproductions as typed: exit 2, one error line naming the file, no traceback, and
    the run (which starts Ray) never called."""
    monkeypatch.setattr(cli, "run_real", lambda *a, **k: pytest.fail("the run (Ray) started"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input": "1+1=", "label": "2"}\n')
    path = ckpt / WEIGHTS
    good = path.read_bytes()
    for breakage in ("truncate", "config"):
        path.write_bytes(good[: len(good) // 2] if breakage == "truncate" else good)
        if breakage == "config":
            set_config(ckpt, vocab_size=2**33)
        with pytest.raises(SystemExit) as caught:
            cpu_main(
                ["run", "--steps", "1", "--hf-checkpoint", str(ckpt), "--prompt-data",
                 str(prompts), "--label-key", "label", "--rm-type", "math"]
            )  # fmt: skip
        err = capsys.readouterr().err
        assert caught.value.code == 2 and "Traceback" not in err and err.count("error:") == 1
        named = WEIGHTS if breakage == "truncate" else "'model.embed_tokens.weight'"
        assert "--hf-checkpoint: " in err and named in err, err
