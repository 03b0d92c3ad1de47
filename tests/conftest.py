"""Test-wide settings: hypothesis is derandomized under CI so a red run replays as is; and
SIGINT as a terminal has it, for the tests that send a Ctrl-C (``ctrl_c_as_in_a_terminal``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """SIGINT delivered, in this process and in the commands a test starts, as in a terminal's
    foreground job. A pytest started in the background (``bash .ci/run &``, nohup) inherits
    SIGINT ignored, Python keeps it so, and so would every command it starts: the Ctrl-C a
    test sends would never arrive. Python's handler here is reset to the default in a child
    at exec (an ignored signal stays ignored), so both see the Ctrl-C."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
