"""``--workers``, as every command that fans out over Ray takes it: bounded before Ray starts.

Ray starts a worker process for each task in flight, so ``--workers 100000`` on one machine
forked processes until it ran out of memory. On this machine more than ``PER_CPU`` tasks a
core only queue; on a cluster (``--address``) the bound is ``ON_A_CLUSTER``.
"""

from __future__ import annotations

import os

from miles_core.errors import ConfigError

PER_CPU = 8
ON_A_CLUSTER = 4096


def most_workers(address: str | None) -> int:
    return ON_A_CLUSTER if address else PER_CPU * (os.cpu_count() or 1)


def check_workers(value: int | None, address: str | None = None) -> None:
    """None (the CPUs Ray has) or a whole number from 1 to ``most_workers``."""
    if value is None:
        return
    most = most_workers(address)
    if not 1 <= value <= most:
        where = "on a cluster" if address else f"here ({PER_CPU} per CPU)"
        raise ConfigError(
            "--workers",
            f"got {value}",
            f"pass an integer from 1 to {most}, the most {where}: each is a process",
        )
