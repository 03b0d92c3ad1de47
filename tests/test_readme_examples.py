"""The front door stays true: every command the README and the docs' tours show is run or,
where it is too slow for CI, parsed by its own command's argparse parser; every figure they
quote that a run can reproduce is checked against a run (issue 52, item 11).

Everything expected is read from the documents themselves (the fenced ``bash`` blocks, the
quoted output under them, the "look for" sentences, the oracle count in words): editing a
document without the code, or the code without the document, fails here.

Run here: ``python -m sim run`` and ``python -m sim list`` (a fraction of a second each, as
subprocesses, the command as a user types it). Parsed only: everything else (the CPU and
GPU backends' Ray runs, sweeps, plans, benches, ``pip install``): the command's ``main`` is
called with ``argparse.ArgumentParser.parse_args`` made to stop right after a successful
parse, so a renamed or misspelled flag fails and nothing runs.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from unittest import mock

import pytest

from miles_core.oracles import ORACLES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_TOURS = {"measurements.md"}
"""docs/measurements.md is a log of past figures (each with the commit it ran at), not a tour."""
TOURS = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in NOT_TOURS)
DOCUMENTS = [README, *TOURS]

NUMBER_WORDS = [
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"),
    *("eighteen", "nineteen", "twenty"),
]

CHEAP = {("sim", "run"), ("sim", "list")}
"""Commands run for real: each takes well under a second."""


@dataclass(frozen=True)
class Command:
    doc: str
    """Where it is shown: ``README.md:LINE``."""
    words: tuple[str, ...]
    """As shown, after placeholders are read (``...`` dropped, ``[--flag X]`` included)."""
    fenced: bool
    """In a fenced block (to be typed as is), rather than named in prose or a table."""

    @property
    def module(self) -> str | None:
        """``X`` of ``python -m X``, else None."""
        if _is_python(self.words[0]) and len(self.words) > 2 and self.words[1] == "-m":
            return self.words[2]
        return None

    @property
    def argv(self) -> list[str]:
        return list(self.words[3:])

    @property
    def cheap(self) -> bool:
        return self.module == "sim" and tuple(self.words[2:4]) in CHEAP

    def __str__(self) -> str:
        return f"{self.doc}: {shlex.join(self.words)}"


def _is_python(word: str) -> bool:
    return re.fullmatch(r"(\.venv/bin/)?python3?", word) is not None


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- reading the documents -------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    text: str


def _blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(path, text.count("\n", 0, m.start()) + 2, m.group(1), m.group(2))
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
    ]


def _words(line: str) -> list[str]:
    """A shell line's words: comments gone, ``...`` (the flags shown above) dropped unless it
    stands for a flag's value, ``(as above)`` dropped, ``[--flag X]`` read as given."""
    words = shlex.split(line, comments=True)
    out: list[str] = []
    in_aside = in_optional = False
    for word in words:
        if word.startswith("(") or in_aside:
            in_aside = not word.endswith(")")
            continue
        if word.startswith("[--"):
            word, in_optional = word[1:], True
        if in_optional and word.endswith("]"):
            word, in_optional = word[:-1], False
        if word == "..." and not (out and out[-1].startswith("--")):
            continue
        out.append(word)
    return out


def _commands_of_block(block: Block) -> list[Command]:
    """Each command of a bash block: lines joined at ``\\``, split at ``&&``, a ``for``
    loop unrolled."""
    lines = block.text.replace("\\\n", " ").splitlines()
    commands: list[Command] = []
    loop: tuple[str, list[str]] | None = None
    for offset, line in enumerate(lines):
        words = _words(line)
        if not words:
            continue
        if words[0] == "for":  # for VAR in A B C; do
            loop = (words[1], [w.rstrip(";") for w in words[3:] if w not in ("do", ";")])
            continue
        if words == ["done"]:
            loop = None
            continue
        variants = [words]
        if loop is not None:
            name, values = loop
            variants = [[w.replace(f"${name}", v) for w in words] for v in values]
        for variant in variants:
            while variant:
                end = variant.index("&&") if "&&" in variant else len(variant)
                doc = f"{_rel(block.doc)}:{block.line + offset}"
                commands.append(Command(doc, tuple(variant[:end]), fenced=True))
                variant = variant[end + 1 :]
    return commands


def _inline_commands(path: Path) -> list[Command]:
    """Commands named in the prose and tables: a code span that begins ``python -m``."""
    text = path.read_text()
    found = []
    for m in re.finditer(r"`((?:\.venv/bin/)?python3? -m [^`]+)`", _without_blocks(text)):
        line = text.count("\n", 0, m.start()) + 1
        found.append(Command(f"{_rel(path)}:{line}", tuple(_words(m.group(1))), fenced=False))
    return found


