"""``python -m sim judge-joined A.jsonl B.jsonl ...``: the histories of a job killed as a whole
and resumed (each run's ``--history``, in order), joined as the simulator joins a killed
job's segments, and judged by every oracle.

A history written by a real run killed with SIGKILL ends where the kill found it (the
backends write each event as it is recorded); the join puts a ``JobKilled`` after every
history but the last, at that history's last instant, and shifts each later history's
clock to begin there (each process counted from its own start). The resumed run's own
``JobResumed`` says which save it loaded; the ``resume`` oracle holds it to the saves the
killed run committed, and ``exactly_once`` to every prompt across the kill.

A run that ended by itself and was then continued from its save (``--load``, more steps)
joins the same way: its processes all exited, which the join records (a ``JobKilled``
that says so), and ``end_state`` holds each run to its own ending.

Exit codes: 0 every oracle passed, 1 one failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from miles_core.errors import ConfigError
from miles_core.events import Event, History, JobKilled, RunEnded, event_from_dict
from miles_core.oracles import check_all
from miles_core.user_files import HISTORY_BYTES, read_user_text

KILLED = "every process of the job killed (SIGKILL)"


def read_history(path: Path, flag: str = "history") -> list[Event]:
    """A --history file's events; a torn last line (the kill came mid-write) is dropped."""
    lines = read_user_text(path, flag, HISTORY_BYTES, "a --history file").splitlines()
    events = []
    for number, line in enumerate(lines, 1):
        try:
            events.append(event_from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            if number == len(lines):  # the kill landed while the line was being written
                break
            raise ConfigError(
                flag, f"{path}:{number} is not an event ({error})", "pass a --history file"
            ) from None
    if not events:
        raise ConfigError(flag, f"{path} holds no event", "pass the history a run wrote")
    return events


def _shifted(event: Event, by: float) -> Event:
    row = event.to_dict()
    row["t"] = event.t + by
    return event_from_dict(row)


def _gone(events: Sequence[Event]) -> str:
    """How the run of ``events`` left the job: killed, or ended by itself and exited."""
    ended = next((e for e in events if isinstance(e, RunEnded)), None)
    if ended is None:
        return KILLED
    return f"every process of the job exited after the run ended ({ended.status.value})"


def join(segments: Sequence[Sequence[Event]]) -> History:
    """One history: each segment after a JobKilled at the previous one's last instant."""
    history, offset = History(), 0.0
    for i, events in enumerate(segments):
        for event in events:
            history.append(_shifted(event, offset) if offset else event)
        if i < len(segments) - 1:
            end = history[len(history) - 1].t
            history.append(JobKilled(t=end, reason=_gone(events)))
            offset = end - segments[i + 1][0].t
    return history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim judge-joined", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("histories", nargs="+", type=Path, help="the --history files, in order")
    parser.add_argument("--progress-window", type=float, default=600.0, help="seconds (progress)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.progress_window <= 0:
            raise ConfigError(
                "--progress-window", f"got {args.progress_window}", "pass seconds > 0"
            )
        joined = join([read_history(p, "histories") for p in args.histories])
    except ConfigError as error:
        parser.error(str(error))
    verdicts = check_all(joined, args.progress_window)
    failed = {name: str(v) for name, v in verdicts.items() if v is not None}
    if args.json:
        print(
            json.dumps({"events": len(joined), "kills": len(args.histories) - 1, "failed": failed})
        )
    else:
        print(f"{len(joined)} events, {len(args.histories) - 1} kill(s) joined")
        for name, violation in verdicts.items():
            print(f"  oracle {name:20s} {'pass' if violation is None else 'FAIL'}")
        for text in failed.values():
            print(text, file=sys.stderr)
    return 1 if failed else 0
