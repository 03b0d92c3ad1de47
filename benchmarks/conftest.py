"""Shared inputs of the control-plane benchmarks.

Run them with ``python -m pytest benchmarks/ --benchmark-only`` from the repository root.

This folder is not in the default test run (pyproject's testpaths are tests and
scenarios). Inputs are built here, once per session, so that the timed code is
only the hot path each benchmark names.
"""

from __future__ import annotations

import math

import pytest

from miles_core.transfer import ParamSpec

# Kimi-K2 (DeepSeek-V3 architecture, config.json of moonshotai/Kimi-K2-Instruct).
KIMI_LAYERS = 61
KIMI_DENSE_LAYERS = 1  # first_k_dense_replace: layer 0 has a dense MLP
KIMI_EXPERTS = 384
KIMI_HIDDEN = 7168
KIMI_VOCAB = 163840
KIMI_DENSE_FFN = 18432
KIMI_EXPERT_FFN = 2048
KIMI_HEADS = 64
KIMI_Q_LORA, KIMI_KV_LORA = 1536, 512
KIMI_QK_NOPE, KIMI_QK_ROPE, KIMI_V_HEAD = 128, 64, 128
FP8_BLOCK = 128  # block-wise FP8: one float32 scale per 128 x 128 block


def kimi_k2_specs() -> list[ParamSpec]:
    """Parameter specs shaped like Kimi-K2 (about 1.03T parameters), in checkpoint order.

    Routed-expert projections are float8_e4m3fn, each with its float32
    ``weight_scale_inv`` (one per 128 x 128 block, as in the FP8 checkpoint);
    everything else (MLA attention, norms, router, shared expert, dense MLP,
    embeddings, lm_head) is bfloat16, the router bias float32.
    """
    h = KIMI_HIDDEN
    bf16, fp8, f32 = "bfloat16", "float8_e4m3fn", "float32"
    specs = [ParamSpec.of("model.embed_tokens.weight", (KIMI_VOCAB, h), bf16)]

    def mlp(prefix: str, ffn: int, dtype: str) -> None:
        for proj, shape in (
            ("gate_proj", (ffn, h)),
            ("up_proj", (ffn, h)),
            ("down_proj", (h, ffn)),
        ):
            specs.append(ParamSpec.of(f"{prefix}.{proj}.weight", shape, dtype))
            if dtype == fp8:
                scales = tuple(math.ceil(d / FP8_BLOCK) for d in shape)
                specs.append(ParamSpec.of(f"{prefix}.{proj}.weight_scale_inv", scales, f32))

    for layer in range(KIMI_LAYERS):
        p = f"model.layers.{layer}"
        q_head = KIMI_QK_NOPE + KIMI_QK_ROPE
        specs += [
            ParamSpec.of(f"{p}.input_layernorm.weight", (h,), bf16),
            ParamSpec.of(f"{p}.self_attn.q_a_proj.weight", (KIMI_Q_LORA, h), bf16),
            ParamSpec.of(f"{p}.self_attn.q_a_layernorm.weight", (KIMI_Q_LORA,), bf16),
            ParamSpec.of(
                f"{p}.self_attn.q_b_proj.weight", (KIMI_HEADS * q_head, KIMI_Q_LORA), bf16
            ),
            ParamSpec.of(
                f"{p}.self_attn.kv_a_proj_with_mqa.weight", (KIMI_KV_LORA + KIMI_QK_ROPE, h), bf16
            ),
            ParamSpec.of(f"{p}.self_attn.kv_a_layernorm.weight", (KIMI_KV_LORA,), bf16),
            ParamSpec.of(
                f"{p}.self_attn.kv_b_proj.weight",
                (KIMI_HEADS * (KIMI_QK_NOPE + KIMI_V_HEAD), KIMI_KV_LORA),
                bf16,
            ),
            ParamSpec.of(f"{p}.self_attn.o_proj.weight", (h, KIMI_HEADS * KIMI_V_HEAD), bf16),
            ParamSpec.of(f"{p}.post_attention_layernorm.weight", (h,), bf16),
        ]
        if layer < KIMI_DENSE_LAYERS:
            mlp(f"{p}.mlp", KIMI_DENSE_FFN, bf16)
            continue
        specs += [
            ParamSpec.of(f"{p}.mlp.gate.weight", (KIMI_EXPERTS, h), bf16),
            ParamSpec.of(f"{p}.mlp.gate.e_score_correction_bias", (KIMI_EXPERTS,), f32),
        ]
        mlp(f"{p}.mlp.shared_experts", KIMI_EXPERT_FFN, bf16)
        for expert in range(KIMI_EXPERTS):
            mlp(f"{p}.mlp.experts.{expert}", KIMI_EXPERT_FFN, fp8)
    specs += [
        ParamSpec.of("model.norm.weight", (h,), bf16),
        ParamSpec.of("lm_head.weight", (KIMI_VOCAB, h), bf16),
    ]
    return specs


@pytest.fixture(scope="session")
def kimi_specs() -> list[ParamSpec]:
    return kimi_k2_specs()
