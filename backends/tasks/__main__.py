"""python -m backends.tasks make --out DIR [--arch llama|qwen2|qwen3] [--prompts N] [--seed S]
[--max-operand M] [--hidden-size H] [--layers L] [--heads A] [--warmup-steps W]

python -m backends.tasks learn --task DIR [--steps K] [--seed S] [--lr LR] ...

``make`` writes a task a small model learns on CPU (``backends/tasks/arith_task.py``):
DIR/checkpoint (an HF checkpoint with its tokenizer), DIR/train.jsonl and
DIR/test.jsonl (miles' JSONL: ``--input-key input --label-key label``, reward
``--rm-type math``). ``learn`` trains it with GRPO in this process (no Ray) and prints
the mean reward per step and the greedy test accuracy before and after: the check that
the task, the reward and the loss learn together.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from miles_core.ctrl_c import exit_on_ctrl_c

if TYPE_CHECKING:
    from backends.common.training.local_grpo import StepResult


def _parser() -> argparse.ArgumentParser:
    """The flags, whose defaults and choices come from modules without torch (spec,
    loss_config, architectures), so a wrong flag is said before anything heavy loads."""
    from backends.common.training.architectures import ARCHITECTURE_NAMES
    from backends.common.training.loss_config import KL_TYPES
    from backends.tasks.spec import LEARNING_STEPS, ArithSpec, tuned

    parser = argparse.ArgumentParser(
        prog="python -m backends.tasks", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads, 1 to the CPUs (1 is fastest here)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make", help="write DIR/checkpoint, DIR/train.jsonl, DIR/test.jsonl")
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("--arch", choices=ARCHITECTURE_NAMES, default="llama")
    spec = ArithSpec()
    make.add_argument("--prompts", type=int, default=spec.prompts, help="rows of train.jsonl")
    make.add_argument("--seed", type=int, default=spec.seed)
    make.add_argument("--max-operand", type=int, default=spec.max_operand)
    make.add_argument("--hidden-size", type=int, default=spec.hidden_size)
    make.add_argument("--layers", type=int, default=spec.layers)
    make.add_argument("--heads", type=int, default=spec.heads)
    make.add_argument("--warmup-steps", type=int, default=spec.warmup_steps, help="format warm-up")
    run = commands.add_parser("learn", help="GRPO on DIR in this process; reward per step")
    run.add_argument("--task", type=Path, required=True)
    run.add_argument("--steps", type=int, default=LEARNING_STEPS)
    settings, loss = tuned(0)
    run.add_argument("--seed", type=int, default=settings.seed)
    run.add_argument("--lr", type=float, default=settings.lr)
    run.add_argument("--optimizer", choices=("adam", "sgd"), default=settings.optimizer)
    run.add_argument("--rollout-batch-size", type=int, default=settings.rollout_batch_size)
    run.add_argument("--n-samples-per-prompt", type=int, default=settings.n_samples_per_prompt)
    run.add_argument("--eps-clip", type=float, default=loss.eps_clip)
    run.add_argument(
        "--use-kl-loss", action=argparse.BooleanOptionalAction, default=loss.use_kl_loss
    )
    run.add_argument("--kl-loss-coef", type=float, default=loss.kl_loss_coef)
    run.add_argument("--kl-loss-type", choices=KL_TYPES, default=loss.kl_loss_type)
    run.add_argument("--apply-chat-template", action="store_true")
    return parser


def _make(args: argparse.Namespace) -> int:
    from backends.tasks.arith_task import write_task
    from backends.tasks.spec import ArithSpec
    from miles_core.errors import ConfigError

    spec = ArithSpec(
        max_operand=args.max_operand,
        prompts=args.prompts,
        seed=args.seed,
        arch=args.arch,
        hidden_size=args.hidden_size,
        layers=args.layers,
        heads=args.heads,
        warmup_steps=args.warmup_steps,
    )
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(
            "--out", f"{str(args.out)!r} is a file", "pass a directory (made if missing)"
        )
    start = time.monotonic()
    info = write_task(args.out, spec)
    print(
        f"wrote {args.out}/checkpoint ({info.arch}, {info.param_count:,} parameters, "
        f"vocab {info.vocab_size}), train.jsonl ({spec.prompts} rows), test.jsonl "
        f"in {time.monotonic() - start:.1f} s\n"
        f"train with: --hf-checkpoint {args.out}/checkpoint --prompt-data {args.out}/train.jsonl "
        "--input-key input --label-key label --rm-type math"
    )
    return 0


def _learn(args: argparse.Namespace) -> int:
    from backends.common.training.grpo_settings import GrpoSettings
    from backends.common.training.hf_checkpoint import load_checkpoint
    from backends.common.training.loss_config import LossConfig
    from backends.common.training.prompt_data import load_prompts
    from backends.tasks.learn import evaluate, flags, learn
    from backends.tasks.spec import MAX_LEARN_STEPS
    from miles_core.errors import ConfigError

    if not 1 <= args.steps <= MAX_LEARN_STEPS:
        raise ConfigError(
            "--steps", f"got {args.steps}", f"pass an integer from 1 to {MAX_LEARN_STEPS} (fixed)"
        )
    settings = GrpoSettings(
        rollout_batch_size=args.rollout_batch_size,
        n_samples_per_prompt=args.n_samples_per_prompt,
        lr=args.lr,
        optimizer=args.optimizer,
        seed=args.seed,
    )
    config = LossConfig(
        eps_clip=args.eps_clip,
        use_kl_loss=args.use_kl_loss,
        kl_loss_coef=args.kl_loss_coef if args.use_kl_loss else 0.0,
        kl_loss_type=args.kl_loss_type,
    )
    model, tokenizer, _ = load_checkpoint(args.task / "checkpoint")
    test = load_prompts(flags(args.task, "test.jsonl", args.apply_chat_template), tokenizer)
    print(f"test accuracy before: {evaluate(model, tokenizer, test):.3f}")

    def report(result: StepResult) -> None:
        print(f"step {result.step:4d}  reward {result.mean_reward:.3f}  loss {result.loss:+.4f}")

    start = time.monotonic()
    _, model, tokenizer = learn(
        args.task, args.steps, settings, config, args.apply_chat_template, report
    )
    seconds = time.monotonic() - start
    print(f"test accuracy after:  {evaluate(model, tokenizer, test):.3f}  ({seconds:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    from miles_core.errors import ConfigError

    parser = _parser()
    args = parser.parse_args(argv)  # a wrong flag is said here, before torch loads
    cpus = os.cpu_count() or 1
    if not 1 <= args.threads <= cpus:  # torch starts a thread for each: 1e5 ends the machine
        parser.error(f"--threads: got {args.threads}; pass an integer from 1 to {cpus}, the CPUs")
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()  # this process's output is the steps' lines
    try:
        return _make(args) if args.command == "make" else _learn(args)
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits


if __name__ == "__main__":
    exit_on_ctrl_c()  # before torch and transformers: a Ctrl-C then exits 130, no traceback
    from miles_core.report import exit_cli

    exit_cli(lambda: main(sys.argv[1:]))
