"""The ``run`` command's real-training flags, in miles' spelling: a checkpoint, prompt data,
a reward and the loss (``miles/utils/arguments.py``). Without ``--hf-checkpoint`` the run
trains the tiny policy on its own task, as before.

Everything is checked before Ray starts: the checkpoint is inspected (no weights loaded),
the prompt file read and tokenized, the reward resolved (a ``--custom-rm-path`` imported),
the loss flags validated (by LossConfig, which names each), the prompt file's lines and size
bounded and prompts longer than the engines take dropped (prompt_length.py); each error
names the flag as the user wrote it. Parsing them imports nothing heavy (run/flags.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from backends.common.training.prompt_data import MAX_BYTES, MAX_LINE_BYTES
from miles_core.errors import ConfigError

DEFAULT_LR = 1e-3
"""--lr for a checkpoint's policy: miles' 1e-6 suits a pretrained billion-parameter model,
not the small ones a CPU trains here (python -m backends.tasks make writes one)."""
LOSS_FLAGS = (
    "advantage_estimator",
    "eps_clip",
    "eps_clip_high",
    "kl_coef",
    "use_kl_loss",
    "kl_loss_coef",
    "kl_loss_type",
    "normalize_advantages",
)


def add_training_flags(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group("real training (miles' flags; without them: the tiny policy)")
    add = group.add_argument
    add("--hf-checkpoint", metavar="DIR", help="an HF Llama / Qwen2 / Qwen3 checkpoint")
    add("--prompt-data", metavar="FILE", help="JSONL prompts (needs --hf-checkpoint)")
    add("--input-key", default="input")
    add("--label-key", default=None)
    add("--metadata-key", default="metadata")
    add("--apply-chat-template", action="store_true")
    add("--rollout-shuffle", action="store_true", help="a fresh order each epoch")
    add("--rollout-seed", type=int, default=42)
    add("--num-epoch", type=int, default=None, help="sets --steps when it is not given")
    add("--rollout-max-response-len", type=int, default=16, help="max_new_tokens")
    add(
        "--rollout-max-prompt-len",
        type=int,
        default=None,
        help="drop longer prompts (default: those longer than the context less the response)",
    )
    add("--prompt-data-max-line-bytes", type=int, default=MAX_LINE_BYTES, metavar="BYTES")
    add("--prompt-data-max-bytes", type=int, default=MAX_BYTES, metavar="BYTES")
    add("--rm-type", default=None, help="math, deepscaler or dapo")
    add("--custom-rm-path", default=None, metavar="MODULE.FUNCTION")
    add("--reward-key", default=None, help="a dict reward's number (dapo: score)")
    add("--lr", type=float, default=DEFAULT_LR)
    add("--advantage-estimator", default="grpo", help="grpo, reinforce_plus_plus(_baseline)")
    add("--eps-clip", type=float, default=0.2)
    add("--eps-clip-high", type=float, default=None)
    add("--kl-coef", type=float, default=0.0)
    add("--use-kl-loss", action="store_true")
    add("--kl-loss-coef", type=float, default=0.0)
    add("--kl-loss-type", default="k1", help="k1, k2, k3 or low_var_kl")
    add("--normalize-advantages", action="store_true")


@dataclass(frozen=True)
class Training:
    """What the flags resolved to: the policy and task the run uses, the steps the data
    gives (--num-epoch), and the flags again for the replay line."""

    policy: Any
    task: Any
    steps: int | None
    argv: tuple[str, ...]


def training_from(args: argparse.Namespace, rollout_batch_size: int) -> Training | None:
    """None without --hf-checkpoint (and no data flag given without it)."""
    if args.hf_checkpoint is None:
        if args.prompt_data is not None:
            raise ConfigError(
                "--prompt-data", "needs a tokenizer and a model", "add --hf-checkpoint DIR"
            )
        return None
    if args.prompt_data is None:
        raise ConfigError("--hf-checkpoint", "has no prompts to train on", "add --prompt-data")
    from backends.common.training.hf_checkpoint import inspect_checkpoint
    from backends.common.training.loss_config import LossConfig
    from backends.common.training.policy import HFPolicy
    from backends.common.training.prompt_data import PromptFlags, load_prompts
    from backends.common.training.prompt_length import context_length, keep_fitting, prompt_bound
    from backends.common.training.rewards import resolve_reward
    from backends.common.training.task import DataTask

    info = inspect_checkpoint(args.hf_checkpoint)
    if not args.lr > 0:
        raise ConfigError("--lr", f"got {args.lr}", "pass a learning rate > 0")
    if args.rollout_max_response_len < 1:
        raise ConfigError(
            "--rollout-max-response-len", f"got {args.rollout_max_response_len}", "pass >= 1"
        )
    if args.num_epoch is not None and args.num_epoch < 1:
        raise ConfigError("--num-epoch", f"got {args.num_epoch}", "pass an integer >= 1")
    loss = LossConfig(**{k: getattr(args, k) for k in LOSS_FLAGS})
    rule = resolve_reward(args.rm_type, args.custom_rm_path, reward_key=args.reward_key)
    bound = prompt_bound(
        context_length(info.directory), args.rollout_max_response_len, args.rollout_max_prompt_len
    )
    flags = PromptFlags(
        args.prompt_data,
        args.input_key,
        args.label_key,
        args.metadata_key,
        args.apply_chat_template,
        args.prompt_data_max_line_bytes,
        args.prompt_data_max_bytes,
    )
    tokenizer = _tokenizer(info.directory)
    kept = keep_fitting(load_prompts(flags, tokenizer), tokenizer, bound)
    if kept.dropped:
        print(kept.note(), file=sys.stderr)
    prompts = kept.prompts
    task = DataTask(
        prompts, info.directory, rule, args.rollout_max_response_len, args.rollout_shuffle,
        args.rollout_seed,
    )  # fmt: skip
    steps = None
    if args.num_epoch is not None and args.steps is None:  # miles' num_rollout from epochs
        steps = max(1, args.num_epoch * len(prompts) // rollout_batch_size)
    return Training(HFPolicy(info.directory, args.lr, loss), task, steps, _argv(args))


def _tokenizer(directory: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError) as error:
        raise ConfigError(
            "--hf-checkpoint", f"its tokenizer does not load ({error})", "save one beside it"
        ) from error


def _argv(args: argparse.Namespace) -> tuple[str, ...]:
    """The training flags as given, for the replay line."""
    out: list[str] = []
    defaults = _defaults()
    for name, default in defaults.items():
        value = getattr(args, name)
        if value == default:
            continue
        flag = "--" + name.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return tuple(out)


def _defaults() -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_training_flags(parser)
    return vars(parser.parse_args([]))
