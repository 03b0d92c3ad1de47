"""python -m backends.cpu run [--steps K] [--scenario FILE|NAME] [--seed N] [--trace out.json]
[--json] [--metrics out.jsonl] [--address ADDR] [--save DIR] [--load DIR]
[miles' loop flags: --pause-generation-mode in_place, --use-fault-tolerance, ...]

The loop for real on a local Ray with virtual GPUs, on CPU: torch FSDP2 trainer
cells, SGLang-shaped HTTP engines, gloo weight transfer. Everything it runs lives
in backends/common (the GPU backend runs the same code with its own Stack); see
backends/common/run/command.py for the output and exit codes.
"""

from __future__ import annotations

from backends.common.run.command import main
from miles_core.report import exit_cli

if __name__ == "__main__":
    exit_cli(main)
