"""miles' prompt data: a JSONL file read with the flags miles spells for it.

``load_prompts`` reads ``--prompt-data`` as miles' ``Dataset`` does
(``miles/utils/data.py``: ``read_file``, ``_build_messages``, ``Dataset.__init__``):
one JSON object a line, blank lines skipped, the prompt under ``--input-key``
(default ``input``), the label under ``--label-key`` (none unless given), a metadata
dict under ``--metadata-key`` (default ``metadata``), and with
``--apply-chat-template`` a string prompt wrapped as one user message and rendered by
the tokenizer's template with the generation prompt. A ``path@[start:end]`` suffix
takes a slice of the rows, as miles' ``_parse_generalized_path``. Where miles prints a
bad line and skips it, or fails later with a KeyError, this raises a ConfigError naming
the flag and the line, before any work.

The file is read a line at a time, each line bounded (``max_line_bytes``) and the whole
bounded (``max_bytes``; ``--prompt-data-max-line-bytes``, ``--prompt-data-max-bytes``):
one 100 MB line once grew the driver to 22.8 GB. Prompts longer than the engines take are
dropped by length, as miles' ``Dataset`` drops them (prompt_length.py).

The order they are handed out in, and the cursor a save holds, live in
``prompt_source``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError, int_at_least


@dataclass(frozen=True)
class Prompt:
    """One row of --prompt-data: the prompt text the engine gets, its label, its metadata."""

    row: int  # 0-based, among the rows read (after a path@[start:end] slice)
    line: int  # 1-based line number in the file, for messages
    text: str
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)


MAX_LINE_BYTES = 1024**2
"""A line of the file longer than this is refused before it is parsed: a prompt that fills a
128K-token context is about 512 KB of text; a longer line is a corrupt file or a wrong one."""
MAX_BYTES = 1024**3
"""A file larger than this is refused before a line is read: every prompt is held in the
driver (and parsed JSON takes several times its text)."""


@dataclass(frozen=True)
class PromptFlags:
    """miles' data flags, spelled as its ``arguments.py`` defaults them, and the bounds on
    reading the file (this testbed's own flags)."""

    prompt_data: str
    input_key: str = "input"
    label_key: str | None = None
    metadata_key: str = "metadata"
    apply_chat_template: bool = False
    max_line_bytes: int = MAX_LINE_BYTES
    """``--prompt-data-max-line-bytes``: the longest line read."""
    max_bytes: int = MAX_BYTES
    """``--prompt-data-max-bytes``: the largest file read."""

    def __post_init__(self) -> None:
        for flag, value in (
            ("--prompt-data-max-line-bytes", self.max_line_bytes),
            ("--prompt-data-max-bytes", self.max_bytes),
        ):
            if not int_at_least(value, 1):
                raise ConfigError(flag, f"got {value!r}", "pass a number of bytes >= 1")


_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


def _split_path(spec: str) -> tuple[Path, slice | None]:
    match = _SLICE.match(spec)
    if match is None:
        return Path(spec), None
    bound = [int(x) if x else None for x in (match["start"], match["end"])]
    return Path(match["path"]), slice(bound[0], bound[1])


def _prompt_text(value: Any, flags: PromptFlags, line: int, tokenizer: Any) -> str:
    """The prompt as the engine gets it: the string, or the chat template's rendering."""
    if not flags.apply_chat_template:
        if not isinstance(value, str):
            raise ConfigError(
                "--input-key",
                f"line {line}: {flags.input_key!r} holds a {type(value).__name__}, not a string",
                "pass --apply-chat-template for a list of chat messages",
            )
        return value
    messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m and "content" in m for m in messages
    ):
        raise ConfigError(
            "--input-key",
            f"line {line}: {flags.input_key!r} is neither a string nor chat messages",
            'give a string or [{"role": "user", "content": "..."}]',
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _row(data: Any, flags: PromptFlags, row: int, line: int, tokenizer: Any) -> Prompt:
    if not isinstance(data, dict):
        raise ConfigError("--prompt-data", f"line {line} is not a JSON object", "fix the line")
    if flags.input_key not in data:
        raise ConfigError(
            "--input-key",
            f"line {line} has no key {flags.input_key!r} (it has {sorted(data)})",
            "pass the key the file uses for the prompt",
        )
    if flags.label_key is not None and flags.label_key not in data:
        raise ConfigError(
            "--label-key",
            f"line {line} has no key {flags.label_key!r} (it has {sorted(data)})",
            "pass the key the file uses for the label, or leave --label-key out",
        )
    metadata = data.get(flags.metadata_key) or {}
    if not isinstance(metadata, dict):
        raise ConfigError(
            "--metadata-key",
            f"line {line}: {flags.metadata_key!r} holds a {type(metadata).__name__}, not an object",
            "give a JSON object, or pass a --metadata-key the file does not use",
        )
    label = data[flags.label_key] if flags.label_key is not None else None
    text = _prompt_text(data[flags.input_key], flags, line, tokenizer)
    return Prompt(row=row, line=line, text=text, label=label, metadata=metadata)


def _check_template(flags: PromptFlags, tokenizer: Any) -> None:
    if flags.apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(
            "--apply-chat-template",
            "the tokenizer has no chat template" if tokenizer else "no tokenizer was given",
            "use a --hf-checkpoint whose tokenizer has one, or leave the flag out",
        )


def _too_large(path: Path, size: int, bound: int) -> ConfigError:
    return ConfigError(
        "--prompt-data",
        f"{str(path)!r} holds {size} bytes, more than the {bound} it may "
        "(every prompt is held in the driver)",
        f"take fewer rows into a smaller file, or raise --prompt-data-max-bytes to {size}",
    )


def _lines(path: Path, flags: PromptFlags) -> Iterator[tuple[int, str]]:
    """The file's lines, numbered from 1: none longer than ``flags.max_line_bytes`` bytes,
    no more than ``flags.max_bytes`` in all (checked as read too: the file may grow)."""
    line_bound, total_bound = flags.max_line_bytes, flags.max_bytes
    if (size := path.stat().st_size) > total_bound:
        raise _too_large(path, size, total_bound)
    total = 0
    with path.open("rb") as file:
        for number in itertools.count(1):
            raw = file.readline(line_bound + 1)
            if not raw:
                return
            total += len(raw)
            if len(raw.rstrip(b"\r\n")) > line_bound:
                raise ConfigError(
                    "--prompt-data",
                    f"line {number} of {path} is longer than {line_bound} bytes "
                    "(a prompt that fills a 128K-token context is about 512 KB)",
                    "fix the line, or raise --prompt-data-max-line-bytes if it is meant",
                )
            if total > total_bound:  # it grew while read
                raise _too_large(path, total, total_bound)
            yield number, _decoded(raw, number, path)


def _decoded(raw: bytes, number: int, path: Path) -> str:
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        raise ConfigError(
            "--prompt-data",
            f"line {number} of {path} is not UTF-8 ({error.reason} at byte {error.start})",
            "fix the line",
        ) from None


def load_prompts(flags: PromptFlags, tokenizer: Any = None) -> tuple[Prompt, ...]:
    """Every prompt of the file, in file order; ``tokenizer`` only for --apply-chat-template."""
    path, rows = _split_path(flags.prompt_data)
    if path.suffix != ".jsonl":
        raise ConfigError(
            "--prompt-data", f"{str(path)!r} is not a .jsonl file", "pass a JSONL file"
        )
    if not path.is_file():
        raise ConfigError("--prompt-data", f"{str(path)!r} does not exist", "pass a JSONL file")
    _check_template(flags, tokenizer)
    numbered = []
    for number, text in _lines(path, flags):
        if not text.strip():
            continue
        try:
            numbered.append((number, json.loads(text)))
        except json.JSONDecodeError as error:
            raise ConfigError(
                "--prompt-data",
                f"line {number} of {path} is not JSON ({error.msg})",
                "fix the line",
            ) from None
    chosen = numbered[rows] if rows is not None else numbered
    prompts = tuple(_row(d, flags, i, n, tokenizer) for i, (n, d) in enumerate(chosen))
    if not prompts:
        raise ConfigError(
            "--prompt-data", f"{flags.prompt_data!r} holds no prompts", "pass a file with rows"
        )
    return prompts


def fingerprint(prompts: tuple[Prompt, ...]) -> str:
    """A hash of the prompts and labels: a resumed run checks it holds the same data."""
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(json.dumps([prompt.text, prompt.label], sort_keys=True).encode())
    return digest.hexdigest()[:16]