def _without_blocks(text: str) -> str:
    """The text with fenced blocks blanked (their lines kept, so line numbers hold)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)


def _all_commands() -> list[Command]:
    commands = []
    for path in DOCUMENTS:
        for block in _blocks(path):
            if block.lang == "bash":
                commands += _commands_of_block(block)
    return commands + _inline_commands(README)


COMMANDS = _all_commands()
MODULE_COMMANDS = [c for c in COMMANDS if c.module not in (None, "pip", "venv", "pytest")]
PARSED_ONLY = [c for c in MODULE_COMMANDS if not c.cheap]
RUN = [c for c in MODULE_COMMANDS if c.cheap]


def _prose(text: str) -> str:
    """Prose on one line: blocks gone, whitespace collapsed."""
    return " ".join(_without_blocks(text).split())


def _tour_steps() -> dict[str, str]:
    """The README tour's steps, by their bold heading: each step's text."""
    text = README.read_text()
    tour = text[text.index("## A ten-minute tour") :]
    tour = tour[: tour.index("\n## ", 1)]
    parts = re.split(r"^\*\*(\d+\. [^*]+)\*\*", tour, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


# --- running and parsing ---------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


@cache
def _run(words: tuple[str, ...]) -> Ran:
    """A cheap command as a user types it (``python`` is this interpreter), in the root."""
    command = [sys.executable, *words[1:]] if _is_python(words[0]) else list(words)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return Ran(done.returncode, done.stdout, done.stderr)


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


class _Refused(Exception):
    pass


@contextmanager
def _parse_only() -> Iterator[None]:
    """``parse_args`` stops the command right after a successful parse (raising _Parsed);
    an argparse error raises _Refused with its message instead of exiting."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse_args(self, args, namespace))

    def refuse(self, message):
        raise _Refused(message)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop),
        mock.patch.object(argparse.ArgumentParser, "error", refuse),
    ):
        yield


def _parse(module: str, argv: list[str]) -> str | None:
    """None when the command's parser accepts argv, else argparse's message."""
    try:
        _namespace(module, argv)
    except _Refused as refused:
        return str(refused)
    return None


def _namespace(module: str, argv: list[str]) -> argparse.Namespace:
    """What ``python -m MODULE ARGV`` parses argv to, without running it."""
    main = importlib.import_module(f"{module}.__main__").main
    with _parse_only():
        try:
            main(argv)
        except _Parsed as parsed:
            return parsed.namespace
    raise AssertionError(f"python -m {module} {shlex.join(argv)} returned without parsing")


def _accepts(command: Command) -> str | None:
    """None when accepted; a command named in prose may leave out what it requires."""
    message = _parse(command.module, command.argv)
    if message is not None and not command.fenced and "arguments are required" in message:
        return None
    return message


# --- the commands ----------------------------------------------------------------------


def test_every_command_shown_is_one_this_test_knows() -> None:
    """Each command is run, parsed, or one of a few others checked below (so a new kind of
    command in a document is noticed here, not silently skipped)."""
    assert len(RUN) >= 5 and len(PARSED_ONLY) >= 20, (len(RUN), len(PARSED_ONLY))
    others = [c for c in COMMANDS if c not in MODULE_COMMANDS]
    for command in others:
        known = command.module in ("pip", "venv", "pytest") or command.words[0] == "cat"
        assert known or re.fullmatch(r"\.venv/bin/pip", command.words[0]), str(command)


@pytest.mark.parametrize("command", PARSED_ONLY, ids=str)
def test_each_slow_command_is_accepted_by_its_parser(command: Command) -> None:
    assert _accepts(command) is None, f"{command}\n  refused: {_accepts(command)}"


@pytest.mark.parametrize("command", RUN, ids=str)
def test_each_cheap_command_runs(command: Command) -> None:
    ran = _run(command.words)
    planted = "--plant" in command.words
    assert ran.code == (1 if planted else 0), f"{command}\n{ran.out[-3000:]}\n{ran.err[-3000:]}"


def test_the_files_and_extras_they_name_exist() -> None:
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    checked = 0
    for command in COMMANDS:
        words = command.words
        if words[0] == "cat" or command.module == "pytest":
            paths = [w for w in words[1 if words[0] == "cat" else 3 :] if not w.startswith("-")]
            assert all((ROOT / p).exists() for p in paths), str(command)
            checked += 1
        if "install" in words:
            for spec in (w for w in words if w.startswith(".[")):
                named = set(spec.removeprefix(".[").removesuffix("]").split(","))
                assert named <= extras, f"{command}: no extra {sorted(named - extras)}"
                checked += 1
    assert checked >= 4


