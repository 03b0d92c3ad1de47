"""HF Llama <-> Megatron-core GPTModel weights, bitwise: only views, copies and concatenation.

``megatron_to_hf`` is what miles does when it sends Megatron weights to SGLang engines:
all-gather each TP-sharded parameter (``all_gather_param`` / ``_gather_with_stride`` in
miles/backends/megatron_utils/update_weight/common.py, honouring the stride-2 layout of
the SwiGLU ``linear_fc1``), then rename and split it per model
(``convert_llama_to_hf`` in miles/backends/megatron_utils/megatron_to_hf/llama.py: QKV
split per query group into [q heads of the group, k, v], fc1 chunked into gate/up, the
layer norms under either spec's name), as of radixark/miles@31f1ca9. ``hf_to_megatron``
is the inverse, for one rank.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.transformer import TransformerConfig

# Megatron name suffix -> the dim a TP rank's shard is cut along (column-parallel and
# vocab-parallel: output rows; row-parallel: input columns). Anything else is replicated.
_TP_DIM = {
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "self_attention.linear_qkv.weight": 0,
    "mlp.linear_fc1.weight": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc2.weight": 1,
}
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


def _tp_dim(name: str) -> int | None:
    return next((d for suffix, d in _TP_DIM.items() if name.endswith(suffix)), None)


def _copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone(memory_format=torch.contiguous_format)


def _gather_with_stride(parts: list[torch.Tensor], dim: int, stride: int) -> torch.Tensor:
    """The full tensor from TP shards; with stride s each shard holds s interleaved blocks
    (fc1 under SwiGLU: [gate_r; up_r]), as miles' ``_gather_with_stride``."""
    if stride == 1:
        return torch.cat(parts, dim=dim)
    blocks = [p.chunk(stride, dim=dim) for p in parts]
    return torch.cat([blocks[r][s] for s in range(stride) for r in range(len(parts))], dim=dim)


def _heads(config: TransformerConfig) -> tuple[int, int, int]:
    """(query heads per group, query groups, head dim)."""
    groups = config.num_query_groups or config.num_attention_heads
    return config.num_attention_heads // groups, groups, config.kv_channels


def hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor],
    config: TransformerConfig,
    tp_rank: int,
    tp_size: int,
    *,
    fused_norms: bool = False,
) -> dict[str, torch.Tensor]:
    """This TP rank's ``GPTModel`` parameters from HF Llama tensors, for a GPTModel built with
    ``share_embeddings_and_output_weights=True`` (an ``lm_head.weight`` given is ignored).

    ``fused_norms``: name the layer norms as the Transformer Engine spec does
    (``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``).
    """
    per_group, groups, head_dim = _heads(config)
    hidden = config.hidden_size
    assert groups % tp_size == 0, f"{groups} query groups do not split over tp={tp_size}"

    def shard(t: torch.Tensor, dim: int) -> torch.Tensor:
        assert t.shape[dim] % tp_size == 0, (tuple(t.shape), dim, tp_size)
        return _copy(t.chunk(tp_size, dim=dim)[tp_rank])

    out = {
        "embedding.word_embeddings.weight": shard(hf_state["model.embed_tokens.weight"], 0),
        "decoder.final_layernorm.weight": _copy(hf_state["model.norm.weight"]),
    }
    in_norm = (
        "self_attention.linear_qkv.layer_norm_weight" if fused_norms else "input_layernorm.weight"
    )
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if fused_norms else "pre_mlp_layernorm.weight"
    for i in range(config.num_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = hf_state[hf + "self_attn.q_proj.weight"].reshape(groups, per_group, head_dim, hidden)
        k = hf_state[hf + "self_attn.k_proj.weight"].reshape(groups, 1, head_dim, hidden)
        v = hf_state[hf + "self_attn.v_proj.weight"].reshape(groups, 1, head_dim, hidden)
        qkv = torch.cat([q, k, v], dim=1).reshape(-1, hidden)
        gate, up = hf_state[hf + "mlp.gate_proj.weight"], hf_state[hf + "mlp.up_proj.weight"]
        out |= {
            mg + in_norm: _copy(hf_state[hf + "input_layernorm.weight"]),
            mg + "self_attention.linear_qkv.weight": shard(qkv, 0),
            mg + "self_attention.linear_proj.weight": shard(
                hf_state[hf + "self_attn.o_proj.weight"], 1
            ),
            mg + mlp_norm: _copy(hf_state[hf + "post_attention_layernorm.weight"]),
            mg + "mlp.linear_fc1.weight": torch.cat([shard(gate, 0), shard(up, 0)], dim=0),
            mg + "mlp.linear_fc2.weight": shard(hf_state[hf + "mlp.down_proj.weight"], 1),
        }
    return out


def _hf_names(config: TransformerConfig) -> list[str]:
    """``LlamaForCausalLM.named_parameters()`` order (tied lm_head omitted)."""
    names = ["model.embed_tokens.weight"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    return [*names, "model.norm.weight"]


def _to_hf(name: str, full: torch.Tensor, config: TransformerConfig) -> dict[str, torch.Tensor]:
    """One whole Megatron parameter as HF tensors (miles' ``convert_llama_to_hf``)."""
    if name == "embedding.word_embeddings.weight":
        return {"model.embed_tokens.weight": full}
    if name == "output_layer.weight":
        return {"lm_head.weight": full}
    if name == "decoder.final_layernorm.weight":
        return {"model.norm.weight": full}
    match = _LAYER.fullmatch(name)
    if match is None:
        raise ValueError(f"unknown Megatron parameter {name}")
    layer, rest = match.groups()
    hf = f"model.layers.{layer}."
    if rest in ("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"):
        return {hf + "input_layernorm.weight": full}
    if rest in ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"):
        return {hf + "post_attention_layernorm.weight": full}
    if rest == "self_attention.linear_proj.weight":
        return {hf + "self_attn.o_proj.weight": full}
    if rest == "mlp.linear_fc2.weight":
        return {hf + "mlp.down_proj.weight": full}
    if rest == "mlp.linear_fc1.weight":
        gate, up = full.chunk(2, dim=0)
        return {hf + "mlp.gate_proj.weight": gate, hf + "mlp.up_proj.weight": up}
    if rest == "self_attention.linear_qkv.weight":
        per_group, groups, head_dim = _heads(config)
        grouped = full.view(groups, per_group + 2, head_dim, config.hidden_size)
        q, k, v = grouped.split([per_group, 1, 1], dim=1)
        return {
            hf + f"self_attn.{x}_proj.weight": t.reshape(-1, config.hidden_size)
            for x, t in zip("qkv", (q, k, v), strict=True)
        }
    raise ValueError(f"unknown Megatron parameter {name}")


def megatron_to_hf(
    model: torch.nn.Module, config: TransformerConfig, tp_group: Any = None
) -> dict[str, torch.Tensor]:
    """Whole HF tensors from this TP rank's ``GPTModel``, or a module that holds one as
    ``gpt`` (model.py's ``MegatronPolicy``: the conversion knows weights, not the wrapper),
    in ``LlamaForCausalLM.named_parameters()`` order.

    A collective of the TP group (default: Megatron's): every rank calls it, same order.
    """
    gpt = getattr(model, "gpt", model)
    if tp_group is None:
        from megatron.core import parallel_state

        tp_group = parallel_state.get_tensor_model_parallel_group(check_initialized=False)
    tp_size = 1 if tp_group is None else dist.get_world_size(tp_group)
    out: dict[str, torch.Tensor] = {}
    for name, param in gpt.named_parameters():
        local = param.detach().contiguous()
        dim = _tp_dim(name)
        if dim is None or tp_size == 1:
            full = local
        else:
            parts = [torch.empty_like(local) for _ in range(tp_size)]
            dist.all_gather(parts, local, group=tp_group)
            stride = 2 if name.endswith("mlp.linear_fc1.weight") and config.gated_linear_unit else 1
            full = _gather_with_stride(parts, dim, stride)
        out |= {k: _copy(v) for k, v in _to_hf(name, full, config).items()}
    order = _hf_names(config) + (["lm_head.weight"] if "lm_head.weight" in out else [])
    assert sorted(order) == sorted(out), sorted(set(order) ^ set(out))
    return {k: out[k] for k in order}
