"""--hf-checkpoint: a small random HF checkpoint written locally, loaded back, and every bad
directory refused before any weight is read (backends/common/training/hf_checkpoint.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from backends.common.training import hf_checkpoint
from backends.common.training.hf_checkpoint import (
    inspect_checkpoint,
    load_checkpoint,
    write_random_checkpoint,
)
from miles_core.errors import ConfigError

CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@pytest.mark.parametrize("arch", sorted(CLASSES))
def test_each_architecture_round_trips(tmp_path: Path, arch: str) -> None:
    written = write_random_checkpoint(tmp_path, arch=arch, hidden_size=32, layers=2, seed=1)
    model, tokenizer, info = load_checkpoint(tmp_path)
    assert info == written
    assert type(model).__name__ == CLASSES[arch]
    assert info.arch == arch and info.layers == 2 and info.hidden_size == 32
    assert info.vocab_size == len(tokenizer) == model.config.vocab_size
    params = list(model.parameters())  # a tied lm_head is the embedding, counted once
    assert all(p.dtype == torch.float32 for p in params)
    assert info.param_count == sum(p.numel() for p in params)
    assert info.param_bytes == 4 * info.param_count
    ids = tokenizer("12+34=", return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], info.vocab_size)


def test_the_same_seed_writes_bitwise_equal_weights(tmp_path: Path) -> None:
    state = torch.random.get_rng_state()
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        write_random_checkpoint(tmp_path / name, arch="qwen3", hidden_size=32, seed=seed)
    weights = {n: (tmp_path / n / "model.safetensors").read_bytes() for n in "abc"}
    assert weights["a"] == weights["b"]
    assert weights["a"] != weights["c"]
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone


def test_the_tokenizer_loads_with_auto_tokenizer_and_has_a_chat_template(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path, hidden_size=16)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = "12+3=\\boxed{15}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [*"12+3=", "\\boxed", "{", "1", "5", "}"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id in tokenizer("é", add_special_tokens=False)["input_ids"]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+1="}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|user|>1+1=<|end|><|assistant|>"
    assert tokenizer.decode([tokenizer.eos_token_id]) == "<|end|>"
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3


def _config(directory: Path, **changes: object) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _break(directory: Path, how: str) -> str:
    """Damage a written checkpoint; the problem's expected words."""
    if how == "missing":
        return "does not exist"
    if how == "file":
        (directory.parent / "plain").write_text("x")
        return "is a file"
    if how == "no-config":
        (directory / "config.json").unlink()
        return "no config.json"
    if how == "bad-json":
        (directory / "config.json").write_text("{oops")
        return "not JSON"
    if how == "model-type":
        _config(directory, model_type="gpt2")
        return "'gpt2'"
    if how == "bin-only":
        (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
        return "only .bin"
    if how == "no-weights":
        (directory / "model.safetensors").unlink()
        return "no *.safetensors"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).unlink()
    return "no tokenizer"


@pytest.mark.parametrize(
    "how",
    [
        "missing",
        "file",
        "no-config",
        "bad-json",
        "model-type",
        "bin-only",
        "no-weights",
        "no-tokenizer",
    ],
)
def test_a_bad_directory_is_refused_before_any_weight_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    folder = tmp_path / "ckpt"
    write_random_checkpoint(folder, hidden_size=16)
    problem = _break(folder, how)
    target = {"missing": tmp_path / "absent", "file": tmp_path / "plain"}.get(how, folder)

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were loaded before the directory was checked")

    monkeypatch.setattr(hf_checkpoint.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(ConfigError) as error:
        load_checkpoint(target)
    assert error.value.field == "--hf-checkpoint"
    assert problem in error.value.problem
    assert error.value.fix


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path: Path) -> None:
    """A model of 50 tokens saved with the 106-token tokenizer (a config.json edited to 50
    alone is refused earlier, by inspect_checkpoint: tests/test_checkpoint_preflight.py)."""
    from transformers import AutoModelForCausalLM

    from backends.common.training.char_tokenizer import build_tokenizer

    model = AutoModelForCausalLM.from_config(hf_checkpoint.model_config("llama", 50, 16, 2, 4))
    model.save_pretrained(tmp_path, safe_serialization=True)
    build_tokenizer().save_pretrained(tmp_path)
    assert inspect_checkpoint(tmp_path).vocab_size == 50
    with pytest.raises(ConfigError) as error:
        load_checkpoint(tmp_path)
    assert error.value.field == "--hf-checkpoint" and "tokens" in error.value.problem


def test_bad_sizes_name_their_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        write_random_checkpoint(tmp_path, arch="gpt2")
    assert error.value.field == "--arch"
    with pytest.raises(ConfigError) as error:
        write_random_checkpoint(tmp_path, hidden_size=30, heads=4)
    assert error.value.field == "--hidden-size"
    assert not (tmp_path / "config.json").exists()
