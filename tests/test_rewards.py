"""Rule-based rewards (--rm-type math / deepscaler / dapo) on concrete right and wrong
answers, and --custom-rm-path loaded and called as miles does
(backends/common/training/rewards.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from backends.common.training.rewards import (
    RewardSample,
    dapo_reward,
    deepscaler_reward,
    math_reward,
    resolve_reward,
)
from miles_core.errors import ConfigError


@pytest.mark.parametrize(
    ("response", "label"),
    [
        ("\\boxed{7}", "7"),
        ("3 plus 4 is \\boxed{7}.", 7),
        ("\\boxed{7.0}", "7"),
        ("\\boxed{ 7 }", "7"),
        ("first \\boxed{3}, then \\boxed{7}", "7"),  # the last box is the answer
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{1/2}", "\\frac{1}{2}"),
        ("\\boxed{1,000}", "1000"),
        ("\\boxed{-3}", "-3"),
        ("\\boxed{\\text{east}}", "east"),
        ("\\boxed{7}", "\\boxed{7}"),  # a boxed label is unboxed
        ("\\boxed{x^2+1}", "x^2 + 1"),
    ],
)
def test_math_reward_accepts_a_right_answer(response: str, label: object) -> None:
    assert math_reward(response, label) == 1


@pytest.mark.parametrize(
    ("response", "label"),
    [
        ("\\boxed{8}", "7"),
        ("7", "7"),  # no box: miles' math reads only \boxed{}
        ("Answer: 7", "7"),
        ("\\boxed{7", "7"),  # never closed
        ("\\boxed{7} then \\boxed{8}", "7"),
        ("\\boxed{}", "7"),
        ("\\boxed{7}", ""),  # no ground truth scores nothing
        ("\\boxed{7}", None),
        ("\\boxed{1/0}", "1"),
        ("\\boxed{71}", "7"),
    ],
)
def test_math_reward_rejects_a_wrong_answer(response: str, label: object) -> None:
    assert math_reward(response, label) == 0


def test_deepscaler_grades_only_after_the_reasoning() -> None:
    assert deepscaler_reward("<think>maybe \\boxed{8}</think> so \\boxed{7}", "7") == 1
    assert deepscaler_reward("<think>\\boxed{7}</think> \\boxed{8}", "7") == 0
    assert deepscaler_reward("###Response \\boxed{7}", "7") == 1
    assert deepscaler_reward("\\boxed{7}", "7") == 0  # no reasoning marker


def test_dapo_reads_the_last_answer_line_and_scores_plus_minus_one() -> None:
    assert dapo_reward("work...\nAnswer: 7", "7") == {"score": 1.0, "acc": True, "pred": "7"}
    assert dapo_reward("Answer: 3\nanswer : 42", "42.0")["score"] == 1.0
    assert dapo_reward("Answer: x = 12", "12")["acc"] is True
    wrong = dapo_reward("Answer: 8", "7")
    assert wrong["score"] == -1.0 and wrong["acc"] is False
    assert dapo_reward("no answer here", "7")["pred"] == "[INVALID]"
    with pytest.raises(ConfigError) as error:
        dapo_reward("Answer: east", "east")
    assert error.value.field == "--rm-type"


def _samples(*pairs: tuple[str, object]) -> list[RewardSample]:
    return [RewardSample("q", response, label, {}, i) for i, (response, label) in enumerate(pairs)]


def test_resolved_rule_scores_a_batch_and_dicts_need_reward_key() -> None:
    batch = _samples(("\\boxed{4}", "4"), ("\\boxed{5}", "4"))
    assert resolve_reward("math").score_sync(None, batch) == [1.0, 0.0]
    dapo = _samples(("Answer: 4", "4"), ("Answer: 5", "4"))
    assert resolve_reward("dapo", reward_key="score").score_sync(None, dapo) == [1.0, -1.0]
    for key in (None, "reward"):  # refused when resolved, before any rollout
        with pytest.raises(ConfigError) as error:
            resolve_reward("dapo", reward_key=key)
        assert error.value.field == "--reward-key"
    rule = resolve_reward("math")
    with pytest.raises(ConfigError) as error:
        rule.value({"score": 1.0})  # a dict from a custom function needs --reward-key
    assert error.value.field == "--reward-key"


@pytest.mark.parametrize("rm_type", [None, "", "f1", "remote_rm", "boxed_math"])
def test_unknown_rm_type_names_the_flag(rm_type: str | None) -> None:
    with pytest.raises(ConfigError) as error:
        resolve_reward(rm_type)
    assert error.value.field == "--rm-type"
    assert "math" in error.value.fix


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A reward module on sys.path, as a user's --custom-rm-path module is."""
    name = f"user_rm_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            CALLS = []
            NOT_CALLABLE = 3

            async def reward(args, sample):
                CALLS.append((args, sample.index))
                return 2.0 if sample.response == sample.label else -1.0

            async def group(args, samples):
                CALLS.append((args, [s.index for s in samples]))
                return [float(len(s.response)) for s in samples]

            async def short_group(args, samples):
                return [1.0]

            def plain(args, sample):
                return 1.0
            """
        )
    )
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_custom_reward_is_awaited_per_sample_with_args(user_module: str) -> None:
    reward = resolve_reward("math", custom_rm_path=f"{user_module}.reward")  # custom wins
    args = object()
    assert reward.score_sync(args, _samples(("a", "a"), ("b", "c"))) == [2.0, -1.0]
    calls = __import__(user_module).CALLS
    assert sorted(index for _, index in calls) == [0, 1]
    assert all(a is args for a, _ in calls)


def test_custom_group_reward_gets_the_whole_group(user_module: str) -> None:
    reward = resolve_reward(None, custom_rm_path=f"{user_module}.group", group_rm=True)
    assert reward.score_sync("args", _samples(("ab", ""), ("abcd", ""))) == [2.0, 4.0]
    assert __import__(user_module).CALLS == [("args", [0, 1])]
    short = resolve_reward(None, custom_rm_path=f"{user_module}.short_group", group_rm=True)
    with pytest.raises(ValueError, match="list of 2"):
        short.score_sync(None, _samples(("a", ""), ("b", "")))


@pytest.mark.parametrize(
    ("suffix", "problem"),
    [
        ("nope", "is not module.function"),
        ("_missing_module.reward", "does not import"),
        ("_broken.reward", "RuntimeError: boom"),
        (".absent", "has no 'absent'"),
        (".NOT_CALLABLE", "not callable"),
        (".plain", "not async"),
    ],
)
def test_bad_custom_rm_path_names_the_flag(user_module: str, suffix: str, problem: str) -> None:
    path = "nope" if suffix == "nope" else user_module + suffix
    with pytest.raises(ConfigError) as error:
        resolve_reward("math", custom_rm_path=path)
    assert error.value.field == "--custom-rm-path"
    assert problem in error.value.problem
