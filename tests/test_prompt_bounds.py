"""--prompt-data is bounded before it costs memory (issue 52, item 2): a line longer than
``--prompt-data-max-line-bytes`` or a file larger than ``--prompt-data-max-bytes`` is refused
before it is parsed, and prompts longer than the engines take (the context less
``--rollout-max-response-len``, or miles' ``--rollout-max-prompt-len``) are dropped by
length as miles' ``Dataset`` drops them, before Ray starts. One 100 MB line once grew the
driver to 22.8 GB."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.common.training.char_tokenizer import build_tokenizer
from backends.common.training.prompt_data import PromptFlags, load_prompts
from miles_core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
MAX_LINE_BYTES = 1024**2
"""The documented default of --prompt-data-max-line-bytes (docs/training.md)."""


def write(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def long_line(chars: int) -> str:
    return json.dumps({"input": "1+1=" * (chars // 4)})


def test_a_line_past_the_bound_is_refused_naming_the_line_and_the_flag(tmp_path: Path) -> None:
    path = write(tmp_path, [json.dumps({"input": "1+1="}), long_line(2 * MAX_LINE_BYTES)])
    with pytest.raises(ConfigError) as error:
        load_prompts(PromptFlags(path))
    assert error.value.field == "--prompt-data"
    assert f"line 2 of {path} is longer than {MAX_LINE_BYTES} bytes" in error.value.problem
    assert "--prompt-data-max-line-bytes" in error.value.fix


def test_the_documented_defaults_are_the_bounds() -> None:
    from backends.common.training import prompt_data

    assert (prompt_data.MAX_LINE_BYTES, prompt_data.MAX_BYTES) == (MAX_LINE_BYTES, 1024**3)


def test_the_line_bound_is_raised_by_its_flag(tmp_path: Path) -> None:
    path = write(tmp_path, [long_line(2 * MAX_LINE_BYTES)])
    raised = PromptFlags(path, max_line_bytes=4 * MAX_LINE_BYTES)
    assert len(load_prompts(raised)[0].text) >= 2 * MAX_LINE_BYTES - 16


def test_a_file_past_its_bound_is_refused_before_a_line_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, [json.dumps({"input": "1+1="})] * 20)
    size = Path(path).stat().st_size
    with pytest.raises(ConfigError) as error:
        load_prompts(PromptFlags(path, max_bytes=size - 1))
    assert error.value.field == "--prompt-data"
    assert f"holds {size} bytes, more than the {size - 1}" in error.value.problem
    assert f"--prompt-data-max-bytes to {size}" in error.value.fix
    assert len(load_prompts(PromptFlags(path, max_bytes=size))) == 20


@pytest.mark.parametrize("field", ["max_line_bytes", "max_bytes"])
def test_a_bound_below_one_byte_is_refused(tmp_path: Path, field: str) -> None:
    flag = "--prompt-data-" + field.replace("_", "-")
    with pytest.raises(ConfigError, match=flag):
        PromptFlags("x.jsonl", **{field: 0})


def test_a_line_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"input": "1+1="}\n{"input": "\xff"}\n')
    with pytest.raises(ConfigError, match=r"line 2 of .* is not UTF-8"):
        load_prompts(PromptFlags(str(path)))


def _prompts(tmp_path: Path, lengths: list[int]) -> tuple:
    return load_prompts(
        PromptFlags(write(tmp_path, [json.dumps({"input": "7" * n}) for n in lengths]))
    )


def test_prompts_longer_than_the_bound_are_dropped_by_tokens(tmp_path: Path) -> None:
    from backends.common.training.prompt_length import keep_fitting

    kept = keep_fitting(_prompts(tmp_path, [3, 50, 10, 11]), build_tokenizer(), bound=10)
    assert [len(p.text) for p in kept.prompts] == [3, 10]  # one character, one token here
    assert [p.row for p in kept.prompts] == [0, 1]  # indexed among those kept, as miles does
    assert kept.dropped == 2
    assert "dropped 2 of 4 prompts longer than 10 tokens" in kept.note()


def test_no_prompt_left_is_an_error(tmp_path: Path) -> None:
    from backends.common.training.prompt_length import keep_fitting

    with pytest.raises(ConfigError, match="every one of its 2 prompts is longer than 5 tokens"):
        keep_fitting(_prompts(tmp_path, [6, 7]), build_tokenizer(), bound=5)


def test_the_bound_is_the_context_less_the_response_or_miles_lower_flag() -> None:
    from backends.common.training.prompt_length import prompt_bound

    assert prompt_bound(4096, 16, None) == 4080  # what the engine takes with the response
    assert prompt_bound(4096, 16, 100) == 100
    with pytest.raises(ConfigError) as error:
        prompt_bound(4096, 16, 5000)
    assert error.value.field == "--rollout-max-prompt-len"
    assert "1 to 4080" in error.value.fix
    with pytest.raises(ConfigError) as error:
        prompt_bound(4096, 4096, None)
    assert error.value.field == "--rollout-max-response-len"
    assert "at most 4095" in error.value.fix


def _checkpoint(tmp_path: Path) -> Path:
    from backends.common.training.hf_checkpoint import write_random_checkpoint

    folder = tmp_path / "checkpoint"
    write_random_checkpoint(folder, hidden_size=16, layers=1, heads=2)
    return folder


def _args(checkpoint: Path, data: str, *extra: str) -> object:
    from backends.common.run.flags import build_parser
    from backends.cpu.stack import CPU

    parser, _ = build_parser(CPU)
    return parser.parse_args(
        [
            "run",
            "--hf-checkpoint",
            str(checkpoint),
            "--prompt-data",
            data,
            "--rm-type",
            "math",
            *extra,
        ]
    )


def test_the_run_drops_prompts_the_engines_would_refuse_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from backends.common.training.flags import training_from

    checkpoint = _checkpoint(tmp_path)  # max_position_embeddings 4096
    data = write(tmp_path, [json.dumps({"input": "7" * n}) for n in (4, 4081, 4080, 5000)])
    training = training_from(_args(checkpoint, data), rollout_batch_size=2)  # type: ignore[arg-type]
    assert training is not None
    assert [len(p.text) for p in training.task.prompts] == [4, 4080]  # 4096 less 16 to respond
    assert "dropped 2 of 4 prompts longer than 4080 tokens" in capsys.readouterr().err
    lower = _args(checkpoint, data, "--rollout-max-prompt-len", "100")
    training = training_from(lower, rollout_batch_size=2)  # type: ignore[arg-type]
    assert training is not None
    assert [len(p.text) for p in training.task.prompts] == [4]


def test_a_100mb_class_line_exits_2_before_ray(tmp_path: Path) -> None:
    """The reproduction, at 3 MiB: the command exits 2 in seconds naming the flag."""
    checkpoint = _checkpoint(tmp_path)
    data = write(tmp_path, [json.dumps({"input": "1+1="}), long_line(3 * MAX_LINE_BYTES)])
    command = [sys.executable, "-m", "backends.cpu", "run", "--hf-checkpoint", str(checkpoint)]
    command += ["--rm-type", "math"]
    start = time.monotonic()
    done = subprocess.run(
        [*command, "--prompt-data", data], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--prompt-data: line 2 of" in done.stderr
    assert "--prompt-data-max-line-bytes" in done.stderr
    assert "Ray" not in done.stdout + done.stderr.replace("--prompt-data", "")
    assert time.monotonic() - start < 60
