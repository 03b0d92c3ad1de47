"""The GPU backend's flags, checked, to a Stack and the world shape it runs.

Every check runs before Ray starts, and names the flag as the user wrote it:
``--device cuda`` (the default) without a CUDA device names ``--device cpu`` and
``python -m backends.cpu``; ``--engine sglang`` where SGLang is not installed (or
on CPU, where it cannot run) names ``--engine local``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util

from backends.common.run.flags import Flag, RealBackend, Spelt
from backends.common.stack import Stack, Wire
from miles_core.errors import ConfigError
from miles_core.scenario import Scenario
from miles_core.scenario.limits import Limits, check_world
from miles_core.scenario.world import WorldShape

TRAINERS = ("megatron", "fsdp")
ENGINES = ("local", "sglang")
TRANSPORTS = ("nccl", "ipc")
DEVICES = ("cuda", "cpu")


GPU_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--trainer",
        "Megatron-core GPTModel with TP per cell (default), or torch FSDP2",
        choices=TRAINERS,
        default="megatron",
        replay=Spelt.ALWAYS,
    ),
    Flag(
        "--tp",
        "Megatron's tensor-parallel size (default 2); a cell gets at least this many "
        "ranks, and TP must divide the scenario's ranks per cell",
        type=int,
        default=2,
        replay=Spelt.ALWAYS,
    ),
    Flag(
        "--engine",
        "real SGLang (the default on CUDA) or the SGLang-shaped local engine holding a "
        "transformers model on the device (the default on CPU)",
        choices=ENGINES,
        replay=Spelt.GIVEN,
    ),
    Flag(
        "--transport",
        "nccl: a group per update through the engines' API (gloo stands in on CPU); "
        "ipc: tensor handles to engines on the trainer's device (shared files on CPU)",
        choices=TRANSPORTS,
        default="nccl",
        replay=Spelt.ALWAYS,
    ),
    Flag(
        "--device",
        "cuda (default), or cpu: this backend's own code end to end on CPU",
        choices=DEVICES,
        default="cuda",
        replay=Spelt.ALWAYS,
    ),
)
"""The replay line names the stack the run had (trainer, TP, transport, device) whole, and
``--engine`` when given (left out, it follows ``--device``)."""


def check_device(device: str) -> None:
    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "--device",
            f"cuda asked, but this machine has no CUDA device (torch {torch.__version__}, "
            "torch.cuda.is_available() is False)",
            "pass --device cpu to run the GPU backend's code on CPU, or run "
            "python -m backends.cpu run",
        )


def engine_of(args: argparse.Namespace) -> str:
    engine = args.engine or ("sglang" if args.device == "cuda" else "local")
    if engine == "sglang":
        if args.device != "cuda":
            raise ConfigError("--engine", "SGLang runs on CUDA only", "pass --engine local")
        if importlib.util.find_spec("sglang") is None:
            raise ConfigError(
                "--engine",
                "sglang is not installed here",
                "install the gpu extra (pip install -e '.[gpu]'), or pass --engine local",
            )
    return engine


def gpu_stack(args: argparse.Namespace, scenario: Scenario) -> tuple[Stack, Scenario]:
    """The Stack the flags ask for, and the scenario with cells wide enough for its TP."""
    check_device(args.device)
    if args.tp < 1:
        raise ConfigError("--tp", f"got {args.tp}", "pass an integer >= 1")
    if args.trainer == "fsdp" and args.tp != 1:
        raise ConfigError(
            "--tp", "FSDP2 shards a cell's data, it has no tensor parallelism", "pass --tp 1"
        )
    engine = engine_of(args)
    ranks = max(scenario.world.gpus_per_cell, args.tp)
    if ranks % args.tp:
        raise ConfigError(
            "--tp",
            f"the scenario's cells have {ranks} ranks, which TP {args.tp} does not divide",
            "pass a --tp that divides the cell's ranks",
        )
    world = dataclasses.replace(scenario.world, gpus_per_cell=ranks)
    _check_tp(world, scenario.limits, args.tp)
    wire = Wire.IPC if args.transport == "ipc" else Wire.NCCL
    trainer_actor, engine_actor, transport = _parts(args.trainer, engine, wire)
    stack = Stack(
        device=args.device,
        trainer=args.trainer,
        tp=args.tp,
        engine=engine,
        wire=wire,
        trainer_actor=trainer_actor,
        engine_actor=engine_actor,
        transport=transport,
    )
    return stack, dataclasses.replace(scenario, world=world)


def _check_tp(world: WorldShape, limits: Limits, tp: int) -> None:
    """The cells widened to ``--tp`` within the scenario's GPU bound, naming --tp."""
    try:
        check_world(world, limits)
    except ConfigError as error:
        raise ConfigError("--tp", f"{tp}: {error.problem}", error.fix) from None


def _parts(trainer: str, engine: str, wire: Wire) -> tuple[object, object, object]:
    """The actor classes and transport (imported here: Megatron and Ray are heavy)."""
    from backends.common.world.handle_transport import HandleTransport
    from backends.common.world.transport import CollectiveTransport

    trainer_actor = None
    if trainer == "megatron":
        from backends.gpu.megatron.trainer import MegatronTrainerActor

        trainer_actor = MegatronTrainerActor
    engine_actor = None
    if engine == "sglang":
        from backends.gpu.sglang_engine import SGLangEngineActor

        engine_actor = SGLangEngineActor
    transport = HandleTransport if wire is Wire.IPC else CollectiveTransport
    return trainer_actor, engine_actor, transport


GPU = RealBackend(
    "backends.gpu", "the loop for real, on Ray, on GPUs (or on CPU)", GPU_FLAGS, gpu_stack
)
