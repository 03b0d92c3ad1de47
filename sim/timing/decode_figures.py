"""Published decode figures: engine throughput or inter-token latency against batch size or
concurrency, for known models on known GPUs, each with its source (issue 51, item 3).

Every number below was read in the text of its source as the search tools returned it
(docs/decode-law.md lists each table). Two rules chose the rows, before any fit:

- a row whose output is shorter than its prompt (the 2048-in/128-out rows) is not transcribed:
  its figure is mostly prefill, not decode;
- a row whose whole batch cannot hold its KV cache at once (``Deployment.holds``) is
  transcribed but left out of fits and comparisons (``usable``): its running batch was smaller
  than its batch column (the published first-token latencies of such rows show them queued).

The architectures are the engines' own build flags where the source gives them (TensorRT-LLM's
``--n_layer --n_head --n_kv_head --n_embd --inter_size --vocab_size``), else the model's
config; parameter counts are computed from them, embeddings included.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from sim.timing.decode_law import (
    Deployment,
    Gpu,
    Model,
    serving_itl_features,
    static_run_features,
)

GIB = 2**30


def _llama(name: str, layers: int, hidden: int, ffn: int, kv_heads: int, vocab: int) -> Model:
    """A Llama-family model: gated MLP (three matrices), two RMSNorms a layer and one at the end,
    untied embeddings, head dim 128."""
    head_dim = 128
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    params = layers * (attention + 3 * hidden * ffn + 2 * hidden) + hidden + 2 * vocab * hidden
    return Model(name, params, layers, hidden, kv_heads, head_dim, hidden // head_dim)


LLAMA2_7B = _llama("Llama-2-7B", 32, 4096, 11008, 32, 32000)
LLAMA2_13B = _llama("Llama-2-13B", 40, 5120, 13824, 40, 32000)
LLAMA2_70B = _llama("Llama-2-70B", 80, 8192, 28672, 8, 32000)
LLAMA33_70B = _llama("Llama-3.3-70B", 80, 8192, 28672, 8, 128256)
GPTJ_6B = Model(
    "GPT-J-6B", 28 * (4 * 4096**2 + 2 * 4096 * 4 * 4096) + 2 * 50400 * 4096, 28, 4096, 16, 256
)
"""16 heads of 256 (MHA), a 4x ungated MLP, vocab 50,400 (EleutherAI/gpt-j-6b config)."""
FALCON_180B = Model(
    "Falcon-180B",
    80 * (14848 * (14848 + 2 * 8 * 64) + 14848**2 + 2 * 14848 * 4 * 14848) + 65024 * 14848,
    80,
    14848,
    8,
    64,
    232,
)
"""232 query heads of 64, 8 KV heads, a 4x ungated MLP, tied embeddings (TensorRT-LLM build
flags ``--n_head 232 --n_kv_head 8 --n_embd 14848 --vocab_size 65024``)."""

H100 = Gpu("H100-SXM", 80 * GIB, 3.35e12, flops_16=989.4e12, flops_8=1978.9e12)
"""3.35 TB/s HBM3; dense BF16 989.4 and FP8 1,978.9 TFLOPS (https://glennklockwood.com/garden/
processors/h100, from NVIDIA's datasheet, whose figures with sparsity are twice these)."""
A100 = Gpu("A100-SXM-80GB", 80 * GIB, 2.039e12, flops_16=312e12)
"""2,039 GB/s HBM2e; dense FP16 312 TFLOPS (https://www.thundercompute.com/blog/
nvidia-a100-specs-full-guide; https://glennklockwood.com/garden/processors/A100)."""
H800 = Gpu("H800-SXM", 80 * GIB, 3.35e12, flops_16=989.4e12, flops_8=1978.9e12)
"""The H100 SXM's GH100 die and 80 GB of HBM3 with its NVLink cut to 400 GB/s and FP64 to 1
TFLOPS; HBM bandwidth and the FP16/BF16/FP8 tensor peaks are the H100's
(https://www.philisun.com/technical-analysis/nvidia-h800-vs-h100-a-technical-deep-dive-into-
politically-defined-ai-chips/; https://aiwiki.ai/wiki/nvidia_h800). No published decode figure
is on it: AReaL's plan (sim/timing/anchor_generation.py) predicts with it."""
H20 = Gpu("H20", 96 * GIB, 4.0e12, flops_16=148e12, flops_8=296e12)
"""96 GB HBM3 at 4.0 TB/s; dense FP16/BF16 148 TFLOPS, INT8/FP8 296 (about 15 % of the H100's
compute: https://willitrunai.com/es/gpus/h20-96gb; https://zangshuxian.com/new/
674733024499207168). Taken as 96 GiB as the H100 is taken as 80. verl's plans predict with it."""


@dataclass(frozen=True)
class Source:
    key: str
    family: str
    """What a leave-one-out pass holds out together (two releases of one engine's tables)."""
    url: str
    what: str


TRT_061 = Source(
    "TensorRT-LLM v0.6.1",
    "TensorRT-LLM",
    "https://github.com/NVIDIA/TensorRT-LLM/blob/77d24b5fa178f11ed7fafdd9833b7245e075f721/"
    "docs/source/performance.md",
    "Peak Throughput tables 'H100 GPUs (FP8)' and 'A100 GPUs (FP16)', Throughput (out tok/s/GPU);"
    " static batches (gptSessionBenchmark), FP8 weights and KV cache on H100",
)
TRT_050 = Source(
    "TensorRT-LLM v0.5.0",
    "TensorRT-LLM",
    "https://github.com/NVIDIA/TensorRT-LLM/blob/release/0.5.0/docs/source/performance.md",
    "High Throughput table 'H100 GPUs (FP8)', Throughput (out tok/s); static batches",
)
LMDEPLOY = Source(
    "LMDeploy v0.1.0a1",
    "LMDeploy",
    "https://github.com/InternLM/lmdeploy/blob/3e391df4673326f79363eebe030876861a9b7090/"
    "docs/en/benchmark/a100_fp16.md",
    "Static Inference Benchmark tables llama2-7b, llama2-13b, llama2-70b, throughput(out tok/s);"
    " TurboMind on A100-80G, FP16 weights and KV cache",
)
NIM = Source(
    "NVIDIA NIM LLM benchmarking 1.0.0",
    "NIM",
    "https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance.md",
    "Llama-3.3-70b-instruct Results, Version 1.8.0, 2 x H100 80G, fp8 TP2, 5000 Input Tokens /"
    " 500 Output Tokens, ITL (ms) by concurrency",
)
SOURCES = (TRT_061, TRT_050, LMDEPLOY, NIM)


class Metric(enum.Enum):
    """What a figure's number is."""

    TOKENS_PER_SECOND = "out tok/s"
    TOKENS_PER_SECOND_PER_GPU = "out tok/s/GPU"
    ITL_MS = "ITL ms"


@dataclass(frozen=True)
class DecodeFigure:
    """One published row: ``batch`` is the static batch, or the concurrency of a serving run."""

    source: Source
    table: str
    deployment: Deployment
    batch: int
    prompt: int
    output: int
    value: float
    metric: Metric

    @property
    def name(self) -> str:
        d = self.deployment
        return (
            f"{self.source.key}: {d.label} b{self.batch} {self.prompt}/{self.output} "
            f"{self.value:g} {self.metric.value}"
        )

    @property
    def usable(self) -> bool:
        """The whole batch fits the KV cache, so it all ran (module docstring)."""
        return self.deployment.holds(self.batch, self.prompt + self.output)

    @property
    def seconds(self) -> float:
        """The time the figure implies: a static run's wall time, or the ITL."""
        if self.metric is Metric.ITL_MS:
            return self.value / 1e3
        total = self.value * (self.deployment.tp if self.per_gpu else 1)
        return self.batch * self.output / total

    @property
    def per_gpu(self) -> bool:
        return self.metric is Metric.TOKENS_PER_SECOND_PER_GPU

    def features(self) -> np.ndarray:
        d = self.deployment
        if self.metric is Metric.ITL_MS:
            return serving_itl_features(d, self.batch, self.prompt, self.output)
        return static_run_features(d, self.batch, self.prompt, self.output)

    def ratio(self, predicted_seconds: float) -> float:
        """Predicted over published, in the published metric (throughput is inverse time)."""
        if self.metric is Metric.ITL_MS:
            return predicted_seconds / self.seconds
        return self.seconds / predicted_seconds


def _rows(
    source: Source,
    table: str,
    d: Deployment,
    metric: Metric,
    rows: tuple[tuple[int, int, int, float], ...],
) -> tuple[DecodeFigure, ...]:
    return tuple(DecodeFigure(source, table, d, b, i, o, v, metric) for b, i, o, v in rows)


TRT_061_ROWS = (
    (H100, GPTJ_6B, 1, 1024, 128, 128, 26150),
    (H100, GPTJ_6B, 1, 120, 128, 2048, 8011),
    (H100, GPTJ_6B, 1, 64, 2048, 2048, 3327),
    (H100, LLAMA2_7B, 1, 768, 128, 128, 19694),
    (H100, LLAMA2_7B, 1, 112, 128, 2048, 6818),
    (H100, LLAMA2_7B, 1, 48, 2048, 2048, 2740),
    (H100, LLAMA2_70B, 2, 1024, 128, 128, 2657),
    (H100, LLAMA2_70B, 4, 480, 128, 2048, 1486),
    (H100, LLAMA2_70B, 2, 64, 2048, 2048, 547),
    (H100, FALCON_180B, 4, 1024, 128, 128, 987),
    (H100, FALCON_180B, 8, 1024, 128, 2048, 724),
    (H100, FALCON_180B, 4, 64, 2048, 2048, 264),
    (A100, GPTJ_6B, 1, 512, 128, 128, 6374),
    (A100, GPTJ_6B, 2, 120, 128, 2048, 2192),
    (A100, GPTJ_6B, 2, 64, 2048, 2048, 903),
    (A100, LLAMA2_7B, 1, 384, 128, 128, 5586),
    (A100, LLAMA2_7B, 1, 60, 128, 2048, 1928),
    (A100, LLAMA2_7B, 2, 64, 2048, 2048, 782),
    (A100, LLAMA2_70B, 4, 1280, 128, 128, 670),
    (A100, LLAMA2_70B, 4, 240, 128, 2048, 525),
    (A100, FALCON_180B, 8, 1024, 128, 128, 232),
    (A100, FALCON_180B, 8, 128, 128, 2048, 180),
)
"""(GPU, model, TP, batch, input, output, out tok/s/GPU): FP8 weights and KV on H100 (the build
flags ``--enable_fp8 --fp8_kv_cache``), FP16 on A100."""


def _trt061() -> tuple[DecodeFigure, ...]:
    out = []
    for gpu, model, tp, batch, prompt, output, value in TRT_061_ROWS:
        fp8 = gpu is H100
        d = Deployment(model, gpu, tp, 1 if fp8 else 2, 1 if fp8 else 2)
        table = f"Peak Throughput, {'H100 GPUs (FP8)' if fp8 else 'A100 GPUs (FP16)'}"
        metric = Metric.TOKENS_PER_SECOND_PER_GPU
        out.append(DecodeFigure(TRT_061, table, d, batch, prompt, output, value, metric))
    return tuple(out)


def _trt050() -> tuple[DecodeFigure, ...]:
    """The total throughput of the run (the 70B TP4 rows cannot be per GPU: 3,317 a GPU at batch
    64 would be a step shorter than reading a quarter of the FP8 weights once)."""
    table, total = "High Throughput, H100 GPUs (FP8)", Metric.TOKENS_PER_SECOND
    gptj, l7 = Deployment(GPTJ_6B, H100, 1, 1, 1), Deployment(LLAMA2_7B, H100, 1, 1, 1)
    l70 = Deployment(LLAMA2_70B, H100, 4, 1, 1)
    return (
        *_rows(TRT_050, table, gptj, total, ((64, 128, 128, 10907), (64, 128, 2048, 6179))),
        *_rows(TRT_050, table, gptj, total, ((64, 2048, 2048, 2980),)),
        *_rows(TRT_050, table, l7, total, ((64, 128, 128, 9193), (64, 128, 2048, 5367))),
        *_rows(TRT_050, table, l7, total, ((32, 2048, 2048, 2230),)),
        *_rows(TRT_050, table, l70, total, ((64, 128, 128, 3317), (64, 128, 2048, 2616))),
        *_rows(TRT_050, table, l70, total, ((64, 2048, 2048, 1583),)),
    )


LENGTHS = ((1, 128), (128, 128), (128, 2048), (2048, 2048))
"""LMDeploy's prompt/output pairs kept (its 2048/128 rows are prefill, not decode)."""


def _lmdeploy(
    heading: str, model: Model, tp: int, by_batch: dict[int, tuple[float, ...]]
) -> tuple[DecodeFigure, ...]:
    """One of LMDeploy's tables: by batch, the throughputs at each of ``LENGTHS``."""
    d = Deployment(model, A100, tp, 2, 2)
    table = f"Static Inference Benchmark, {heading}"
    return tuple(
        DecodeFigure(LMDEPLOY, table, d, batch, i, o, v, Metric.TOKENS_PER_SECOND)
        for batch, values in by_batch.items()
        for (i, o), v in zip(LENGTHS, values, strict=True)
    )


def _nim() -> tuple[DecodeFigure, ...]:
    d = Deployment(LLAMA33_70B, H100, 2, 1, 1)
    table = "Llama-3.3-70b-instruct, Version 1.8.0, 2 x H100 80G, fp8 TP2, 5000/500"
    itl = ((1, 18.58), (5, 21.83), (25, 38.75), (50, 59.73))
    saturated = ((100, 92.91), (150, 92.86), (200, 93.06), (250, 93.2))
    return tuple(
        DecodeFigure(NIM, table, d, c, 5000, 500, ms, Metric.ITL_MS) for c, ms in itl + saturated
    )


FIGURES: tuple[DecodeFigure, ...] = (
    *_trt061(),
    *_trt050(),
    *_lmdeploy(
        "llama2-7b",
        LLAMA2_7B,
        1,
        {
            1: (100.02, 102.21, 98.92, 93.78),
            16: (1504.72, 1272.47, 1010.62, 601.63),
            32: (2136.73, 2125.47, 1462.12, 733.34),
            64: (4154.81, 3024.07, 1852.06, 755.65),
        },
    ),
    *_lmdeploy(
        "llama2-13b",
        LLAMA2_13B,
        1,
        {
            1: (57.49, 56.58, 55.29, 52.12),
            16: (869.45, 757.3, 605.88, 366.67),
            32: (1667.5, 1301.27, 860.14, 389.64),
            64: (3049.16, 2033.22, 998.86, 387.86),
        },
    ),
    *_lmdeploy(
        "llama2-70b",
        LLAMA2_70B,
        4,
        {
            1: (33.94, 33.63, 32.38, 31.9),
            16: (468.52, 439.77, 482.99, 399.42),
            32: (906.03, 746.36, 853.56, 636.23),
            64: (1425.79, 1159.84, 1391.8, 930.46),
        },
    ),
    *_nim(),
)


def usable() -> tuple[DecodeFigure, ...]:
    return tuple(f for f in FIGURES if f.usable)


__all__ = [
    "A100",
    "FALCON_180B",
    "FIGURES",
    "GPTJ_6B",
    "H20",
    "H100",
    "H800",
    "LLAMA2_7B",
    "LLAMA2_13B",
    "LLAMA2_70B",
    "LLAMA33_70B",
    "SOURCES",
    "DecodeFigure",
    "Metric",
    "Source",
    "usable",
]