def test_the_flags_each_tour_step_names_are_its_commands() -> None:
    """A flag a step names on its own (`--seed 3`, `--out DIR`) is one its command takes."""
    checked = 0
    for heading, text in _tour_steps().items():
        block = re.search(r"```bash\n(.*?)```", text, re.S)
        base = [
            c for c in _commands_of_block(Block(README, 0, "bash", block.group(1))) if c.module
        ][-1]
        for span in re.findall(r"`(--[a-z][^`]*)`", _prose(text)):
            message = _parse(base.module, [*base.argv, *_words(span)])
            if message is not None and "expected one argument" in message:
                message = None  # a flag named without its value: "with no `--scenario`"
            assert message is None, f"step {heading!r}: {span!r} to {base}: {message}"
            checked += 1
    assert checked >= 5


# --- the figures they quote ------------------------------------------------------------


def test_the_oracle_count_in_words_is_the_oracles_a_run_prints() -> None:
    printed = re.findall(r"^  oracle (\w+) ", _run(("python", "-m", "sim", "run")).out, re.M)
    assert printed == list(ORACLES)
    pattern = r"\b(" + "|".join(NUMBER_WORDS) + r") oracles\b"
    claims = [
        (f"{_rel(path)}:{path.read_text().count(chr(10), 0, m.start()) + 1}", m.group(1))
        for path in DOCUMENTS
        for m in re.finditer(pattern, path.read_text(), re.I)
    ]
    assert len(claims) >= 4, claims
    wrong = [
        (where, word) for where, word in claims if NUMBER_WORDS.index(word.lower()) != len(ORACLES)
    ]
    assert not wrong, (
        f"{len(ORACLES)} oracles judge a run ({', '.join(ORACLES)}); the docs say {wrong}"
    )


def _quoted_outputs() -> list[tuple[Command, Block]]:
    """Each unlabelled block that follows a bash block of one cheap command: its output."""
    pairs = []
    for path in DOCUMENTS:
        blocks = _blocks(path)
        for before, block in itertools.pairwise(blocks):
            if before.lang == "bash" and block.lang == "":
                commands = _commands_of_block(before)
                if len(commands) == 1 and commands[0].cheap:
                    pairs.append((commands[0], block))
    return pairs


def _matches(quoted: list[str], printed: list[str]) -> str | None:
    """None when the printed lines hold the quoted ones: in order, consecutive except where
    the quote writes ``...`` for lines left out; a line ending ``...`` is a prefix."""
    at, skipping = 0, True
    for line in quoted:
        if line.strip() == "...":
            skipping = True
            continue
        prefix = line.endswith("...")
        want = line.removesuffix("...") if prefix else line

        def fits(i: int, want: str = want, prefix: bool = prefix) -> bool:
            return printed[i].startswith(want) if prefix else printed[i] == want

        candidates = range(at, len(printed)) if skipping else range(at, min(at + 1, len(printed)))
        found = next((i for i in candidates if fits(i)), None)
        if found is None:
            where = "after" if skipping else "right after"
            return f"quoted line {line!r} not printed {where} line {at}"
        at, skipping = found + 1, False
    return None


def test_each_quoted_output_is_what_its_command_prints() -> None:
    pairs = _quoted_outputs()
    assert pairs, "the README's step 1 quotes its output"
    for command, block in pairs:
        ran = _run(command.words)
        problem = _matches(block.text.splitlines(), ran.out.splitlines())
        assert problem is None, (
            f"{_rel(block.doc)}:{block.line}, {command}: {problem}\nprinted:\n{ran.out}"
        )


def test_what_each_tour_step_says_to_look_for_is_printed() -> None:
    checked = 0
    for heading, text in _tour_steps().items():
        block = re.search(r"```bash\n(.*?)```", text, re.S)
        commands = _commands_of_block(Block(README, 0, "bash", block.group(1)))
        if not all(c.cheap or c.words[0] == "cat" for c in commands):
            continue  # a Ray run: its flags are parsed above
        printed = "\n".join(
            _run(c.words).out if c.cheap else (ROOT / c.words[1]).read_text() for c in commands
        )
        for sentence in re.findall(r"[Ll]ook for (.*?)\.(?:\s|$)", _prose(text)):
            spans = [s for s in re.findall(r"`([^`]+)`", sentence) if not s.startswith("-")]
            for span in spans:
                assert span in printed, f"step {heading!r}: look for {span!r}; printed:\n{printed}"
                checked += 1
            for first, then in re.findall(r"`([^`]+)` followed by `([^`]+)`", sentence):
                assert printed.index(first) < printed.index(then), (heading, first, then)
    assert checked >= 3


