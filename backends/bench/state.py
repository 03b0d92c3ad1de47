"""The state dict the benchmark moves: shapes of a real model config, scaled to a byte budget.

Transfer speed depends on the tensor-size mix (many small norms cost per-call
overhead, a few huge embeddings cost bandwidth), so the default mix follows a
Qwen3-30B-A3B layer list (attention with q/k norms, a router, many small
experts, big embeddings) with widths and expert counts divided until it fits,
and as many layers as the budget holds. A uniform mix is there for contrast.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.errors import ConfigError
from miles_core.transfer import ParamSpec, UpdateUnit, units_of


@dataclass(frozen=True)
class MoeShape:
    """The fields of a Qwen3-MoE config that decide tensor shapes (HF config names)."""

    hidden_size: int = 2048
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    head_dim: int = 128
    moe_intermediate_size: int = 768
    num_experts: int = 128
    vocab_size: int = 151936
    num_hidden_layers: int = 48

    def scaled(self, divisor: int) -> MoeShape:
        """Widths, heads, experts and vocabulary divided by ``divisor`` (head_dim kept)."""
        return MoeShape(
            hidden_size=max(64, self.hidden_size // divisor),
            num_attention_heads=max(1, self.num_attention_heads // divisor),
            num_key_value_heads=max(1, self.num_key_value_heads // divisor),
            head_dim=self.head_dim,
            moe_intermediate_size=max(32, self.moe_intermediate_size // divisor),
            num_experts=max(2, self.num_experts // divisor),
            vocab_size=max(256, self.vocab_size // divisor),
            num_hidden_layers=self.num_hidden_layers,
        )


QWEN3_30B_A3B = MoeShape()
"""Qwen/Qwen3-30B-A3B config.json (48 layers, 128 experts of 768, hidden 2048)."""


def _layer(shape: MoeShape, i: int) -> list[ParamSpec]:
    h, d = shape.hidden_size, shape.head_dim
    q, kv = shape.num_attention_heads * d, shape.num_key_value_heads * d
    p = f"model.layers.{i}"
    specs = [
        ParamSpec.of(f"{p}.input_layernorm.weight", (h,), "bfloat16"),
        ParamSpec.of(f"{p}.self_attn.q_proj.weight", (q, h), "bfloat16"),
        ParamSpec.of(f"{p}.self_attn.k_proj.weight", (kv, h), "bfloat16"),
        ParamSpec.of(f"{p}.self_attn.v_proj.weight", (kv, h), "bfloat16"),
        ParamSpec.of(f"{p}.self_attn.o_proj.weight", (h, q), "bfloat16"),
        ParamSpec.of(f"{p}.self_attn.q_norm.weight", (d,), "bfloat16"),
        ParamSpec.of(f"{p}.self_attn.k_norm.weight", (d,), "bfloat16"),
        ParamSpec.of(f"{p}.post_attention_layernorm.weight", (h,), "bfloat16"),
        # the router in fp32, as Megatron's --moe-router-dtype fp32 keeps it: mixed item sizes
        ParamSpec.of(f"{p}.mlp.gate.weight", (shape.num_experts, h), "float32"),
    ]
    m = shape.moe_intermediate_size
    for e in range(shape.num_experts):
        x = f"{p}.mlp.experts.{e}"
        specs += [
            ParamSpec.of(f"{x}.gate_proj.weight", (m, h), "bfloat16"),
            ParamSpec.of(f"{x}.up_proj.weight", (m, h), "bfloat16"),
            ParamSpec.of(f"{x}.down_proj.weight", (h, m), "bfloat16"),
        ]
    return specs


def moe_specs(total_bytes: int, shape: MoeShape = QWEN3_30B_A3B) -> tuple[ParamSpec, ...]:
    """A Qwen3-MoE-shaped spec list of at most ``total_bytes``: the smallest width divisor
    (a power of two) at which embeddings plus one layer fit, then as many layers as fit."""
    divisor = 1
    while True:
        s = shape.scaled(divisor)
        h = s.hidden_size
        embed = [
            ParamSpec.of("model.embed_tokens.weight", (s.vocab_size, h), "bfloat16"),
            ParamSpec.of("model.norm.weight", (h,), "bfloat16"),
            ParamSpec.of("lm_head.weight", (s.vocab_size, h), "bfloat16"),
        ]
        fixed = sum(p.nbytes for p in embed)
        per_layer = sum(p.nbytes for p in _layer(s, 0))
        layers = min(s.num_hidden_layers, (total_bytes - fixed) // per_layer)
        if layers >= 1:
            break
        if s == shape.scaled(divisor * 2):  # nothing left to shrink
            raise ConfigError(
                "--size-mib", f"{total_bytes} bytes cannot hold one scaled layer", "pass >= 1 MiB"
            )
        divisor *= 2
    specs = [embed[0]]
    for i in range(layers):
        specs += _layer(s, i)
    return (*specs, *embed[1:])


def uniform_specs(total_bytes: int, tensors: int) -> tuple[ParamSpec, ...]:
    """``tensors`` bf16 tensors of equal size: the mix with no small-tensor overhead."""
    per = total_bytes // (2 * tensors)
    if per < 1:
        raise ConfigError("--tensors", f"{tensors} tensors of {total_bytes} bytes", "pass fewer")
    return tuple(ParamSpec.of(f"w{i}.weight", (per,), "bfloat16") for i in range(tensors))


def qkv_atomic(name: str) -> str | None:
    """q/k/v of a layer travel together, as the CPU backend's update units do."""
    if ".self_attn." in name and any(f".{p}_proj." in name for p in "qkv"):
        return name.split(".self_attn.")[0] + ".qkv"
    return None


MIXES = ("qwen3-30b-a3b", "uniform")


def bench_units(mix: str, total_bytes: int, tensors: int = 64) -> tuple[UpdateUnit, ...]:
    if mix == "qwen3-30b-a3b":
        return units_of(moe_specs(total_bytes), qkv_atomic)
    if mix == "uniform":
        return units_of(uniform_specs(total_bytes, tensors))
    raise ConfigError("--mix", f"unknown mix {mix!r}", f"use one of {', '.join(MIXES)}")
