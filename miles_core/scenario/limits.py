"""Bounds on what a scenario asks for, checked before anything runs.

A scenario file is input a person types: ``num_cells = 100000000`` or ``steps =
9223372036854775807`` is far more often a typo than a run anyone means, and the
simulator would take it at its word (100 million cells took 15.9 GB before it
failed; 2**63 steps never end). So every count a run scales with has a bound,
generous for real use (the production-64x256 preset and the Kimi-K2 preset sit
well inside them), and each one is raised by a key of the scenario file's
``[limits]`` table where a larger run is meant, which the error names:

    [limits]
    cells = 4096        # [sim].num_cells
    steps = 1000000     # [loop].steps, --steps and until_witnessed

Two bounds are fixed (``MAX_FILE_BYTES``, ``MAX_DEPTH``): they are on reading the
file, before its ``[limits]`` could say anything, and no scenario comes near them.

What a run costs at the bounds, measured on the 2-core VM of docs/measurements.md:
every world bound at once (1,024 cells of 32 GPUs, 4,096 engines of 8, 65,536
tensors) ran 4 steps in 2.9 s and 180 MB; 10,000 faults at times, 8 steps, 1.3 s;
the small preset takes about 3.7 ms and 17 KB of history a step, so 100,000 steps
are about 6 minutes and 1.7 GB.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from miles_core.errors import ConfigError, int_at_least
from miles_core.loop.config import LoopConfig
from miles_core.scenario.world import WorldShape

MAX_FILE_BYTES = 16 * 1024**2
"""A scenario file larger than this is not read. Fixed: it is checked before the file is
read, so no key of the file can raise it. The library's largest file is under 2 KB; 16 MiB
holds over 200,000 faults (tomllib reads about 4 MB a second here); a scenario larger than
that can be built in Python (``scenario_from_mapping``), which reads no file."""

MAX_DEPTH = 16
"""Tables and arrays nested deeper than this are refused. Fixed: no scenario key nests more
than three deep (the document, ``faults``, a fault's table), so a deeper value is never a
scenario, and Python's TOML reader fails with a RecursionError at about 450."""

MAX_PARAM_BYTES = 10**18
"""How far ``[limits] param_bytes`` goes: 10**400 bytes overflowed a float and crashed a
run; an exabyte is a million times Kimi-K2 and still divides cleanly."""


@dataclass(frozen=True)
class Limits:
    """The bounds a scenario's world and run must keep to: a scenario file's ``[limits]``."""

    cells: int = 1024
    """``[sim].num_cells``: trainer cells (the production-64x256 preset has 64)."""
    engines: int = 4096
    """``[sim].num_engines``: rollout engines (production-64x256: 256)."""
    gpus: int = 65536
    """GPUs in all, num_cells x gpus_per_cell + num_engines x gpus_per_engine, and
    ``gpus_per_node`` (production-64x256: 1,536; the simulator places every one)."""
    tensors: int = 65536
    """``[sim].num_tensors``: the model's tensors, each a unit of the bucket plan (Kimi-K2's
    preset: 8,192)."""
    param_bytes: int = 10**15
    """``[sim].param_bytes``: a petabyte, a thousand times Kimi-K2's 1.04 TB (the time models
    divide it as a float; 10**400 bytes crashed a run)."""
    steps: int = 100_000
    """``[loop].steps``, ``--steps`` and ``until_witnessed``: the most steps a run takes."""
    faults: int = 10_000
    """``[[faults]]``: how many a scenario may schedule (each is checked against the whole
    history by the fault_witness oracle)."""
    samples: int = 65_536
    """Samples a step (``rollout_batch_size`` x ``n_samples_per_prompt``) and samples
    generating at once (``async_max_concurrent_samples``): each one is a request, a
    sample in the buffer and events in the history (16,384 a step ran 3 steps in 7.7 s and
    181 MB in the simulator here; miles' large runs take 512 x 16 = 8,192)."""
    buffered_samples: int = 1_048_576
    """Samples the buffer may hold: floor(``capacity_factor`` x ``rollout_batch_size``)
    groups of ``n_samples_per_prompt`` (16 steps of samples at the ``samples`` bound)."""
    attempts: int = 10_000
    """How many times one thing is tried: ``[loop].max_step_attempts``,
    ``max_route_attempts``, ``request_max_retries``, ``flush_cache_max_retries`` and
    ``heartbeat_failure_threshold`` (miles: 30, 60 and 3). Each try costs time, not memory:
    10**18 tries of a dead router is a run that never ends rather than one that fails."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value, default = getattr(self, f.name), f.default
            if not int_at_least(value, default):  # type: ignore[arg-type]
                raise ConfigError(
                    f.name,
                    f"got {value!r}",
                    f"pass an integer >= {default}, the default ([limits] raises a bound where "
                    "a larger run is meant, never lowers it)",
                )
        if self.param_bytes > MAX_PARAM_BYTES:
            raise ConfigError(
                "param_bytes",
                f"got {self.param_bytes}: the time models divide it as a float",
                f"pass at most {MAX_PARAM_BYTES} (10**18 bytes)",
            )


LIMIT_KEYS = frozenset(f.name for f in fields(Limits))


def over(where: str, what: str, value: int, limits: Limits, key: str) -> ConfigError:
    """The error for ``value`` past the bound ``limits.<key>``: names ``where`` (the key or
    flag as written) and the ``[limits]`` key that raises the bound."""
    bound = getattr(limits, key)
    file = "a scenario file" if where.startswith("--") else "the scenario file"
    return ConfigError(
        where,
        f"{value} {what} is more than the {bound} the bound [limits] {key} allows (it "
        "catches a typo before the run does)",
        f"if you mean a run that large, raise it in {file}: [limits] {key} = {value}"
        + (" (python -m sim run NAME --save-scenario FILE writes one)" if file[0] == "a" else ""),
    )


def check_world(world: WorldShape, limits: Limits) -> None:
    """The world's counts within the bounds, each error naming its ``[sim]`` key."""
    for key, limit_key, what in (
        ("num_cells", "cells", "cells"),
        ("num_engines", "engines", "engines"),
        ("num_tensors", "tensors", "tensors"),
        ("param_bytes", "param_bytes", "bytes of parameters"),
        ("gpus_per_node", "gpus", "GPUs on a node"),
    ):
        value = getattr(world, key)
        if value > getattr(limits, limit_key):
            raise over(f"[sim].{key}", what, value, limits, limit_key)
    cell_gpus = world.num_cells * world.gpus_per_cell
    engine_gpus = world.num_engines * world.gpus_per_engine
    if cell_gpus + engine_gpus > limits.gpus:
        key = "gpus_per_cell" if cell_gpus >= engine_gpus else "gpus_per_engine"
        what = (
            f"GPUs in all ({cell_gpus} in cells, {engine_gpus} in engines)"
            if cell_gpus and engine_gpus
            else "GPUs"
        )
        raise over(f"[sim].{key}", what, cell_gpus + engine_gpus, limits, "gpus")


def check_steps(steps: int, limits: Limits, where: str = "[loop].steps") -> None:
    """A run's length within ``limits.steps``; ``where`` is the key or flag that set it."""
    if steps > limits.steps:
        raise over(where, "steps", steps, limits, "steps")


def loop_key(field: str) -> str:
    """A loop field as a scenario file writes it."""
    return f"[loop].{field}"


def check_loop(loop: LoopConfig, limits: Limits, spell: Callable[[str], str] = loop_key) -> None:
    """The samples a step, generating at once and buffered within the bounds, before the loop
    makes a request for any of them; ``spell`` names a loop field as the user wrote it (the
    file's key, or the flag given on the command line)."""
    batch, n = loop.rollout_batch_size, loop.n_samples_per_prompt
    if batch * n > limits.samples:
        key = "rollout_batch_size" if batch >= n else "n_samples_per_prompt"
        what = f"samples a step (rollout_batch_size {batch} x n_samples_per_prompt {n})"
        raise over(spell(key), what, batch * n, limits, "samples")
    concurrent = loop.async_max_concurrent_samples
    if concurrent is not None and concurrent > limits.samples:
        key = "async_max_concurrent_samples"
        raise over(spell(key), "samples generating at once", concurrent, limits, "samples")
    buffered = loop.buffer_config().capacity * n
    if buffered > limits.buffered_samples:
        what = (
            f"samples in the buffer (floor(capacity_factor {loop.capacity_factor:g} x "
            f"rollout_batch_size {batch}) groups of {n})"
        )
        raise over(spell("capacity_factor"), what, buffered, limits, "buffered_samples")
    check_counts(loop, limits, spell)


ATTEMPT_KEYS = (
    "max_step_attempts",
    "max_route_attempts",
    "request_max_retries",
    "flush_cache_max_retries",
    "heartbeat_failure_threshold",
)
STEP_KEYS = ("save_interval", "max_weight_staleness")
"""Counts of steps: a save every 10**18 steps or a staleness of 10**18 steps is no save and no
bound, which a run of at most ``[limits] steps`` steps says better."""


def check_counts(loop: LoopConfig, limits: Limits, spell: Callable[[str], str] = loop_key) -> None:
    """The loop's tries within ``limits.attempts`` and its counts of steps within
    ``limits.steps``, each error naming the field as the user wrote it."""
    for key in ATTEMPT_KEYS:
        value = getattr(loop, key)
        if value > limits.attempts:
            raise over(spell(key), "tries", value, limits, "attempts")
    for key in STEP_KEYS:
        value = getattr(loop, key)
        if value is not None and value > limits.steps:
            raise over(spell(key), "steps", value, limits, "steps")


def check_depth(data: object, source: str) -> None:
    """Tables and arrays no deeper than MAX_DEPTH, walked without recursion (so that a value
    a million deep, or a dict that holds itself, is an error and not a RecursionError)."""
    todo: list[tuple[object, int]] = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list | tuple):
            children = list(value)
        else:
            continue
        if depth > MAX_DEPTH:
            raise depth_error(source)
        todo.extend((child, depth + 1) for child in children)


def depth_error(source: str) -> ConfigError:
    return ConfigError(
        source,
        f"nests tables or arrays more than {MAX_DEPTH} deep",
        "a scenario nests at most three deep (a key of a [[faults]] table); "
        "fix the brackets (this bound is fixed: no scenario comes near it)",
    )