def test_another_seed_gives_another_hash_and_the_same_seed_the_same() -> None:
    step = next(text for heading, text in _tour_steps().items() if heading.startswith("1."))
    seed = re.search(
        r"`--seed (\d+)` gives another run; the same seed, the same hash", _prose(step)
    )
    assert seed is not None, "step 1 says what --seed does"
    base = next(
        c for c in RUN if c.doc.startswith("README") and len(c.argv) == 2 and c.argv[0] == "run"
    )
    hashes = [
        re.search(r"history hash: (\w+)", _run(words).out).group(1)
        for words in (
            base.words,
            (*base.words, "--seed", seed.group(1)),
            (*base.words, "--seed", seed.group(1)),
        )
    ]
    assert hashes[0] != hashes[1] == hashes[2]


def test_the_planted_bug_fails_as_the_readme_says_with_the_replay_line_last() -> None:
    said = re.search(
        r"`(python -m sim run [^`]+)` plants .*?`(\w+)` fails \(\"([^\"]+)\"\), exit (\d+), "
        r"the replay line last",
        _prose(README.read_text()),
    )
    assert said is not None, "the README's tour names a planted bug and how it fails"
    command, oracle, message, code = said.groups()
    ran = _run(tuple(shlex.split(command)))
    assert ran.code == int(code)
    assert re.search(rf"^  oracle {oracle} +FAIL$", ran.out, re.M), ran.out
    assert f"[{oracle}]" in ran.out and message in ran.out, ran.out
    replay = ran.err.strip().splitlines()[-1]
    assert replay.startswith("replay: python -m sim run"), ran.err
    again = _run(tuple(shlex.split(replay.removeprefix("replay: "))))
    assert again.code == ran.code
    assert again.out.splitlines()[-1] == ran.out.splitlines()[-1]  # the same history hash


def test_a_misspelled_key_is_refused_naming_it_and_the_key_meant(tmp_path: Path) -> None:
    step = next(text for heading, text in _tour_steps().items() if heading.startswith("2."))
    assert re.search(r"[Mm]isspell a key .* refuses it before it starts \(exit 2\)", _prose(step))
    file = next(
        c.words[1]
        for c in _commands_of_block(Block(README, 0, "bash", step))
        if c.words[0] == "cat"
    )
    text = (ROOT / file).read_text()
    key = re.search(r"^([a-z]+_[a-z_]+) = ", text, re.M).group(1)
    typo = key[0] + key[2] + key[1] + key[3:]
    copy = tmp_path / Path(file).name
    copy.write_text(text.replace(f"{key} = ", f"{typo} = ", 1))
    ran = _run(("python", "-m", "sim", "run", str(copy)))
    assert ran.code == 2 and f"'{typo}' may be {key}" in ran.err, ran.err


def test_the_wait_for_graph_quoted_in_verdicts_is_what_the_plant_prints() -> None:
    """Its source lines read as ``file.py:N`` (they move with every edit of those files)."""
    text = (ROOT / "docs" / "verdicts.md").read_text()
    said = re.search(
        r"From\s+`--plant (\w+)` on `(\w+)`(?:\s+under\s+`(--miles-profile \w+)`)?[^:]*:"
        r"\s*```\n(.*?)```",
        text,
        re.S,
    )
    assert said is not None
    plant, scenario, profile, quoted = said.groups()
    profile_words = tuple(profile.split()) if profile else ()
    ran = _run(("python", "-m", "sim", "run", scenario, "--plant", plant, *profile_words))

    def lines(s: str) -> list[str]:
        return [re.sub(r"\.py:\d+", ".py:N", line).strip() for line in s.splitlines()]

    graph = [line for line in lines(ran.out) if line]
    graph = graph[next(i for i, line in enumerate(graph) if line.startswith("wait-for graph")) :]
    quoted_lines = lines(quoted)
    header, named = quoted_lines[0], [q for q in quoted_lines[1:] if q != "..."]
    assert graph[0] == header, graph[0]
    for line in named:  # each task quoted is one the graph lists, as quoted
        assert line in graph, f"{line!r} not in:\n" + "\n".join(graph[:20])


def test_the_sweep_rechecks_as_many_seeds_as_the_tour_says() -> None:
    step = next(text for heading, text in _tour_steps().items() if heading.startswith("4."))
    said = re.search(r"determinism re-check \((\d+) seeds run again", _prose(step))
    assert said is not None, "step 4 says how many seeds the sweep runs again"
    sweep = next(c for c in PARSED_ONLY if c.doc.startswith("README") and c.argv[:1] == ["sweep"])
    assert _namespace(sweep.module, sweep.argv).recheck == int(said.group(1))
