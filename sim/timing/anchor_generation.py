"""The generation side of the async-vs-sync anchors, predicted rather than set on a row: each
plan's engine decode law (sim/timing/decode_law.py) from its model's architecture, its GPU's
datasheet peaks and the efficiencies fitted to the published engine figures
(sim/timing/decode_figures.py: inference benchmarks, none of them an RL run), and its KV pool
from the GPU's memory, the engine's memory share and the model's bytes per GPU.

Before this, each plan set one ``decode_seconds_per_token`` so that a published step came out
(AReaL's synchronous step; verl's 128-GPU colocated generation): those figures were fitted
here. Now nothing of an RL row reaches the generation: the plan files carry the numbers this
module derives, and ``tests/test_generation_anchors.py`` holds them to it, so the law cannot
be re-tuned to the rows it then predicts.

    python -m sim.timing.anchor_generation     # each plan's [timing] keys, and the running cap

What is taken from where (chosen before any run of the plans with it):

- architectures from the models' Hugging Face configs (``Serving.model_source``);
- the engine's tensor parallelism and memory share from the run scripts of the source:
  AReaL's benchmark launcher gives SGLang TP 1 below 32B and leaves ``mem_fraction_static`` at
  its default 0.9 for the 1.5B model; verl's 7B scripts run vLLM at TP 4 with
  ``gpu_memory_utilization=0.80``;
- weights and KV in 16-bit (AReaL's SGLang runs float16, verl's vLLM the model's bfloat16;
  neither quantizes the KV cache; the H800's and H20's FP16 and BF16 peaks are the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.timing.decode_figures import H20, H800
from sim.timing.decode_law import NAMES, DecodeLaw, Deployment, Efficiency, Model, law
from sim.timing.decode_report import full_fit

BF16 = 2
"""Bytes per weight and per KV value."""
SIGNIFICANT = 4
"""Digits the plan files carry the law's three figures to (tests compare within 1e-3); the
byte counts are whole and given whole."""
LAW_KEYS = (
    "decode_step_fixed_seconds",
    "decode_step_seconds_per_request",
    "decode_step_seconds_per_kv_token",
)


def qwen2(
    name: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, vocab: int
) -> Model:
    """A Qwen2-architecture model (Qwen2ForCausalLM): biases on the q, k and v projections, a
    gated MLP, two RMSNorms a layer and one at the end, untied input and output embeddings;
    head dim hidden / heads."""
    head_dim = hidden // heads
    kv = kv_heads * head_dim
    attention = 2 * hidden * hidden + 2 * hidden * kv + hidden + 2 * kv
    params = layers * (attention + 3 * hidden * ffn + 2 * hidden) + hidden + 2 * vocab * hidden
    return Model(name, params, layers, hidden, kv_heads, head_dim, heads)


R1_DISTILL_QWEN_1_5B = qwen2("DeepSeek-R1-Distill-Qwen-1.5B", 28, 1536, 8960, 12, 2, 151936)
"""28 layers, hidden 1,536, 12 query and 2 KV heads of 128, FFN 8,960, vocab 151,936 (the
Qwen2.5-Math-1.5B architecture it was distilled onto: https://www.fitmygpu.com/models/
deepseek-r1-distill-qwen-1.5b; FFN and vocab as Qwen2.5-1.5B's config.json); embeddings untied,
which gives the 1.78 B parameters (3.55 GB in BF16) the plan's param_bytes already had."""
QWEN25_MATH_7B = qwen2("Qwen2.5-Math-7B", 28, 3584, 18944, 28, 4, 152064)
"""Qwen2.5-7B's config (its model card: ``base_model: Qwen/Qwen2.5-7B``): 28 layers, hidden
3,584, 28 query and 4 KV heads of 128, FFN 18,944, vocab 152,064, ``tie_word_embeddings:
false``; 7.62 B parameters (15.2 GB in BF16, the plan's param_bytes)."""


@dataclass(frozen=True)
class Serving:
    """How a plan's engines serve its model: the deployment the law is derived for, the share
    of the GPU the engine takes (SGLang's mem_fraction_static, vLLM's gpu_memory_utilization),
    and where each came from."""

    plan: str
    deployment: Deployment
    mem_fraction: float
    model_source: str
    engine_source: str

    @property
    def law(self) -> DecodeLaw:
        return law(self.deployment, engine_efficiency())

    def timing_keys(self) -> dict[str, float]:
        """The plan's [timing] keys, as the plan file gives them (``SIGNIFICANT`` digits)."""
        d, lw = self.deployment, self.law
        rounded = (lw.fixed, lw.per_request, lw.per_kv_token)
        return {
            **dict(zip(LAW_KEYS, (float(f"{v:.{SIGNIFICANT}g}") for v in rounded), strict=True)),
            "engine_gpu_memory_bytes": float(d.gpu.memory_bytes),
            "mem_fraction_static": self.mem_fraction,
            "model_weight_bytes_per_gpu": float(d.weight_bytes_per_gpu),
            "kv_bytes_per_token": float(d.kv_bytes_per_token),
        }

    def running_cap(self) -> tuple[int, int]:
        """(the KV pool of one engine in tokens, the requests it runs at once), as the
        simulator sizes them from the plan (``TimeModel.kv_tokens``, ``running_cap``)."""
        from sim.timing.plan_file import load_plan, points
        from sim.timing.speedup_anchors import ROOT

        point = next(p for p in points(load_plan(str(ROOT / self.plan))) if p.scenario)
        assert point.scenario is not None
        timing = point.scenario.timing
        return timing.kv_tokens(), timing.running_cap() or 0


def engine_efficiency() -> Efficiency:
    """The efficiencies fitted to every usable published engine figure (no RL row among them:
    ``python -m sim predict --decode`` lists them)."""
    return full_fit()


AREAL_ENGINE = (
    "inclusionAI/AReaL benchmark/verl_312a8cb/build_cmd.py @af2693d: sglang_tp = 1 below 32B, "
    "3/4 of the GPUs generating, mem_fraction_static overridden (0.7) only above 1.5B; "
    "realhf/api/cli_args.py @0d6273d SGLangConfig: mem_fraction_static = 0.9, dtype float16"
)
VERL_ENGINE = (
    "volcengine/verl recipe/fully_async_policy/exp/qwen2-7B-math_{32,128}/*/*.sh "
    "@7f837ac, @34cf9e7, @0e1f2d7: rollout_name=vllm, gen_tp=4, gpu_memory_utilization=0.80"
)
AREAL_SERVING = Serving(
    "plans/areal-1.5b-128-h800.toml",
    Deployment(R1_DISTILL_QWEN_1_5B, H800, 1, BF16, BF16),
    0.9,
    "https://www.fitmygpu.com/models/deepseek-r1-distill-qwen-1.5b (Qwen2 1.5B config)",
    AREAL_ENGINE,
)
SERVINGS: tuple[Serving, ...] = (
    AREAL_SERVING,
    *(
        Serving(
            f"plans/verl-7b-{gpus}-h20.toml",
            Deployment(QWEN25_MATH_7B, H20, 4, BF16, BF16),
            0.80,
            "Qwen/Qwen2.5-Math-7B model card (base_model Qwen2.5-7B) and Qwen2.5-7B's config",
            VERL_ENGINE,
        )
        for gpus in (32, 64, 128)
    ),
)


def report() -> str:
    """Each plan's derived law and KV pool, as its [timing] section has them."""
    eff = engine_efficiency()
    named = ", ".join(f"{k} {v:.3f}" for k, v in zip(NAMES, eff.vector(), strict=True))
    lines = [f"efficiencies (all usable engine figures): {named}"]
    for s in SERVINGS:
        lw, (tokens, cap) = s.law, s.running_cap()
        lines += [
            "",
            f"{s.plan}: {s.deployment.label}, memory share {s.mem_fraction:g}",
            f"  a step: {lw.fixed * 1e3:.3f} ms + {lw.per_request * 1e6:.2f} us a request "
            f"+ {lw.per_kv_token * 1e9:.3f} ns a KV token",
            f"  KV pool {tokens} tokens: {cap} requests running at once per engine",
            "  [timing]",
            *(f"  {k} = {v!r}" for k, v in s.timing_keys().items()),
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())


__all__ = [
    "AREAL_SERVING",
    "LAW_KEYS",
    "QWEN25_MATH_7B",
    "R1_DISTILL_QWEN_1_5B",
    "SERVINGS",
    "Serving",
    "engine_efficiency",
    "qwen2",
    "report",
]
