"""Ctrl-C before a command has set up its own handling: exit 130 at once, never a traceback.

A command's first seconds import torch, transformers or Ray; a KeyboardInterrupt raised
inside an import printed the whole import chain (42 lines) and exited 1. So each command's
``__main__`` calls ``exit_on_ctrl_c`` before it imports anything that takes time, and
``run_cli`` (miles_core/report/files.py) gives Ctrl-C back to Python (``ctrl_c_raises``)
just before the command's ``main`` runs, which handles it from there (a run stops whole, Ray
is shut down). Only the standard library here: it is in place from the first instant.
"""

from __future__ import annotations

import os
import signal

INTERRUPTED_EXIT = 130
"""What a shell reports for a process Ctrl-C stopped (128 + SIGINT)."""

_SAID = b"\ninterrupted (Ctrl-C)\n"


def _exit_at_once(signum: int, frame: object) -> None:
    """Nothing has started yet (no run, no process, no file): end here, with one line."""
    os.write(2, _SAID)
    os._exit(INTERRUPTED_EXIT)


def exit_on_ctrl_c() -> None:
    """Until ``ctrl_c_raises``, Ctrl-C ends the process with 130. A process that ignores
    Ctrl-C (a shell's background job) goes on ignoring it."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _exit_at_once)


def ctrl_c_raises() -> None:
    """Ctrl-C raises KeyboardInterrupt again (Python's default), where ``exit_on_ctrl_c``
    had it end the process; any other handler is left as it is."""
    if signal.getsignal(signal.SIGINT) is _exit_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


__all__ = ["INTERRUPTED_EXIT", "ctrl_c_raises", "exit_on_ctrl_c"]
