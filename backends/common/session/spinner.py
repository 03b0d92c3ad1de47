"""A line that says what a command waits for, with a spinner, while one blocking call runs.

Ray's start takes seconds (4 s on a 2-core machine, more under load) before the
first step or seed can show anything; without a word the command looks hung. On
a terminal the line spins and counts the seconds (tqdm, redrawn from a thread: the
call blocks the main one); on a pipe or a log, where a redrawn line would be noise,
it is printed once, and then how long the wait took.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

FRAMES = "|/-\\"
TICK = 0.1
"""Seconds between two frames."""


@contextmanager
def spinner(text: str, enabled: bool = True, file: TextIO | None = None) -> Iterator[None]:
    """``text`` on ``file`` (stderr) while the block runs: spinning on a terminal, else once
    and then the seconds it took; nothing when not ``enabled`` (``--json``)."""
    out = file if file is not None else sys.stderr
    if not enabled:
        yield
        return
    if not out.isatty():
        started = time.perf_counter()
        print(f"{text} ...", file=out, flush=True)
        yield
        print(f"{text}: done in {time.perf_counter() - started:.1f} s", file=out, flush=True)
        return
    bar = tqdm(desc=f"{FRAMES[0]} {text}", bar_format="{desc} {elapsed}", file=out, leave=False)
    stop = threading.Event()
    thread = threading.Thread(target=_spin, args=(bar, text, stop), name="spinner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.close()


def _spin(bar: tqdm, text: str, stop: threading.Event) -> None:
    frame = 0
    while not stop.wait(TICK):
        frame += 1
        bar.set_description_str(f"{FRAMES[frame % len(FRAMES)]} {text}")  # and the time so far
