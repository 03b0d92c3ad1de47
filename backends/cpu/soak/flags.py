"""The soak command's flags, read before torch and Ray are imported (a wrong one is said at
once)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    soak = sub.add_parser("soak", help="train for minutes with drawn faults, judged and sampled")
    soak.add_argument("--minutes", type=float, required=True, help="about how long to train")
    soak.add_argument("--seed", type=int, default=0, help="draws the faults and the run")
    soak.add_argument("--out", type=Path, default=None, help="the figures as JSON")
    soak.add_argument(
        "--sample-seconds", type=float, default=3.0, help="seconds between two samples"
    )
