"""Ray's alarm about a dead worker, left out for the workers that a fault kills on purpose.

Each kill a scenario injects (a rank or an engine exits at its point) made the raylet
push "A worker died or was killed while executing a task by an unexpected system
error ... OOM killer ... SIGSEGV", in colour, to the driver, which printed it under
the run's own line announcing the kill. ``log_to_driver=False`` does not cover it
(the driver's error listener prints it, not the log monitor) and Ray has no option
for it. So while a session is open the driver's printer is wrapped, and a raylet
message that names the PID of a worker killed on purpose (``expect_exit``) is
dropped; any other worker's death is printed as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
import ray._private.state
import ray._private.worker

INTENDED: set[int] = set()
"""PIDs of the worker processes this session kills on purpose."""

_WORKER_PID = re.compile(r"Worker PID: (\d+)")


def actor_pid(actor: Any) -> int | None:
    """The PID of an actor's worker process, as the GCS knows it (None: not known yet)."""
    try:
        info = ray._private.state.actors(actor._actor_id.hex())
    except Exception:  # the GCS could not answer: the alarm is printed, nothing worse
        return None
    return int(info.get("Pid") or 0) or None


def expect_exit(actors: Iterable[Any]) -> None:
    """The workers of ``actors`` are about to be killed on purpose: no alarm for them."""
    INTENDED.update(pid for pid in map(actor_pid, actors) if pid is not None)


def _intended(data: dict[str, Any]) -> bool:
    if data.get("pid") != "raylet":
        return False
    pids = {int(m) for line in data.get("lines", ()) for m in _WORKER_PID.findall(str(line))}
    return bool(pids) and pids <= INTENDED


@contextmanager
def quiet_intended_exits() -> Iterator[None]:
    """While the block runs, the driver prints no raylet alarm about an intended exit."""
    module: Any = ray._private.worker
    original = module.print_to_stdstream

    def printer(data: dict[str, Any], ignore_prefix: bool) -> None:
        if not _intended(data):
            original(data, ignore_prefix)

    module.print_to_stdstream = printer  # looked up by name at each message it prints
    try:
        yield
    finally:
        module.print_to_stdstream = original
        INTENDED.clear()
