"""The least Megatron-core needs to run on a CPU-only torch (gloo), in one place.

Megatron-core assumes CUDA in a few spots that a tiny GPTModel with the local layer
spec and ``use_cpu_initialization=True`` still reaches on CPU:

1. ``torch.cuda.current_device()`` is called as a device argument on the forward
   path: RoPE (``RotaryEmbedding.get_emb`` moves ``inv_freq`` to it), the attention
   scratch buffer (``GlobalMemoryBuffer.get_tensor`` in ``DotProductAttention``) and
   the TP gathers (``tensor_parallel.mappings``). A CPU build raises there; the shim
   answers "cpu", the only device there is.
2. The model-parallel RNG tracker (``CudaRNGStatesTracker``) stores and swaps CUDA
   generator states; ``DotProductAttention`` forks it around attention dropout even at
   p=0 ("cuda rng state model-parallel-rng is not added" when unseeded), and
   ``model_parallel_cuda_manual_seed`` cannot seed it without CUDA.
   ``cpu_model_parallel_manual_seed`` installs a tracker over the CPU generator with
   Megatron's own seeds instead.

The third CUDA spot, the default causal mask (``get_default_causal_mask`` allocates
on ``device="cuda"``), is not patched: ``MegatronPolicy`` passes an explicit mask.
Megatron's distributed optimizer allocates on CUDA too; the trainer uses torch's Adam.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_applied = False


def apply_cpu_shims() -> None:
    """Patch ``torch.cuda.current_device`` to answer "cpu" when there is no CUDA.

    Idempotent; does nothing when CUDA is available (the real device is used there).
    """
    global _applied
    if _applied or torch.cuda.is_available():
        return

    def current_device() -> torch.device:
        # Megatron only passes this as a device= / .to() argument (see the module doc).
        return torch.device("cpu")

    torch.cuda.current_device = current_device
    _applied = True


def _tracker_class() -> type:
    from megatron.core.tensor_parallel import random as mpu_random

    class CpuRNGStatesTracker(mpu_random.CudaRNGStatesTracker):
        """Megatron's tracker over the CPU default generator instead of the CUDA one."""

        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.states_[name] = torch.get_rng_state()

        @contextlib.contextmanager
        def fork(self, name: str = mpu_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def cpu_model_parallel_manual_seed(seed: int) -> None:
    """``model_parallel_cuda_manual_seed`` for CPU: the same three named states, same seeds.

    Call after ``initialize_model_parallel``. It swaps Megatron's tracker global for a
    CPU one (what ``initialize_rng_tracker`` would build), so ``get_cuda_rng_tracker()``
    returns it; the default CPU generator is left alone, as the CUDA version leaves the
    CPU generator alone.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mpu_random

    apply_cpu_shims()
    tracker = _tracker_class()()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    tracker.add(mpu_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mpu_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(
        mpu_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank
    )
    mpu_random._CUDA_RNG_STATE_TRACKER = tracker
    mpu_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
