"""HF checkpoints for ``--hf-checkpoint``: write a small random one, inspect and load one.

miles reads ``--hf-checkpoint DIR`` as a ``save_pretrained`` directory (config.json,
*.safetensors, tokenizer files): the Megatron bridge converts it for the trainer
(``miles/backends/megatron_utils/model_provider.py``), the FSDP backend loads it with
``AutoModelForCausalLM.from_pretrained`` (``miles/backends/fsdp_utils/actor.py``,
``FSDPTrainRayActor.init``) and SGLang is handed the directory. Here only the
architectures the trainers can convert are accepted (llama, qwen2, qwen3), and a bad
directory is refused by ``inspect_checkpoint``, which reads config.json and the
safetensors headers only, before any weight is loaded (or Ray starts): each header checked
against its file's size (``safetensors_header``: a truncated or corrupt file is named, with
the tensor it cuts), and each tensor's shape against the model config.json describes, built
on the meta device (a config that disagrees with its weights would make ``from_pretrained``
allocate the config's sizes, 16 TiB, before it found out).

Nothing is downloaded: ``write_random_checkpoint`` builds the model from a config,
initialises it from its own seeded generator (the same seed writes bitwise-equal
files) and saves the local tokenizer of ``char_tokenizer`` beside it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
)

from backends.common.training.architectures import ARCHITECTURE_NAMES
from backends.common.training.char_tokenizer import build_tokenizer
from backends.common.training.safetensors_header import TensorEntry, read_header
from miles_core.errors import ConfigError

FLAG = "--hf-checkpoint"
ARCHITECTURES: dict[str, type[PretrainedConfig]] = dict(
    zip(ARCHITECTURE_NAMES, (LlamaConfig, Qwen2Config, Qwen3Config), strict=True)
)
_MAKE = "write one with `python -m backends.tasks make --out DIR`"


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint is, read without loading it: for the run's report and checks."""

    directory: str
    arch: str
    vocab_size: int
    layers: int
    hidden_size: int
    heads: int
    param_count: int
    param_bytes: int
    tied_embeddings: bool


