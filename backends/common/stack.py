"""What a backend runs where the hardware decides: the trainer, the engine, the wire, the device.

The Ray world, the engine server, the transport's protocol and the run are the
same in both backends (backends/common); a Stack names the parts that differ.
``python -m backends.cpu`` runs the default stack (FSDP2 torch trainers, local
engines, gloo, CPU); ``python -m backends.gpu`` builds its own (Megatron-core
or FSDP2, local or SGLang engines, NCCL or CUDA IPC, CUDA or CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Wire(StrEnum):
    """How buckets travel: a collective group made through the engines' API
    (/init_weights_update_group, then /update_weights_from_distributed), or tensor handles
    (/update_weights_from_tensor) for an engine on the trainer's own device."""

    GLOO = "gloo"
    NCCL = "nccl"
    IPC = "ipc"
    SHM = "shm"
    """A collective group over the trainer's shared memory (CPU, one node: shm_group.py)."""


@dataclass(frozen=True)
class Stack:
    device: str = "cpu"
    """Where trainers' and engines' tensors live: "cpu" or "cuda"."""
    trainer: str = "fsdp"
    """"fsdp" (torch FSDP2 over a cell's ranks) or "megatron" (Megatron-core, TP per cell)."""
    tp: int = 1
    """Megatron's tensor-parallel size: each cell's ranks form TP groups of this size."""
    engine: str = "local"
    """"local" (the SGLang-shaped engine on a transformers model) or "sglang" (the real one)."""
    wire: Wire = Wire.GLOO
    packed: bool = False
    """The distributed path's buckets as one packed broadcast each (``load_format:
    flattened_bucket``); False: one broadcast per tensor, as miles' distributed path sends
    (no ``load_format``). Tensor handles are always miles' flattened bucket."""

    def __post_init__(self) -> None:
        if self.wire is Wire.SHM and self.device != "cpu":
            raise ValueError("the shm wire moves host memory: it runs with device cpu only")

    trainer_actor: Any = None
    """The Ray actor class of a trainer rank (None: backends.common.world.trainer's)."""
    engine_actor: Any = None
    """The Ray actor class of an engine (None: backends.common.engine.server's local engine)."""
    transport: Callable[[Any], Any] | None = None
    """Makes the world's WeightTransport from its cluster (None: the collective transport,
    backends.common.world.transport; the stack sits below the world and names none of it)."""

    @property
    def collective_backend(self) -> str:
        """The backend of the weight-update groups: NCCL on CUDA when asked (gloo stands in
        for it on CPU), or shared memory on CPU when asked."""
        if self.wire is Wire.SHM:
            return "shm"
        return "nccl" if self.wire is Wire.NCCL and self.device == "cuda" else "gloo"

    def describe(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "trainer": self.trainer,
            "tp": self.tp,
            "engine": self.engine,
            "transport": self.wire.value,
            "collective_backend": self.collective_backend,
            "load_format": "flattened_bucket" if self.packed else "per tensor",
        }


CPU_STACK = Stack()
