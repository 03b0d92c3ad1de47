"""Linux futexes on shared memory: sleep until a word another process writes changes.

A waiter on a flag in shared memory could poll it, but on a machine with fewer
cores than processes (here: a trainer and four engines on two cores) every
poll takes a core from the process doing the copying. FUTEX_WAIT sleeps in the
kernel until a FUTEX_WAKE on the same word (of the same pages, in any process
that maps them) or a timeout, and returns at once if the word no longer holds
the value the waiter saw, so a wake between the look and the sleep is never
lost. x86-64 only (its syscall number): shm_group refuses other machines.
"""

from __future__ import annotations

import ctypes
import platform

SYS_FUTEX = {"x86_64": 202, "AMD64": 202}.get(platform.machine())
FUTEX_WAIT, FUTEX_WAKE = 0, 1
_WAKE_ALL = 2**31 - 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL around the call


def _word(value: int) -> ctypes.c_int32:
    """The low 32 bits of a little-endian int64 flag: the futex word at its address."""
    return ctypes.c_int32(value & 0xFFFFFFFF)


def wait(address: int, seen: int, seconds: float) -> None:
    """Sleep while the word at ``address`` still holds ``seen``, at most ``seconds``; a
    wake, a change, a signal or the timeout all return (the caller looks again)."""
    if SYS_FUTEX is None:
        raise OSError(f"no futex syscall number for {platform.machine()}")
    whole = int(seconds)
    timeout = _Timespec(whole, int((seconds - whole) * 1e9))
    _libc.syscall(
        SYS_FUTEX, ctypes.c_void_p(address), FUTEX_WAIT, _word(seen), ctypes.byref(timeout), None, 0
    )


def wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``."""
    if SYS_FUTEX is None:
        raise OSError(f"no futex syscall number for {platform.machine()}")
    _libc.syscall(SYS_FUTEX, ctypes.c_void_p(address), FUTEX_WAKE, _WAKE_ALL, None, None, 0)
