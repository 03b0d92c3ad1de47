"""The real-training flags as the run command takes them, the task the router asks, and the
trainer's loss on a data set's variable lengths (no Ray: the CLI refuses before it starts)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from backends.common.training.hf_checkpoint import write_random_checkpoint
from backends.common.training.losses import LossConfig, policy_loss_function
from backends.common.training.policy import HFPolicy, Trajectory, build_model
from backends.common.training.policy_loss import checkpoint_loss
from backends.common.training.prompt_data import PromptFlags, load_prompts
from backends.common.training.rewards import resolve_reward
from backends.common.training.task import DataTask

KILL_JOB = Path(__file__).parents[1] / "scenarios/files/kill_job_resumes_from_its_save.toml"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    write_random_checkpoint(folder, "llama", hidden_size=32, layers=1, heads=2, seed=3)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [f'{{"input": "{a}+{b}=", "label": "{a + b}"}}' for a in range(3) for b in range(2)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The CLI in this process (a refusal exits 2 before Ray is imported to start)."""
    from backends.cpu.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["run", *argv])
    return int(done.value.code or 0), capsys.readouterr().err


def test_bad_training_flags_are_refused_before_ray_starts(
    checkpoint: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = ("--hf-checkpoint", str(checkpoint), "--prompt-data", str(data), "--rm-type", "math")
    cases = [
        (("--prompt-data", str(data)), "--prompt-data: needs a tokenizer"),
        (("--hf-checkpoint", str(checkpoint)), "--hf-checkpoint: has no prompts"),
        (("--hf-checkpoint", str(data.parent), "--prompt-data", str(data)), "--hf-checkpoint"),
        (good[:4], "--rm-type"),
        ((*good, "--input-key", "question"), "--input-key"),
        ((*good, "--kl-coef", "0.1"), "--kl-coef"),
        ((*good, "--advantage-estimator", "ppo2"), "--advantage-estimator"),
        ((*good, "--kl-loss-type", "k9"), "--kl-loss-type"),
        (("--save-interval", "1"), "--save-interval: is 1 with nowhere to save"),
        (("--scenario", str(KILL_JOB), "--save", str(data.parent / "s")), "faults (kill_job)"),
    ]
    for argv, message in cases:
        code, err = _run(capsys, *argv)
        assert code == 2, (argv, err[-500:])
        assert message in err, (argv, err[-500:])
        assert "starting Ray" not in err  # refused before any work


def _task(checkpoint: Path, data: Path, shuffle: bool) -> DataTask:
    prompts = load_prompts(PromptFlags(str(data), "input", "label"))
    return DataTask(prompts, str(checkpoint), resolve_reward("math"), 8, shuffle, seed=7)


def test_a_prompts_number_is_its_row_in_every_epoch_order(checkpoint: Path, data: Path) -> None:
    plain, shuffled = _task(checkpoint, data, False), _task(checkpoint, data, True)
    rows = len(plain.prompts)
    assert [plain.row(i).row for i in range(2 * rows)] == [*range(rows), *range(rows)]
    first = [shuffled.row(i).row for i in range(rows)]
    second = [shuffled.row(i).row for i in range(rows, 2 * rows)]
    assert sorted(first) == sorted(second) == list(range(rows))  # each epoch every row once
    assert first != second  # a fresh order per epoch (seed 7 here)
    again = _task(checkpoint, data, True)  # another process: the same rows
    assert [again.row(i).row for i in range(2 * rows)] == first + second
    tokens = plain.prompt(1)
    assert plain.tokenizer.decode(tokens) == plain.row(1).text


def test_the_task_scores_the_decoded_response_with_the_rule(checkpoint: Path, data: Path) -> None:
    task = _task(checkpoint, data, False)
    label = task.row(3).label
    right = task.tokenizer(f"\\boxed{{{label}}}", add_special_tokens=False)["input_ids"]
    wrong = task.tokenizer(f"\\boxed{{{int(label) + 1}}}", add_special_tokens=False)["input_ids"]
    assert asyncio.run(task.score(3, task.prompt(3), right)) == 1.0
    assert asyncio.run(task.score(3, task.prompt(3), wrong)) == 0.0


def test_the_checkpoint_loss_masks_what_pads_a_response(checkpoint: Path) -> None:
    """Variable lengths: the loss equals miles' loss on each response alone (no pad leaks)."""
    policy = HFPolicy(str(checkpoint))
    model = build_model(policy)
    config = LossConfig()
    group = [
        Trajectory((5, 6, 7), (8, 9), 1.0),
        Trajectory((5, 6, 7), (8,), 0.0),
        Trajectory((5, 6, 7), (9, 9, 9), 0.0),
    ]
    loss, _ = checkpoint_loss(model, [group], config)
    logps = []
    for t in group:  # one response at a time: nothing to pad
        ids = torch.tensor([[*t.prompt, *t.response]])
        logits = model(input_ids=ids[:, :-1]).logits[0, len(t.prompt) - 1 :]
        logps.append(torch.log_softmax(logits, -1).gather(-1, ids[0, len(t.prompt) :, None])[:, 0])
    rewards = torch.tensor([1.0, 0.0, 0.0])
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    advantages = [torch.full((len(lp),), float(a)) for lp, a in zip(logps, adv, strict=True)]
    masks = [torch.ones(len(lp)) for lp in logps]
    expected, _ = policy_loss_function(config, logps, logps, advantages, masks)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    same = [Trajectory(t.prompt, t.response, 1.0) for t in group]  # a group that teaches nothing
    flat, _ = checkpoint_loss(model, [same], config)
    assert float(flat) == pytest.approx(0.0, abs=1e-7)


def test_parsing_the_run_flags_imports_neither_torch_nor_ray() -> None:
    """A wrong command fails at once: the flags' module pulls in no heavy import."""
    import subprocess
    import sys

    code = "import sys, backends.common.run.flags\n"
    code += "print('torch' in sys.modules, 'ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr
