"""--prompt-data read with miles' keys, and the resumable order prompts are handed out in
(backends/common/training/prompt_data.py, prompt_source.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.common.training.char_tokenizer import build_tokenizer
from backends.common.training.prompt_data import Prompt, PromptFlags, load_prompts
from backends.common.training.prompt_source import (
    DataCursor,
    DataExhaustedError,
    Drawn,
    PromptSource,
)
from miles_core.errors import ConfigError


def write(tmp_path: Path, lines: list[str], name: str = "data.jsonl") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def rows(*objects: object) -> list[str]:
    return [json.dumps(o) for o in objects]


def test_rows_are_read_with_miles_keys(tmp_path: Path) -> None:
    lines = rows(
        {"q": "1+1=", "a": "2", "meta": {"level": 1}},
        {"q": "2+2=", "a": 4, "meta": None},
    )
    path = write(tmp_path, [lines[0], "", "   ", lines[1]])
    prompts = load_prompts(PromptFlags(path, input_key="q", label_key="a", metadata_key="meta"))
    assert [p.text for p in prompts] == ["1+1=", "2+2="]
    assert [p.label for p in prompts] == ["2", 4]
    assert [p.metadata for p in prompts] == [{"level": 1}, {}]
    assert [(p.row, p.line) for p in prompts] == [(0, 1), (1, 4)]  # blank lines skipped
    unlabelled = load_prompts(PromptFlags(path, input_key="q"))
    assert all(p.label is None for p in unlabelled)


def test_a_path_slice_takes_rows_as_miles_does(tmp_path: Path) -> None:
    path = write(tmp_path, rows(*({"input": str(i)} for i in range(6))))
    assert [p.text for p in load_prompts(PromptFlags(f"{path}@[1:3]"))] == ["1", "2"]
    assert [p.text for p in load_prompts(PromptFlags(f"{path}@[4:]"))] == ["4", "5"]


def test_chat_template_wraps_a_string_and_renders_messages(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "2+2="}]
    path = write(tmp_path, rows({"input": "3+4="}, {"input": messages}))
    tokenizer = build_tokenizer()
    texts = [p.text for p in load_prompts(PromptFlags(path, apply_chat_template=True), tokenizer)]
    assert texts == [
        "<|user|>3+4=<|end|><|assistant|>",
        "<|system|>add<|end|><|user|>2+2=<|end|><|assistant|>",
    ]


@pytest.mark.parametrize(
    ("lines", "flags", "field", "line"),
    [
        (['{"input": "a"}', "{not json"], {}, "--prompt-data", 2),
        (['{"input": "a"}', "[1, 2]"], {}, "--prompt-data", 2),
        (['{"input": "a"}', '{"text": "b"}'], {}, "--input-key", 2),
        (
            ['{"input": "a", "label": 1}', '{"input": "b"}'],
            {"label_key": "label"},
            "--label-key",
            2,
        ),
        (['{"input": "a", "metadata": [1]}'], {}, "--metadata-key", 1),
        (['{"input": [{"role": "user", "content": "x"}]}'], {}, "--input-key", 1),
        (['{"input": "a"}', "", '{"input": 3}'], {"apply_chat_template": True}, "--input-key", 3),
    ],
)
def test_a_bad_line_names_the_flag_and_the_line(
    tmp_path: Path, lines: list[str], flags: dict[str, object], field: str, line: int
) -> None:
    path = write(tmp_path, lines)
    with pytest.raises(ConfigError) as error:
        load_prompts(PromptFlags(path, **flags), build_tokenizer())  # type: ignore[arg-type]
    assert error.value.field == field
    assert f"line {line}" in error.value.problem


def test_missing_empty_or_unreadable_files_are_refused(tmp_path: Path) -> None:
    empty = write(tmp_path, ["", "  "])
    cases = [
        (PromptFlags(empty), "no prompts"),
        (PromptFlags(str(tmp_path / "absent.jsonl")), "does not exist"),
        (PromptFlags(write(tmp_path, ["{}"], "data.parquet")), "not a .jsonl"),
        (PromptFlags(write(tmp_path, rows({"input": "a"}), "one.jsonl") + "@[5:]"), "no prompts"),
    ]
    for flags, problem in cases:
        with pytest.raises(ConfigError) as error:
            load_prompts(flags)
        assert error.value.field == "--prompt-data" and problem in error.value.problem
    with pytest.raises(ConfigError) as error:
        load_prompts(PromptFlags(str(tmp_path / "one.jsonl"), apply_chat_template=True))
    assert error.value.field == "--apply-chat-template"


def prompts_of(size: int) -> tuple[Prompt, ...]:
    return tuple(Prompt(row=i, line=i + 1, text=f"p{i}", label=str(i)) for i in range(size))


def rows_of(drawn: list[Drawn]) -> list[int]:
    return [d.prompt.row for d in drawn]


def test_without_shuffle_the_order_is_the_file_order_every_epoch() -> None:
    source = PromptSource(prompts_of(3))
    drawn = source.take(4) + source.take(3)
    assert rows_of(drawn) == [0, 1, 2, 0, 1, 2, 0]
    assert [d.index for d in drawn] == list(range(7))
    assert [d.epoch for d in drawn] == [0, 0, 0, 1, 1, 1, 2]


def test_shuffle_gives_each_epoch_a_permutation_fixed_by_the_seed() -> None:
    size = 20
    epochs = [rows_of(PromptSource(prompts_of(size), shuffle=True, seed=7).take(3 * size))]
    epochs.append(rows_of(PromptSource(prompts_of(size), shuffle=True, seed=7).take(3 * size)))
    assert epochs[0] == epochs[1]  # the same seed, the same order
    chunks = [epochs[0][i * size : (i + 1) * size] for i in range(3)]
    assert all(sorted(chunk) == list(range(size)) for chunk in chunks)
    assert chunks[0] != chunks[1] and chunks[0] != list(range(size))
    other = rows_of(PromptSource(prompts_of(size), shuffle=True, seed=8).take(size))
    assert other != chunks[0]


def test_an_epoch_turns_only_when_a_prompt_of_the_next_is_asked_for() -> None:
    source = PromptSource(prompts_of(3), num_epoch=2)
    source.take(3)
    assert (source.cursor.epoch, source.cursor.offset) == (0, 3)  # as miles' sample_offset
    source.take(1)
    assert (source.cursor.epoch, source.cursor.offset, source.cursor.consumed) == (1, 1, 4)


def test_num_epoch_bounds_the_prompts() -> None:
    source = PromptSource(prompts_of(5), num_epoch=2)
    assert source.remaining() == 10 and source.num_rollout(3) == 3
    source.take(8)
    with pytest.raises(DataExhaustedError, match="2 of 10"):
        source.take(3)
    assert source.cursor.consumed == 8  # all or none
    assert len(source.take(2)) == 2 and source.remaining() == 0
    assert PromptSource(prompts_of(5)).remaining() is None
    with pytest.raises(ConfigError) as error:
        PromptSource(prompts_of(5), num_epoch=0)
    assert error.value.field == "--num-epoch"


@given(
    size=st.integers(1, 12),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    takes=st.lists(st.integers(0, 9), min_size=1, max_size=8),
    cut=st.integers(0, 8),
)
def test_a_restored_cursor_continues_exactly_as_an_uninterrupted_source(
    size: int, shuffle: bool, seed: int, takes: list[int], cut: int
) -> None:
    prompts = prompts_of(size)
    whole = PromptSource(prompts, shuffle=shuffle, seed=seed)
    expected = [whole.take(k) for k in takes]
    cut = min(cut, len(takes))
    first = PromptSource(prompts, shuffle=shuffle, seed=seed)
    for k in takes[:cut]:
        first.take(k)
    saved = json.loads(json.dumps(first.state_dict()))  # what a save writes and reads back
    resumed = PromptSource(prompts, shuffle=shuffle, seed=seed, cursor=DataCursor.from_dict(saved))
    assert [resumed.take(k) for k in takes[cut:]] == expected[cut:]
    assert resumed.cursor == whole.cursor


def test_a_cursor_from_other_data_or_order_is_refused() -> None:
    source = PromptSource(prompts_of(4), shuffle=True, seed=3)
    source.take(5)
    cursor = source.cursor
    cases = [
        ({"prompts": prompts_of(5), "shuffle": True, "seed": 3}, "--prompt-data"),
        ({"prompts": prompts_of(4), "shuffle": True, "seed": 4}, "--rollout-seed"),
        ({"prompts": prompts_of(4), "shuffle": False, "seed": 3}, "--rollout-shuffle"),
    ]
    for kwargs, field in cases:
        with pytest.raises(ConfigError) as error:
            PromptSource(cursor=cursor, **kwargs)  # type: ignore[arg-type]
        assert error.value.field == field


@pytest.mark.parametrize(
    "change",
    [
        {"epoch": "1"},
        {"shuffle": 1},
        {"offset": 9},
        {"consumed": 2},
        {"extra": 0},
    ],
)
def test_a_malformed_saved_cursor_is_refused(change: dict[str, object]) -> None:
    state = PromptSource(prompts_of(4)).state_dict()
    with pytest.raises(ConfigError) as error:
        DataCursor.from_dict({**state, **change})
    assert error.value.field == "--load"
    with pytest.raises(ConfigError):
        DataCursor.from_dict([1, 2])
