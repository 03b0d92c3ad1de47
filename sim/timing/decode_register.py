"""Published decode figures the decode law predicts for the register (docs/predictions.md,
"Decode throughput"): figures from sources that ``decode_figures.py`` does not hold, none in any
fit, each predicted by the law exactly as committed (the fit on every usable figure of
``decode_figures``; nothing here enters it).

Why a module of its own: the register must test the law the way it tests the update model,
so the figures it predicts cannot sit beside the ones the law is fitted to, and the law's
code stays untouched. What the law lacks for them is added here, each with its source: the
H200 (no figure of the fit is on it), and three models (Mistral-7B, Llama-3.1-8B, Llama-3-70B).

Every figure is a static batch (TensorRT-LLM's ``gptSessionBenchmark``, vLLM's
``benchmark_latency``): ``batch`` prompts prefilled, then ``output - 1`` decode steps of the
whole batch (``decode_law.static_run_features``), the same reading the fit gives its own
static figures.

Rules, fixed before any figure here was predicted, applied in this order (``Excluded``):

1. ``PREFILL``: output shorter than the prompt (the 2048-in/128-out rows): mostly prefill, as
   decode_figures does not transcribe them;
2. ``IN_FIT``: the setup (GPU, model, TP, weight and KV types, batch, prompt, output) of a row
   of ``decode_figures.FIGURES``: the law has seen a figure of that very setup, so its figure
   here would not be a prediction;
3. ``SUPERSEDED``: a setup another source here gives from a later release of the same engine
   (one figure per setup; the later release's);
4. ``KV``: a batch that cannot hold its KV cache at once (``Deployment.holds``, the rule
   ``decode_figures.usable`` applies before the fit): its running batch was not its batch.

Not transcribed at all: Mixtral 8x7B (a mixture of experts: the law's one parameter count
serves both the weights read and the FLOPs); the L40S tables (a PCIe card whose all-reduce is
not the NVLink one the law's launch term assumes; no plan here uses it); TensorRT-LLM v0.8.0's
tables (v0.9.0's setups one release earlier: most setups would count twice).

Rows are appended, never reordered: the register's keys (D1, D2, ...) number the registered
figures in this order, and a test holds each key's setup to the register's text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from sim.timing.decode_figures import (
    A100,
    FALCON_180B,
    FIGURES,
    GIB,
    GPTJ_6B,
    H100,
    LLAMA2_7B,
    LLAMA2_13B,
    LLAMA2_70B,
)
from sim.timing.decode_law import Deployment, Efficiency, Gpu, Model, static_run_features

H200 = Gpu("H200-SXM", 141 * GIB, 4.8e12, flops_16=989.4e12, flops_8=1978.9e12)
"""141 GB of HBM3e at 4.8 TB/s ("H200 is the first GPU with HBM3e memory with 4.8TB/s of memory
bandwidth ... 141 gigabytes (GB)": TensorRT-LLM docs/source/blogs/H200launch.md, "Latest HBM
Memory"); the H100 SXM's GH100 die and tensor peaks, dense BF16 989 and FP8 1,979 TFLOPS
(https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html, "Specification
comparison", dense; https://lzwjava.github.io/nvidia-h200-gpu-specs-en: FP8 3,958 TFLOPS with
sparsity, "Identical" to the H100), so the H100's exact dense figures. Taken as 141 GiB as the
H100 is taken as 80."""


def _llama(name: str, layers: int, hidden: int, ffn: int, kv_heads: int, vocab: int) -> Model:
    """A Llama-shaped model counted as decode_figures counts Llama-2 (gated MLP, two RMSNorms a
    layer and one at the end, untied embeddings, head dim 128)."""
    head_dim = 128
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    params = layers * (attention + 3 * hidden * ffn + 2 * hidden) + hidden + 2 * vocab * hidden
    return Model(name, params, layers, hidden, kv_heads, head_dim, hidden // head_dim)


MISTRAL_7B = _llama("Mistral-7B", 32, 4096, 14336, 8, 32000)
"""n_layers 32, dim 4096, hidden_dim 14336, n_heads 32, head_dim 128, n_kv_heads 8, vocab 32,000
(https://huggingface.co/mlx-community/mistral-7B-v0.1/blob/bd10b289a348d5c9b49bed31feb63c4b2e8c7089/
config.json); 7,241,732,096 parameters. Its 4,096-token sliding window never binds here."""
LLAMA31_8B = _llama("Llama-3.1-8B", 32, 4096, 14336, 8, 128256)
"""32 layers, 4,096 hidden, 14,336 intermediate, 8 KV heads, vocab 128,256, untied
(https://huggingface.co/NbAiLab/nb-llama-3.1-8B/blob/main/config.json, ``_name_or_path``
meta-llama/Llama-3.1-8B); 8,030,261,248 parameters. Llama-3-8B has the same shape."""
LLAMA3_70B = _llama("Llama-3-70B", 80, 8192, 28672, 8, 128256)
"""Llama-3.3-70B's shape (decode_figures.LLAMA33_70B; Llama-3 and 3.3 70B share it)."""


@dataclass(frozen=True)
class Source:
    key: str
    engine: str
    release: int
    """Order of the engine's releases among this module's sources (``SUPERSEDED``)."""
    url: str
    what: str


TRT_090 = Source(
    "TensorRT-LLM v0.9.0",
    "TensorRT-LLM",
    90,
    "https://github.com/NVIDIA/TensorRT-LLM/blob/v0.9.0/docs/source/performance.md",
    "Peak Throughput ('All data was generated using version 0.9.0'), tables 'H200 GPUs (FP8)', "
    "'H100 GPUs (FP8)', 'A100 GPUs (FP16)', Throughput (out tok/s/GPU); gptSessionBenchmark "
    "static batches; FP8 weights and KV cache (quant_algo and kv_cache_quant_algo FP8), removed "
    "on A100",
)
TRT_H200_LAUNCH = Source(
    "TensorRT-LLM v0.5.0 H200 blog",
    "TensorRT-LLM",
    50,
    "https://github.com/NVIDIA/TensorRT-LLM/blob/1555478c1b417a0b34de05209862ea5a2ab9add1/"
    "docs/source/blogs/H200launch.md",
    "'H200 FP8 Max throughput' table, Throughput (out tok/s/GPU); TensorRT-LLM v0.5.0 "
    "(FP8 KV cache assumed, as decode_figures assumes for v0.5.0)",
)
TRT_H200_GQA = Source(
    "TensorRT-LLM v0.7a H200 blog",
    "TensorRT-LLM",
    70,
    "https://github.com/NVIDIA/TensorRT-LLM/blob/3c44cb974badec8966108b16054a99c0923e410d/"
    "docs/source/blogs/Falcon180B-H200.md",
    "'Llama-70B on H200 up to 6.7x A100' table, the 1-GPU rows (1xH200 = TP1; Llama2-70B FP8; "
    "BS in order 960, 192, 96), Throughput (out tok/s/GPU); v0.7a (FP8 KV cache assumed)",
)
TRT_H100_A100 = Source(
    "TensorRT-LLM v0.5.0 H100-vs-A100 blog",
    "TensorRT-LLM",
    50,
    "https://github.com/NVIDIA/TensorRT-LLM/blob/15ed78097ea2c14b3831ca017935a32dec54476e/"
    "docs/source/blogs/H100vsA100.md",
    "'Max Throughput & Min Latency' table, Throughput (out tok/s); H100 FP8, A100 FP16, TP1",
)
VLLM_H200 = Source(
    "vLLM CI build 9513 (H200)",
    "vLLM",
    0,
    "https://buildkite.com/vllm/performance-benchmark/builds/9513",
    "'Latency tests' (input 32, output 128, batch fixed 8), Mean latency (ms); "
    "latency_llama8B_tp1, latency_llama70B_tp4 on H200; BF16 (dtype auto), dummy weights",
)
VLLM_A100 = Source(
    "vLLM CI build 9523 (A100)",
    "vLLM",
    0,
    "https://buildkite.com/vllm/performance-benchmark/builds/9523",
    "'Latency tests' (input 32, output 128, batch fixed 8), Mean latency (ms) on "
    "A100-SXM4-80GB; BF16",
)
VLLM_H100 = Source(
    "vLLM CI build 9555 (8xH100)",
    "vLLM",
    0,
    "https://buildkite.com/vllm/performance-benchmark/builds/9555",
    "'Latency tests' (input 32, output 128, batch fixed 8), Mean latency (ms) on 8xH100 "
    "(taken as SXM); BF16",
)
SOURCES = (TRT_090, TRT_H200_LAUNCH, TRT_H200_GQA, TRT_H100_A100, VLLM_H200, VLLM_A100, VLLM_H100)


class Unit(enum.Enum):
    """What a published number is; its text in the register."""

    TOK_S = "tok/s"
    TOK_S_PER_GPU = "tok/s/GPU"
    RUN_MS = "ms"


class Excluded(enum.Enum):
    """Why a transcribed row is not registered (module docstring, in the order applied)."""

    PREFILL = "output shorter than prompt (mostly prefill)"
    IN_FIT = "its setup is a row of decode_figures (the fit saw it)"
    SUPERSEDED = "a later release of the engine gives this setup here"
    KV = "its batch cannot hold its KV cache at once"


@dataclass(frozen=True)
class Figure:
    """One published static-batch figure: ``value`` in ``unit``."""

    source: Source
    table: str
    deployment: Deployment
    batch: int
    prompt: int
    output: int
    value: float
    unit: Unit

    @property
    def setup(self) -> tuple[Deployment, int, int, int]:
        return (self.deployment, self.batch, self.prompt, self.output)

    @property
    def label(self) -> str:
        """The register's setup column: deployment, batch, prompt/output."""
        return f"{self.deployment.label} b{self.batch} {self.prompt}/{self.output}"

    @property
    def seconds(self) -> float:
        """The run's wall time the figure implies."""
        return self.seconds_of(self.value)

    def seconds_of(self, value: float) -> float:
        if self.unit is Unit.RUN_MS:
            return value / 1e3
        total = value * (self.deployment.tp if self.unit is Unit.TOK_S_PER_GPU else 1)
        return self.batch * self.output / total

    def value_of(self, seconds: float) -> float:
        """A run time in the published unit."""
        if self.unit is Unit.RUN_MS:
            return seconds * 1e3
        tp = self.deployment.tp if self.unit is Unit.TOK_S_PER_GPU else 1
        return self.batch * self.output / seconds / tp

    def features(self) -> np.ndarray:
        return static_run_features(self.deployment, self.batch, self.prompt, self.output)


def _trt090() -> list[Figure]:
    fp8 = {"H200 GPUs (FP8)": H200, "H100 GPUs (FP8)": H100}
    rows: dict[str, dict[Model, tuple[tuple[int, int, int, int, float], ...]]] = {
        "H200 GPUs (FP8)": {
            GPTJ_6B: (
                (1024, 1, 128, 128, 27304),
                (120, 1, 128, 2048, 8530),
                (64, 1, 2048, 128, 2785),
                (64, 1, 2048, 2048, 3753),
            ),
            MISTRAL_7B: (
                (896, 1, 128, 128, 20460),
                (120, 1, 128, 2048, 8950),
                (64, 1, 2048, 128, 2423),
                (56, 1, 2048, 2048, 3867),
            ),
            LLAMA2_7B: (
                (896, 1, 128, 128, 20618),
                (120, 1, 128, 2048, 8348),
                (64, 1, 2048, 128, 2391),
                (56, 1, 2048, 2048, 3522),
            ),
            LLAMA2_70B: (
                (1024, 1, 128, 128, 3989),
                (512, 2, 128, 2048, 3963),
                (64, 1, 2048, 128, 418),
                (64, 1, 2048, 2048, 1458),
            ),
            FALCON_180B: (
                (1024, 4, 128, 128, 1118),
                (1024, 4, 128, 2048, 990),
                (64, 4, 2048, 128, 118),
                (64, 4, 2048, 2048, 265),
            ),
        },
        "H100 GPUs (FP8)": {
            GPTJ_6B: (
                (1024, 1, 128, 128, 25860),
                (120, 1, 128, 2048, 7350),
                (64, 1, 2048, 128, 2570),
                (64, 1, 2048, 2048, 3212),
            ),
            MISTRAL_7B: (
                (896, 1, 128, 128, 20404),
                (120, 1, 128, 2048, 8623),
                (84, 1, 2048, 128, 2405),
                (56, 1, 2048, 2048, 3731),
            ),
            LLAMA2_7B: (
                (896, 1, 128, 128, 19854),
                (120, 1, 128, 2048, 6944),
                (84, 1, 2048, 128, 2163),
                (56, 1, 2048, 2048, 2826),
            ),
            LLAMA2_70B: (
                (1024, 2, 128, 128, 3214),
                (512, 4, 128, 2048, 2725),
                (96, 2, 2048, 128, 346),
                (64, 2, 2048, 2048, 1011),
            ),
            FALCON_180B: (
                (1024, 4, 128, 128, 1100),
                (1024, 8, 128, 2048, 837),
                (64, 4, 2048, 128, 112),
                (64, 4, 2048, 2048, 246),
            ),
        },
        "A100 GPUs (FP16)": {
            GPTJ_6B: (
                (512, 1, 128, 128, 5876),
                (32, 1, 128, 2048, 1549),
                (32, 1, 2048, 128, 545),
                (32, 1, 2048, 2048, 815),
            ),
            MISTRAL_7B: (
                (896, 1, 128, 128, 6251),
                (120, 1, 128, 2048, 3776),
                (64, 1, 2048, 128, 698),
                (56, 1, 2048, 2048, 1576),
            ),
            LLAMA2_7B: (
                (256, 1, 128, 128, 5390),
                (32, 1, 128, 2048, 1484),
                (32, 1, 2048, 128, 533),
                (16, 1, 2048, 2048, 603),
            ),
            LLAMA2_70B: (
                (1024, 4, 128, 128, 686),
                (512, 8, 128, 2048, 684),
                (96, 4, 2048, 128, 80),
                (64, 4, 2048, 2048, 289),
            ),
            FALCON_180B: (
                (1024, 8, 128, 128, 254),
                (512, 8, 128, 2048, 266),
                (64, 8, 2048, 128, 29),
                (64, 8, 2048, 2048, 93),
            ),
        },
    }
    out = []
    for table, by_model in rows.items():
        gpu, size = (fp8[table], 1) if table in fp8 else (A100, 2)
        for model, entries in by_model.items():
            for batch, tp, prompt, output, value in entries:
                d = Deployment(model, gpu, tp, size, size)
                unit = Unit.TOK_S_PER_GPU
                out.append(Figure(TRT_090, table, d, batch, prompt, output, value, unit))
    return out


def _trt_blogs() -> list[Figure]:
    per_gpu, h200_fp8 = Unit.TOK_S_PER_GPU, "H200 FP8 Max throughput"
    launch = [
        (LLAMA2_13B, 1024, 1, 128, 128, 11819),
        (LLAMA2_13B, 128, 1, 128, 2048, 4750),
        (LLAMA2_13B, 64, 1, 2048, 128, 1349),
        (LLAMA2_70B, 512, 1, 128, 128, 3014),
        (LLAMA2_70B, 512, 2, 128, 2048, 1654),
        (LLAMA2_70B, 64, 1, 2048, 128, 341),
        (LLAMA2_70B, 32, 1, 2048, 128, 303),
    ]
    out = [
        Figure(TRT_H200_LAUNCH, h200_fp8, Deployment(m, H200, tp, 1, 1), b, i, o, v, per_gpu)
        for m, b, tp, i, o, v in launch
    ]
    gqa, d70 = "Llama-70B on H200 up to 6.7x A100 (1 GPU)", Deployment(LLAMA2_70B, H200, 1, 1, 1)
    out += [
        Figure(TRT_H200_GQA, gqa, d70, b, 128, o, v, per_gpu)
        for b, o, v in ((960, 128, 3803), (192, 2048, 2941), (96, 4096, 1946))
    ]
    table = "Max Throughput & Min Latency"
    for gpu, size, value in ((H100, 1, 10907), (A100, 2, 3679)):
        d = Deployment(GPTJ_6B, gpu, 1, size, size)
        out.append(Figure(TRT_H100_A100, table, d, 64, 128, 128, value, Unit.TOK_S))
    return out


def _vllm() -> list[Figure]:
    out = []
    for source, gpu, small, large in (
        (VLLM_H200, H200, 834.059, 2075.08),
        (VLLM_A100, A100, 1579.27, 3990.59),
        (VLLM_H100, H100, 997.542, 2444.47),
    ):
        for test, model, tp, ms in (
            ("latency_llama8B_tp1", LLAMA31_8B, 1, small),
            ("latency_llama70B_tp4", LLAMA3_70B, 4, large),
        ):
            d, table = Deployment(model, gpu, tp, 2, 2), f"Latency tests, {test} (BF16)"
            out.append(Figure(source, table, d, 8, 32, 128, ms, Unit.RUN_MS))
    return out


TRANSCRIBED: tuple[Figure, ...] = (*_trt090(), *_trt_blogs(), *_vllm())


def excluded(figure: Figure) -> Excluded | None:
    """The first rule (module docstring) that leaves ``figure`` out, or None."""
    if figure.output < figure.prompt:
        return Excluded.PREFILL
    fitted = {(f.deployment, f.batch, f.prompt, f.output) for f in FIGURES}
    if figure.setup in fitted:
        return Excluded.IN_FIT
    later = [
        f
        for f in TRANSCRIBED
        if f.setup == figure.setup
        and f.source.engine == figure.source.engine
        and f.source.release > figure.source.release
    ]
    if later:
        return Excluded.SUPERSEDED
    if not figure.deployment.holds(figure.batch, figure.prompt + figure.output):
        return Excluded.KV
    return None


def registered() -> dict[str, Figure]:
    """The figures the register holds, keyed D1, D2, ... in transcription order."""
    kept = [f for f in TRANSCRIBED if excluded(f) is None]
    return {f"D{i}": f for i, f in enumerate(kept, start=1)}


def efficiency() -> Efficiency:
    """The law as committed: its five efficiencies fitted to every usable figure of
    decode_figures, each source family weighing one (decode_report's "all figures" fit)."""
    from sim.timing.decode_report import full_fit

    return full_fit()


@dataclass(frozen=True)
class Prediction:
    figure: Figure
    seconds: float

    @property
    def value(self) -> float:
        """In the published unit."""
        return self.figure.value_of(self.seconds)

    @property
    def ratio(self) -> float:
        """Predicted over published, in the published unit: above 1 a throughput predicted too
        high, or a run time predicted too long."""
        return self.value / self.figure.value


def predict(figure: Figure, eff: Efficiency | None = None) -> Prediction:
    eff = efficiency() if eff is None else eff
    return Prediction(figure, float(figure.features() @ eff.vector()))


__all__ = [
    "H200",
    "LLAMA3_70B",
    "LLAMA31_8B",
    "MISTRAL_7B",
    "SOURCES",
    "TRANSCRIBED",
    "Excluded",
    "Figure",
    "Prediction",
    "Source",
    "Unit",
    "efficiency",
    "excluded",
    "predict",
    "registered",
]