def model_config(
    arch: str, vocab_size: int, hidden_size: int, layers: int, heads: int
) -> PretrainedConfig:
    """A small config of ``arch``; bos/eos/pad ids follow ``char_tokenizer`` (1, 2, 0)."""
    if arch not in ARCHITECTURES:
        raise ConfigError("--arch", f"{arch!r} is not supported", f"pass one of {_choices()}")
    if hidden_size % heads:
        raise ConfigError(
            "--hidden-size", f"{hidden_size} is not a multiple of {heads} heads", "fix it"
        )
    return ARCHITECTURES[arch](
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=hidden_size // heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def _initialise(model: PreTrainedModel, seed: int, std: float) -> None:
    """Every parameter from one seeded generator, in name order: weights (matrices,
    embeddings) ~ N(0, std), norms 1, biases 0 (what HF's ``_init_weights`` draws),
    without touching torch's global RNG."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            elif name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.zero_()


def write_random_checkpoint(
    directory: Path | str,
    arch: str = "llama",
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
) -> CheckpointInfo:
    """A randomly initialised causal LM and the local tokenizer, saved as HF saves them."""
    tokenizer = build_tokenizer()
    config = model_config(arch, len(tokenizer), hidden_size, layers, heads)
    with torch.random.fork_rng():  # HF's own init draws from the global RNG: restore it
        model = AutoModelForCausalLM.from_config(config).float()
    _initialise(model, seed, config.initializer_range)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return inspect_checkpoint(out)


def _choices() -> str:
    return ", ".join(ARCHITECTURES)


def _read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        what = "is a file" if directory.exists() else "does not exist"
        raise ConfigError(
            FLAG, f"{str(directory)!r} {what}", f"pass a checkpoint directory; {_MAKE}"
        )
    path = directory / "config.json"
    if not path.is_file():
        raise ConfigError(
            FLAG,
            f"{str(directory)!r} has no config.json",
            f"pass a save_pretrained directory; {_MAKE}",
        )
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(
            FLAG, f"{path} is not JSON ({error})", "rewrite it with save_pretrained"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(FLAG, f"{path} holds no JSON object", "rewrite it with save_pretrained")
    arch = config.get("model_type")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            FLAG,
            f"model_type {arch!r} in {path} is not supported",
            f"pass a checkpoint of one of: {_choices()}",
        )
    return config


def _weights(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        other = "only .bin weights" if any(directory.glob("*.bin")) else "no *.safetensors"
        raise ConfigError(
            FLAG,
            f"{str(directory)!r} holds {other}",
            "save the model with save_pretrained(dir, safe_serialization=True)",
        )
    if not any(
        (directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    ):
        raise ConfigError(
            FLAG,
            f"{str(directory)!r} has no tokenizer",
            "save the tokenizer into the same directory",
        )
    return files


def _tensors(files: list[Path]) -> dict[str, TensorEntry]:
    """Every tensor the files declare, by name, from their headers alone (checked against
    each file's size: a truncated or corrupt file is refused here, naming it)."""
    out: dict[str, TensorEntry] = {}
    for path in files:
        for entry in read_header(path):
            if entry.name in out:
                raise ConfigError(
                    FLAG,
                    f"tensor {entry.name!r} is in both {out[entry.name].file} and {path}",
                    "keep one copy of each tensor",
                )
            out[entry.name] = entry
    return out


def _expected_shapes(
    config: dict[str, Any], path: Path
) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(every tensor the model config.json describes may hold, with its shape; those it
    must hold): the model built on the meta device, so nothing is allocated however large
    the config says it is."""
    try:
        hf_config = ARCHITECTURES[config["model_type"]].from_dict(config)
        with torch.random.fork_rng(), torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
    except Exception as error:  # any config HF cannot build (its validators raise many kinds)
        why = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        raise ConfigError(
            FLAG, f"{path} does not describe a model ({why})", "rewrite it with save_pretrained"
        ) from None
    known = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    return known, {name for name, _ in model.named_parameters()}


def _layers(config: dict[str, Any], config_path: Path, tensors: dict[str, TensorEntry]) -> None:
    """num_hidden_layers against the layers the weights hold (0..n-1, each): checked first,
    so a config of a million layers is refused before a model of them is built, even on the
    meta device (the layers built are then bounded by the header's size)."""
    held = {int(m.group(1)) for name in tensors if (m := _LAYER.match(name))}
    count = config.get("num_hidden_layers")
    if not isinstance(count, int) or held != set(range(count)):
        raise ConfigError(
            FLAG,
            f"{config_path} says num_hidden_layers={count!r}, the weights hold {_held(held)}",
            "use the config.json the weights were saved with",
        )


def _held(layers: set[int]) -> str:
    if not layers:
        return "no layer"
    if layers == set(range(len(layers))):
        return f"layers 0..{len(layers) - 1}"
    return f"{len(layers)} layers numbered {min(layers)}..{max(layers)}, with gaps"


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _check_against_config(
    config: dict[str, Any], directory: Path, tensors: dict[str, TensorEntry]
) -> None:
    """Each tensor's shape is the one config.json's model gives it, none missing, none extra:
    ``from_pretrained`` would otherwise allocate the config's sizes first and fail after."""
    path = directory / "config.json"
    _layers(config, path, tensors)
    known, required = _expected_shapes(config, path)
    fix = "use the config.json the weights were saved with"
    for name, entry in sorted(tensors.items()):
        if name not in known:
            raise ConfigError(
                FLAG, f"tensor {name!r} of {entry.file} has no place in {path}'s model", fix
            )
        if entry.shape != known[name]:
            raise ConfigError(
                FLAG,
                f"tensor {name!r} is {list(entry.shape)} in {entry.file}, {path} makes it "
                f"{list(known[name])}",
                fix,
            )
    missing = sorted(required - set(tensors))
    if missing:
        raise ConfigError(
            FLAG, f"the weights lack tensor {missing[0]!r} that {path}'s model needs", fix
        )


def inspect_checkpoint(directory: Path | str) -> CheckpointInfo:
    """The checkpoint's description, or a ConfigError naming --hf-checkpoint: cheap (no
    weights loaded), so a run checks its flag before any heavy work."""
    folder = Path(directory)
    config = _read_config(folder)
    tensors = _tensors(_weights(folder))
    _check_against_config(config, folder, tensors)
    return CheckpointInfo(
        directory=str(folder),
        arch=config["model_type"],
        vocab_size=int(config.get("vocab_size", 0)),
        layers=int(config.get("num_hidden_layers", 0)),
        hidden_size=int(config.get("hidden_size", 0)),
        heads=int(config.get("num_attention_heads", 0)),
        param_count=sum(t.numel for t in tensors.values()),
        param_bytes=sum(t.nbytes for t in tensors.values()),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def load_checkpoint(
    directory: Path | str,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, CheckpointInfo]:
    """The model in float32, its tokenizer and its description; checked before loading."""
    info = inspect_checkpoint(directory)
    tokenizer = AutoTokenizer.from_pretrained(info.directory)
    if len(tokenizer) > info.vocab_size:
        raise ConfigError(
            FLAG,
            f"the tokenizer has {len(tokenizer)} tokens, the model embeds {info.vocab_size}",
            "save the tokenizer the model was built for",
        )
    model = AutoModelForCausalLM.from_pretrained(info.directory)
    return model.float(), tokenizer, info
