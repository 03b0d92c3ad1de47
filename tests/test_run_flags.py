"""Every flag of the real backends' ``run`` is declared once, and the replay line gives it again.

A flag is declared in one of three places: the run's own (backends/common/run/flags.py, and a
backend's own in its package), the training flags, miles' loop flags. From a declaration come
its argparse argument and its words in the replay line; a flag that a run takes and its
replay line dropped (or spelt another way) would replay another run. No test here starts Ray.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

import pytest
from import_graph import graph

from backends.common.run.flags import (
    RUN_FLAGS,
    STACK_FLAGS,
    Flag,
    RealBackend,
    Spelt,
    build_parser,
    replay_line,
)
from backends.common.training.flags import add_training_flags
from backends.cpu.stack import CPU
from backends.gpu.stack import GPU
from miles_core.loop.flags import RUN_OWN_FLAGS, add_loop_flags

BACKENDS = {"cpu": CPU, "gpu": GPU}


def _run_parser(backend: RealBackend) -> argparse.ArgumentParser:
    _, sub = build_parser(backend)
    return sub.choices["run"]


def _options(add: Any) -> set[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add(parser)
    return {s for action in parser._actions for s in action.option_strings}


def _declared(backend: RealBackend) -> tuple[Flag, ...]:
    return (*RUN_FLAGS, *STACK_FLAGS, *backend.flags)


def _other(flag: Flag) -> tuple[list[str], Any]:
    """Argv giving ``flag`` a value other than its default, and that value as parsed."""
    if flag.switch:
        return [flag.name], True
    if flag.choices:
        value = next(c for c in flag.choices if c != flag.default)
        return [flag.name, value], value
    if flag.type in (int, float):
        value = flag.type((flag.default or 0) + 1.5)
        return [flag.name, str(value)], value
    return [flag.name, f"given-{flag.dest}"], f"given-{flag.dest}"


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_option_of_run_is_declared_in_exactly_one_place(name: str) -> None:
    backend = BACKENDS[name]
    declared = [flag.name for flag in _declared(backend)]
    assert len(declared) == len(set(declared))
    training = _options(add_training_flags)
    loop = _options(lambda p: add_loop_flags(p, skip=RUN_OWN_FLAGS))
    parts = [set(declared), training, loop]
    assert sum(map(len, parts)) == len(set().union(*parts)), "a flag in two places"
    taken = {s for action in _run_parser(backend)._actions for s in action.option_strings}
    assert taken == {"-h", "--help"} | set().union(*parts)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_declared_flag_is_in_the_help(name: str, capsys: pytest.CaptureFixture) -> None:
    backend = BACKENDS[name]
    with pytest.raises(SystemExit):
        build_parser(backend)[0].parse_args(["run", "--help"])
    text = capsys.readouterr().out
    for flag in _declared(backend):
        assert f"  {flag.name}" in text, flag.name
        if flag.help:
            assert " ".join(flag.help.split()[:3]) in " ".join(text.split()), flag.name


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_value_given_to_each_flag_replays_as_given(name: str) -> None:
    """Every flag off its default at once: those the replay line spells parse back from it
    to the same value; those it never spells (where the run writes, which cluster it
    joins) are not in it."""
    backend, parser = BACKENDS[name], build_parser(BACKENDS[name])[0]
    argv, expected = ["run"], {}
    for flag in _declared(backend):
        words, expected[flag.dest] = _other(flag)
        argv += words
    args = parser.parse_args(argv)
    assert {dest: getattr(args, dest) for dest in expected} == expected
    words = shlex.split(replay_line(backend, args, steps=args.steps))
    assert words[:4] == ["python", "-m", backend.prog, "run"]
    back = parser.parse_args(words[3:])
    for flag in _declared(backend):
        if flag.replay is Spelt.NEVER:
            assert flag.name not in words, flag.name
        else:
            assert getattr(back, flag.dest) == expected[flag.dest], flag.name


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_flag_left_at_its_default_is_spelt_only_when_always(name: str) -> None:
    backend, parser = BACKENDS[name], build_parser(BACKENDS[name])[0]
    args = parser.parse_args(["run"])
    words = shlex.split(replay_line(backend, args, steps=7))
    for flag in _declared(backend):
        assert (flag.name in words) == (flag.replay is Spelt.ALWAYS), flag.name
    assert parser.parse_args(words[3:]).steps == 7  # the steps the run took, not None


def test_the_replay_lines_read_as_before() -> None:
    """The stack first (the backend's own, then the shared), the training flags, the seed
    and steps, what was run, miles' loop flags."""
    argv = "run --load ck --flattened-bucket --wire shm --scenario s.toml --seed 3 --json"
    argv += " --engine-token-seconds 0.5 --max-weight-staleness none --save out --timeout 5"
    cpu = build_parser(CPU)[0].parse_args(argv.split())
    assert replay_line(CPU, cpu, 4, ("--lr", "0.1")) == (
        "python -m backends.cpu run --wire shm --flattened-bucket --lr 0.1 --seed 3 --steps 4 "
        "--scenario s.toml --load ck --engine-token-seconds 0.5 --max-weight-staleness none"
    )
    gpu = build_parser(GPU)[0].parse_args(["run", "--engine", "local", "--device", "cpu"])
    assert replay_line(GPU, gpu, 20) == (
        "python -m backends.gpu run --trainer megatron --tp 2 --transport nccl --device cpu "
        "--engine local --seed 0 --steps 20"
    )


def test_a_switch_is_off_by_default() -> None:
    with pytest.raises(ValueError, match="off by default"):
        Flag("--on", default=True, switch=True)


def test_the_shared_command_knows_no_backend() -> None:
    """Each backend declares itself (``RealBackend``) in its own package; backends/common
    imports none of them, so a backend's flag cannot hide in the shared code."""
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module.startswith("backends.common")
        for target in targets
        if target.startswith(("backends.cpu", "backends.gpu", "backends.bench"))
    )
    assert wrong == []


def test_the_backends_declarations_import_neither_torch_nor_ray() -> None:
    """A backend's flags are read before anything heavy: a wrong command fails at once."""
    import subprocess
    import sys

    code = "import sys, backends.cpu.stack, backends.gpu.stack\n"
    code += "print('torch' in sys.modules, 'ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr
