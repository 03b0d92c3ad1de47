"""One rank of the transfer bench, as the launcher starts it: ``python -m backends.bench.rank
RANK PORT`` (the config and the results travel through the launcher's TCPStore)."""

from __future__ import annotations

import signal
import sys

from backends.bench.launch import die_with_parent


def main(argv: list[str]) -> int:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's stop: end without a trace
    rank, port = int(argv[0]), int(argv[1])
    from backends.bench.worker import rank_main

    rank_main(rank, port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
