"""The generated arithmetic task: its data, its CLI, and the proof that the real-training
blocks learn it (backends/tasks/arith_task.py, local_grpo.py, backends/tasks)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from backends.common.training.hf_checkpoint import load_checkpoint
from backends.common.training.prompt_data import PromptFlags, load_prompts
from backends.tasks.__main__ import main
from backends.tasks.arith_task import make_rows, write_task
from backends.tasks.learn import evaluate, flags, learn
from backends.tasks.spec import LEARNING_SPEC, LEARNING_STEPS, ArithSpec, tuned
from miles_core.errors import ConfigError


def _sum(text: str) -> int:
    a, b = text.rstrip("=").split("+")
    return int(a) + int(b)


def test_rows_are_sums_balanced_by_answer_and_fixed_by_the_seed() -> None:
    spec = ArithSpec(max_operand=3, prompts=2100, seed=4)
    train, test = make_rows(spec)
    assert make_rows(spec) == (train, test)
    assert make_rows(ArithSpec(max_operand=3, prompts=2100, seed=5))[0] != train
    assert all(int(r["label"]) == _sum(r["input"]) for r in train + test)
    operands = {int(x) for r in train for x in r["input"].rstrip("=").split("+")}
    assert operands == set(range(4))
    counts = Counter(r["label"] for r in train)
    assert sorted(counts) == sorted(str(s) for s in range(7))
    assert max(counts.values()) < 1.25 * min(counts.values())  # no answer beats chance
    assert sorted(r["input"] for r in test) == sorted(
        f"{a}+{b}=" for a in range(4) for b in range(4)
    )


def test_make_writes_a_checkpoint_and_miles_jsonl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "task"
    argv = ["make", "--out", str(out), "--arch", "qwen3", "--prompts", "40", "--max-operand", "4"]
    assert main([*argv, "--hidden-size", "16", "--warmup-steps", "2"]) == 0
    assert "--prompt-data" in capsys.readouterr().out
    _, tokenizer, info = load_checkpoint(out / "checkpoint")
    assert info.arch == "qwen3" and info.hidden_size == 16
    prompts = load_prompts(PromptFlags(str(out / "train.jsonl"), "input", "label"), tokenizer)
    assert len(prompts) == 40 and all(int(p.label) == _sum(p.text) for p in prompts)
    rows = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 25 and all(set(r) == {"input", "label"} for r in rows)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-operand", "0"], "--max-operand"),
        (["--prompts", "0"], "--prompts"),
        (["--warmup-steps", "-1"], "--warmup-steps"),
        (["--hidden-size", "30"], "--hidden-size"),
    ],
)
def test_make_refuses_bad_flags_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["make", "--out", str(tmp_path / "task"), *argv])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "task" / "train.jsonl").exists()


def test_spec_errors_name_the_flag() -> None:
    with pytest.raises(ConfigError) as error:
        ArithSpec(layers=0)
    assert error.value.field == "--layers"


@pytest.fixture
def one_thread() -> object:
    """Tiny models run fastest on one thread (and do not fight pytest-xdist workers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_grpo_with_the_math_reward_learns_the_sums(tmp_path: Path, one_thread: object) -> None:
    """From the generated checkpoint (format only: chance accuracy), GRPO with the math
    reward raises the reward and the greedy test accuracy; balanced answers make any rise
    a rise in reading the operands, not in guessing a frequent sum.

    Checked by hand with these settings on seeds 1 to 6 (one thread, 26 to 28 s each):
    mean reward over the first 10 steps 0.195 to 0.213, over the last 10 0.75 to 0.98;
    greedy test accuracy 0.11 to 0.33 before, 0.78 to 1.00 after."""
    write_task(tmp_path, LEARNING_SPEC)
    model, tokenizer, _ = load_checkpoint(tmp_path / "checkpoint")
    test = load_prompts(flags(tmp_path, "test.jsonl", False), tokenizer)
    chance = 1 / len(LEARNING_SPEC.answers())
    before = evaluate(model, tokenizer, test)
    settings, config = tuned(LEARNING_SPEC.seed)
    results, model, tokenizer = learn(tmp_path, LEARNING_STEPS, settings, config)
    rewards = [r.mean_reward for r in results]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    after = evaluate(model, tokenizer, test)
    assert first < 2 * chance, f"the warm-up leaked the sums: {first:.2f}"
    assert last > first + 0.25, f"reward {first:.2f} -> {last:.2f}"
    assert after > max(before, chance) + 0.3, f"test accuracy {before:.2f} -> {after:.2f}"
