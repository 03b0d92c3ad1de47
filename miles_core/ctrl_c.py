"""Ctrl-C before a command has set up its own handling: exit 130 at once, never a traceback;
and a Ctrl-C that Python dropped, found again.

A command's first seconds import torch, transformers or Ray; a KeyboardInterrupt raised
inside an import printed the whole import chain (42 lines) and exited 1. So each command's
``__main__`` calls ``exit_on_ctrl_c`` before it imports anything that takes time, and
``run_cli`` (miles_core/report/files.py) gives Ctrl-C back to Python (``ctrl_c_raises``)
just before the command's ``main`` runs, which handles it from there (a run stops whole, Ray
is shut down).

Python drops a KeyboardInterrupt raised inside a finalizer or a weakref callback: it prints
"Exception ignored in ..." and the code that was interrupted goes on. A garbage collection
runs such callbacks at its end, and one over a finished run's objects takes tenths of a
second, so a Ctrl-C that came during it was lost and the run went on to exit 0 (one of 20
random Ctrl-Cs, seen in CI). So the KeyboardInterrupts raised here are counted
(``ctrl_c_counted``), and a command asks ``lost_ctrl_c`` where it could not have missed one
that reached it: as a run begins, and before it exits 0 or 1. Only the standard library
here: it is in place from the first instant.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

INTERRUPTED_EXIT = 130
"""What a shell reports for a process Ctrl-C stopped (128 + SIGINT)."""

_SAID = b"\ninterrupted (Ctrl-C)\n"

_raised = 0
"""KeyboardInterrupts raised for a Ctrl-C so far (``raise_ctrl_c``)."""
_accounted = 0
"""How many of them ``lost_ctrl_c`` has answered for (or were raised before the command)."""


def _exit_at_once(signum: int, frame: object) -> None:
    """Nothing has started yet (no run, no process, no file): end here, with one line."""
    os.write(2, _SAID)
    os._exit(INTERRUPTED_EXIT)


def raise_ctrl_c(signum: int = signal.SIGINT, frame: object = None) -> None:
    """Python's own handler (raise KeyboardInterrupt), counted for ``lost_ctrl_c``."""
    global _raised
    _raised += 1
    raise KeyboardInterrupt


def exit_on_ctrl_c() -> None:
    """Until ``ctrl_c_raises``, Ctrl-C ends the process with 130. A process that ignores
    Ctrl-C (a shell's background job) goes on ignoring it."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _exit_at_once)


def ctrl_c_raises() -> None:
    """Ctrl-C raises KeyboardInterrupt (counted), where ``exit_on_ctrl_c`` had it end the
    process or Python's default raised it uncounted; any other handler is left as it is."""
    if signal.getsignal(signal.SIGINT) in (_exit_at_once, signal.default_int_handler):
        signal.signal(signal.SIGINT, raise_ctrl_c)


@contextmanager
def ctrl_c_counted() -> Iterator[None]:
    """A command's whole run: Ctrl-C raises KeyboardInterrupt as ``ctrl_c_raises`` has it,
    and what was raised before the block is not the command's. Python's handler is put back
    after; a command called from Python (a test) leaves the process as it found it."""
    global _accounted
    previous = signal.getsignal(signal.SIGINT)
    ctrl_c_raises()
    _accounted = _raised
    try:
        yield
    finally:
        _accounted = _raised  # what the command caught is its own: none is lost to the next
        if signal.getsignal(signal.SIGINT) is not previous:
            signal.signal(signal.SIGINT, previous)


def lost_ctrl_c() -> bool:
    """In ``ctrl_c_counted``'s block: a Ctrl-C raised KeyboardInterrupt since the block began
    (or this was last asked), and the asker is still running as if none had come, so Python
    dropped it (see the module's docstring). True once per such Ctrl-C: whoever asks acts on
    it. Asked only where no KeyboardInterrupt can have been caught and handled since the last
    asking. Outside the block nothing is counted, and it is False."""
    global _accounted
    lost = _raised > _accounted
    _accounted = _raised
    return lost


def exit_code(code: int) -> int:
    """A command's exit ``code``; 130 instead of 0 or 1 when a Ctrl-C came that Python dropped
    (``lost_ctrl_c``), said as a Ctrl-C is: the user asked the command to stop."""
    if code in (0, 1) and lost_ctrl_c():
        os.write(2, _SAID)
        return INTERRUPTED_EXIT
    return code


__all__ = [
    "INTERRUPTED_EXIT",
    "ctrl_c_counted",
    "ctrl_c_raises",
    "exit_code",
    "exit_on_ctrl_c",
    "lost_ctrl_c",
    "raise_ctrl_c",
]
