"""python -m backends.gpu run [--trainer megatron|fsdp] [--tp N] [--engine sglang|local]
[--transport nccl|ipc] [--device cuda|cpu] [the run flags both backends share, the
training flags and miles' loop flags]

python -m backends.gpu devcheck --out DIR

``run``: the same loop, summary, trace and oracles as ``python -m backends.cpu run``
(backends/common), with Megatron-core or FSDP2 trainers, SGLang or local engines,
and NCCL or CUDA-IPC weight transfer (this backend's own flags and Stack: stack.py).
``--device cpu`` runs this backend's own code end to end on CPU: Megatron over gloo,
local engines, gloo standing in for NCCL and shared files for CUDA IPC. ``devcheck``:
what a GPU host can do, as one JSON report.
"""

from __future__ import annotations

from pathlib import Path

from miles_core.ctrl_c import exit_on_ctrl_c


def main(argv: list[str] | None = None) -> int:
    from backends.common.run.flags import build_parser
    from backends.gpu.stack import GPU, check_device
    from miles_core.errors import ConfigError

    parser, sub = build_parser(GPU)
    check = sub.add_parser("devcheck", help="the device check: one JSON report of a GPU host")
    check.add_argument("--out", required=True, help="the report's folder (devcheck.json)")
    check.add_argument("--budget", type=float, default=450.0, help="seconds in all (default 450)")
    args = parser.parse_args(argv)
    try:
        if args.command == "devcheck":
            from backends.gpu.devcheck import run_devcheck

            code, _ = run_devcheck(Path(args.out), budget_s=args.budget)
            return code
        check_device(args.device)  # before Ray, torch.distributed and Megatron are imported
        from backends.common.run.command import run_command

        return run_command(args, GPU)
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits


if __name__ == "__main__":
    exit_on_ctrl_c()  # before the imports below: a Ctrl-C in them exits 130, no traceback
    from miles_core.report import exit_cli

    exit_cli(main)
