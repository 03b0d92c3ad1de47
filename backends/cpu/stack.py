"""The CPU backend's own run flag and its Stack: FSDP2 torch trainers and local engines on
CPU, with the weights on the wire the flag names (a gloo group, or the trainer's shared
memory). Checked before Ray starts, naming the flag as the user wrote it."""

from __future__ import annotations

import argparse
import dataclasses

from backends.common.run.flags import Flag, RealBackend, Spelt
from backends.common.stack import CPU_STACK, Stack, Wire
from miles_core.errors import ConfigError
from miles_core.scenario import Scenario

CPU_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--wire",
        "how weight buckets reach the engines: a gloo group (default), or a group over "
        "the trainer's shared memory, as NCCL moves them within a node (one node only)",
        choices=(Wire.GLOO.value, Wire.SHM.value),
        default=CPU_STACK.wire.value,
        replay=Spelt.GIVEN,
    ),
)


def cpu_stack(args: argparse.Namespace, scenario: Scenario) -> tuple[Stack, Scenario]:
    """The default stack on the wire asked for; the scenario's world as it is."""
    if args.wire == Wire.SHM and args.address is not None:
        raise ConfigError(
            "--wire",
            "shm with --address: an shm group needs every engine on its trainer's node, "
            "and a cluster places them across nodes",
            "pass --wire gloo to join a cluster",
        )
    return dataclasses.replace(CPU_STACK, wire=Wire(args.wire)), scenario


CPU = RealBackend("backends.cpu", "the loop for real, on Ray, on CPU", CPU_FLAGS, cpu_stack)
