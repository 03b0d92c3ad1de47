"""python -m backends.cpu run [--steps K] [--scenario FILE|NAME] [--seed N] [--trace out.json]
[--json] [--metrics out.jsonl] [--address ADDR] [--save DIR] [--load DIR]
[miles' loop flags: --pause-generation-mode in_place, --use-fault-tolerance, ...]
python -m backends.cpu soak --minutes N [--seed S] [--out FILE.json] (see backends/cpu/soak)

The loop for real on a local Ray with virtual GPUs, on CPU: torch FSDP2 trainer
cells, SGLang-shaped HTTP engines, gloo weight transfer. Everything it runs lives
in backends/common (the GPU backend runs the same code with its own Stack); this
backend's own flag and Stack are in stack.py. See backends/common/run/command.py for
the output and exit codes.
"""

from __future__ import annotations

from miles_core.ctrl_c import exit_on_ctrl_c


def main(argv: list[str] | None = None) -> int:
    """torch FSDP2 trainer cells, local HTTP engines, gloo (or shared memory), on CPU. The
    flags are read before torch and Ray are imported (4 s): a wrong one is said at once."""
    from backends.common.run.flags import build_parser
    from backends.cpu.soak.flags import add_parser
    from backends.cpu.stack import CPU
    from miles_core.errors import ConfigError

    parser, sub = build_parser(CPU)
    add_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "soak":
            from backends.cpu.soak.command import run_soak

            return run_soak(args)
        from backends.common.run.command import run_command

        return run_command(args, CPU)
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits


if __name__ == "__main__":
    exit_on_ctrl_c()  # before the imports below: a Ctrl-C in them exits 130, no traceback
    from miles_core.report import exit_cli

    exit_cli(main)
