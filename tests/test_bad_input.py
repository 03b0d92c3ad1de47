"""Bad user input never gives a raw traceback: a ConfigError in the user's own words, or exit 2.

Every mistake in a scenario file or on the command line must name the key as the
user wrote it (``[loop].steps``, ``[sim].num_cells``, ``faults[0] (kill_cell).at``,
``progress_window``, ``expect.error``, ``--check-every``) and say how to fix it,
before anything runs. Nothing is coerced: ``steps = 8.0``, ``"8"`` and ``true``
are errors. The hypothesis tests throw random tables at the loader and the CLI:
a Scenario, a ConfigError or an exit code of 0, 1 or 2, never anything else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import tempfile
import threading
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.__main__ as cli
import sim.cli.run as run_command
from miles_core.errors import ConfigError
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.loop.config import LoopConfig
from miles_core.scenario import (
    PRESETS,
    SCENARIOS,
    Scenario,
    load_scenario_file,
    scenario_from_mapping,
    scenario_from_toml,
    scenario_to_toml,
)
from miles_core.scenario.faults import FAULT_TYPES, TRIGGERS, trigger_keys
from miles_core.scenario.limits import LIMIT_KEYS, MAX_FILE_BYTES, Limits
from miles_core.scenario.liveness import Liveness
from miles_core.scenario.load import MILES_KEYS, TOP_KEYS
from miles_core.scenario.world import (
    SHAPE_COUNTS,
    SHAPE_PACES,
    SHAPE_SWITCHES,
    TIME_COUNTS,
    TIME_KEYS,
    TIME_SWITCHES,
)

SOURCE = "bad.toml"
LOOP_KEYS = tuple(f.name for f in dataclasses.fields(LoopConfig))
SIM_KEYS = tuple(sorted(SHAPE_COUNTS | SHAPE_PACES | TIME_KEYS - set(TIME_SWITCHES)))
"""The [sim] keys that take numbers (SHAPE_SWITCHES take true or false)."""
LIMITS = tuple(sorted(LIMIT_KEYS))
PARAM_KEYS = ("cell", "rank", "engine", "duration", "factor", "seconds", "call")
TRIGGER_KEYS = ("at", "step", "bucket", "after_step", "after_time")
FAULT_KEYS = ("kind", "point", *TRIGGER_KEYS, *PARAM_KEYS)


def toml_string(text: str) -> str:
    """A TOML basic string: quote, backslash and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"no TOML for {value!r}")


def to_toml(data: dict[str, Any]) -> str:
    return "".join(f"{toml_string(k)} = {toml_value(v)}\n" for k, v in data.items())


def load_error(text: str) -> ConfigError:
    """The ConfigError a scenario file's text gives; any other exception fails the test."""
    with pytest.raises(ConfigError) as caught:
        scenario_from_toml(text, SOURCE)
    return caught.value


def mapping_error(data: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        scenario_from_mapping(data, SOURCE)
    return caught.value


def assert_names(error: ConfigError, field: str, *words: str) -> None:
    """The error names exactly ``field``, says a fix, and mentions each of ``words``."""
    assert error.field == field, str(error)
    assert error.fix.strip() and error.problem.strip()
    text = str(error)
    assert text.startswith(f"{field}: ")
    for word in words:
        assert word in text, (word, text)


def fault_toml(**keys: Any) -> str:
    return "[[faults]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())


# -- the corpus: one bad file each, the field it must name --------------------------------

HUGE = "1" + "0" * 400
"""A 401-digit integer: TOML (tomllib) reads it, no float can hold it."""

CORPUS: list[tuple[str, str, str, tuple[str, ...]]] = [
    # id, file text, field, words the message must hold
    ("toml-syntax", "[loop]\nsteps = \n", SOURCE, ("not valid TOML",)),
    ("toml-duplicate-key", "name = 'a'\nname = 'b'\n", SOURCE, ("not valid TOML",)),
    ("sim-not-a-table", "sim = 3\n", "[sim]", ("not a table",)),
    ("loop-not-a-table", 'loop = "fast"\n', "[loop]", ("not a table",)),
    ("expect-not-a-table", 'expect = "failed"\n', "expect", ("not a table",)),
    ("faults-not-a-list", "faults = 1\n", "faults", ("not a list",)),
    ("faults-a-table", "[faults]\nkind = 'kill_cell'\n", "faults", ("not a list",)),
    ("fault-not-a-table", "faults = [1]\n", "faults[0]", ("not a table",)),
    (
        "second-fault-not-a-table",
        "faults = [{kind = 'kill_cell', cell = 0, at = 1.0}, 'x']\n",
        "faults[1]",
        ("not a table",),
    ),
    ("unknown-top-key", "stpes = 8\n", SOURCE, ("stpes", "unknown top-level keys")),
    ("unknown-loop-key", "[loop]\nstpes = 8\n", "[loop]", ("stpes", "steps")),
    ("unknown-sim-key", "[sim]\nnum_cell = 3\n", "[sim]", ("num_cell", "num_cells")),
    # what each unknown key most likely meant, said beside the keys there are
    (
        "loop-flag-with-dashes",
        "[loop]\nrollout-batch-size = 8\n",
        "[loop].rollout-batch-size",
        ("dashes", "write rollout_batch_size"),
    ),
    (
        "loop-key-misspelt",
        "[loop]\nrollout_batch_sise = 8\n",
        "[loop]",
        ("'rollout_batch_sise' may be rollout_batch_size",),
    ),
    ("sim-key-with-dashes", "[sim]\nnum-cells = 3\n", "[sim]", ("as num_cells",)),
    ("loop-key-at-the-top", "steps = 8\n", SOURCE, ("steps belongs under [loop]",)),
    ("sim-key-at-the-top", "num_cells = 3\n", SOURCE, ("num_cells belongs under [sim]",)),
    ("loop-key-misspelt-at-the-top", "stpes = 8\n", SOURCE, ("may be steps, under [loop]",)),
    ("unknown-key-nothing-close", "[loop]\ncolour = 'red'\n", "[loop]", ("use only",)),
    ("unknown-expect-key", "expect = { staus = 'failed' }\n", "expect", ("staus",)),
    (
        "unknown-fault-key",
        fault_toml(kind="kill_cell", cell=1, at=1.0, colour="red"),
        "faults[0] (kill_cell).colour",
        ("would be ignored",),
    ),
    (
        "progress-window-string",
        'progress_window = "abc"\n',
        "progress_window",
        ("'abc'", "finite number"),
    ),
    ("progress-window-zero", "progress_window = 0\n", "progress_window", ("seconds > 0",)),
    ("progress-window-inf", "progress_window = inf\n", "progress_window", ("finite",)),
    ("progress-window-nan", "progress_window = nan\n", "progress_window", ("finite",)),
    ("progress-window-huge-int", f"progress_window = {HUGE}\n", "progress_window", ("finite",)),
    ("max-seconds-negative", "max_seconds = -1.0\n", "max_seconds", ("seconds > 0",)),
    ("until-witnessed-float", "until_witnessed = 20.0\n", "until_witnessed", ("integer",)),
    ("until-witnessed-bool", "until_witnessed = true\n", "until_witnessed", ("integer",)),
    (
        "until-witnessed-below-steps",
        "until_witnessed = 5\n[loop]\nsteps = 8\n",
        "until_witnessed",
        ("got 5", ">= 8"),
    ),
    ("name-not-a-string", "name = 5\n", "name", ("string",)),
    ("description-a-list", "description = ['a']\n", "description", ("string",)),
    ("unknown-preset", "preset = 'tiny'\n", "preset", ("'tiny'", "small")),
    ("preset-not-a-string", "preset = 1\n", "preset", ("string",)),
    # [sim]
    ("num-cells-negative", "[sim]\nnum_cells = -1\n", "[sim].num_cells", ("-1", ">= 1")),
    ("num-cells-zero", "[sim]\nnum_cells = 0\n", "[sim].num_cells", (">= 1",)),
    ("num-cells-float", "[sim]\nnum_cells = 2.0\n", "[sim].num_cells", ("integer",)),
    ("num-cells-bool", "[sim]\nnum_cells = true\n", "[sim].num_cells", ("integer",)),
    ("num-engines-string", "[sim]\nnum_engines = '2'\n", "[sim].num_engines", ("integer",)),
    ("train-step-zero", "[sim]\ntrain_step_seconds = 0\n", "[sim].train_step_seconds", ("> 0",)),
    ("train-step-string", "[sim]\ntrain_step_seconds = '5'\n", "[sim].train_step_seconds", ()),
    (
        "train-step-huge-int",
        f"[sim]\ntrain_step_seconds = {HUGE}\n",
        "[sim].train_step_seconds",
        ("finite",),
    ),
    ("train-jitter-one", "[sim]\ntrain_jitter = 1.0\n", "[sim].train_jitter", ("below 1",)),
    (
        "link-latency-negative",
        "[sim]\nlink_latency_seconds = -0.1\n",
        "[sim].link_latency_seconds",
        (">= 0",),
    ),
    # [loop]
    ("steps-float", "[loop]\nsteps = 8.0\n", "[loop].steps", ("8.0", "integer")),
    ("steps-string", '[loop]\nsteps = "8"\n', "[loop].steps", ("'8'", "integer")),
    ("steps-bool", "[loop]\nsteps = true\n", "[loop].steps", ("True", "integer")),
    ("steps-zero", "[loop]\nsteps = 0\n", "[loop].steps", (">= 1",)),
    ("steps-negative", "[loop]\nsteps = -3\n", "[loop].steps", (">= 1",)),
    ("mode-bad", '[loop]\nmode = "batch"\n', "[loop].mode", ("'batch'", "one_step_off")),
    (
        "handler-keep",
        '[loop]\nunused_samples_handler = "keep"\n',
        "[loop].unused_samples_handler",
        ("'keep'", "retry", "drop"),
    ),
    (
        "transfer-mode-nccl",
        '[loop]\ntransfer_mode = "nccl"\n',
        "[loop].transfer_mode",
        ("broadcast",),
    ),
    ("handler-int", "[loop]\nunused_samples_handler = 1\n", "[loop].unused_samples_handler", ()),
    (
        "staleness-float",
        "[loop]\nmax_weight_staleness = 1.5\n",
        "[loop].max_weight_staleness",
        ("integer",),
    ),
    (
        "staleness-string",
        '[loop]\nmax_weight_staleness = "none"\n',
        "[loop].max_weight_staleness",
        (),
    ),
    (
        "staleness-negative",
        "[loop]\nmax_weight_staleness = -1\n",
        "[loop].max_weight_staleness",
        (">= 0",),
    ),
    (
        "heartbeat-off-string",
        '[loop]\nheartbeat_interval = "off"\n',
        "[loop].heartbeat_interval",
        ("finite number",),
    ),
    ("heartbeat-false", "[loop]\nheartbeat_interval = false\n", "[loop].heartbeat_interval", ()),
    ("heartbeat-zero", "[loop]\nheartbeat_interval = 0\n", "[loop].heartbeat_interval", ("> 0",)),
    (
        "heartbeat-timeout-huge",
        f"[loop]\nheartbeat_timeout = {HUGE}\n",
        "[loop].heartbeat_timeout",
        ("finite",),
    ),
    ("lora-adapter-int", "[loop]\nlora_adapter = 3\n", "[loop].lora_adapter", ("string",)),
    (
        "submission-granularity-unknown",
        '[loop]\nrollout_submission_granularity = "prompt"\n',
        "[loop].rollout_submission_granularity",
        ("group", "sample"),
    ),
    ("capacity-string", '[loop]\ncapacity_factor = "2"\n', "[loop].capacity_factor", ()),
    ("capacity-inf", "[loop]\ncapacity_factor = inf\n", "[loop].capacity_factor", ("finite",)),
    (
        "capacity-below-one-item",
        "[loop]\ncapacity_factor = 0.1\n",
        "[loop].capacity_factor",
        ("at least 1",),
    ),
    (
        "capacity-one-step-off",
        '[loop]\nmode = "one_step_off"\ncapacity_factor = 0.5\n',
        "[loop].capacity_factor",
        ("one_step_off",),
    ),
    ("batch-negative", "[loop]\nrollout_batch_size = -1\n", "[loop].rollout_batch_size", (">= 1",)),
    ("samples-zero", "[loop]\nn_samples_per_prompt = 0\n", "[loop].n_samples_per_prompt", ()),
    (
        "bucket-size-zero",
        "[loop]\nupdate_weight_buffer_size = 0\n",
        "[loop].update_weight_buffer_size",
        (">= 1",),
    ),
    ("in-flight-zero", "[loop]\nin_flight_groups = 0\n", "[loop].in_flight_groups", ()),
    (
        "threshold-zero",
        "[loop]\nheartbeat_failure_threshold = 0\n",
        "[loop].heartbeat_failure_threshold",
        (),
    ),
    ("attempts-zero", "[loop]\nmax_step_attempts = 0\n", "[loop].max_step_attempts", ()),
    (
        "heartbeat-first-wait-negative",
        "[loop]\nheartbeat_first_wait = -1\n",
        "[loop].heartbeat_first_wait",
        (">= 0",),
    ),
    # expect
    (
        "expect-failed-without-error",
        'expect = { status = "failed" }\n',
        "expect.error",
        ("missing", "NoAliveCellError"),
    ),
    (
        "expect-unknown-error",
        'expect = { status = "failed", error = "OOMError" }\n',
        "expect.error",
        ("'OOMError'", "NoAliveCellError"),
    ),
    (
        "expect-error-when-completed",
        'expect = { error = "NoAliveCellError" }\n',
        "expect.error",
        ("failed",),
    ),
    ("expect-stalled", 'expect = { status = "stalled" }\n', "expect.status", ("completed",)),
    ("expect-unknown-status", 'expect = { status = "ok" }\n', "expect.status", ("completed",)),
    ("expect-status-int", "expect = { status = 1 }\n", "expect.status", ()),
    ("expect-error-int", 'expect = { status = "failed", error = 1 }\n', "expect.error", ()),
    # faults: kind and point
    (
        "kind-misspelt",
        fault_toml(kind="kil_cell", cell=1, at=1.0),
        "faults[0].kind",
        ("'kil_cell'", "kill_cell"),
    ),
    ("kind-missing", fault_toml(cell=1, at=1.0), "faults[0].kind", ("kill_cell",)),
    ("kind-int", fault_toml(kind=3, cell=1, at=1.0), "faults[0].kind", ()),
    (
        "point-misspelt",
        fault_toml(kind="kill_cell", cell=1, point="befor_allreduce", step=1),
        "faults[0] (kill_cell).point",
        ("'befor_allreduce'", "before_allreduce"),
    ),
    (
        "point-wrong-for-kind",
        fault_toml(
            kind="slow_cell", cell=0, duration=5.0, factor=2.0, point="before_allreduce", step=1
        ),
        "faults[0] (slow_cell).point",
        ("cannot strike", "step_begin"),
    ),
    (
        "neither-at-nor-point",
        fault_toml(kind="kill_cell", cell=1),
        "faults[0] (kill_cell)",
        ("neither",),
    ),
    (
        "both-at-and-point",
        fault_toml(kind="kill_cell", cell=1, at=1.0, point="step_begin", step=1),
        "faults[0] (kill_cell)",
        ("both",),
    ),
    # faults: trigger keys
    (
        "at-soon",
        fault_toml(kind="kill_cell", cell=1, at="soon"),
        "faults[0] (kill_cell).at",
        ("'soon'", "finite number"),
    ),
    (
        "at-negative",
        fault_toml(kind="kill_cell", cell=1, at=-1.0),
        "faults[0] (kill_cell).at",
        (">= 0",),
    ),
    ("at-bool", fault_toml(kind="kill_cell", cell=1, at=True), "faults[0] (kill_cell).at", ()),
    (
        "after-bucket-with-step",
        fault_toml(kind="kill_cell", cell=0, point="after_bucket", bucket=1, step=5),
        "faults[0] (kill_cell).step",
        ("would be ignored", "after_step"),
    ),
    (
        "before-allreduce-with-after-step",
        fault_toml(kind="kill_cell", cell=0, point="before_allreduce", step=1, after_step=0),
        "faults[0] (kill_cell).after_step",
        ("would be ignored",),
    ),
    (
        "after-time-negative",
        fault_toml(kind="kill_engine", engine="engine-0", point="mid_generation", after_time=-2.0),
        "faults[0] (kill_engine).after_time",
        (">= 0",),
    ),
    (
        "after-time-string",
        fault_toml(kind="kill_engine", engine="engine-0", point="mid_generation", after_time="3"),
        "faults[0] (kill_engine).after_time",
        (),
    ),
    (
        "step-begin-with-after-time",
        fault_toml(kind="kill_cell", cell=0, point="step_begin", step=1, after_time=3.0),
        "faults[0] (kill_cell).after_time",
        ("would be ignored",),
    ),
    (
        "at-with-step",
        fault_toml(kind="kill_cell", cell=0, at=1.0, step=1),
        "faults[0] (kill_cell).step",
        ("a fault at a time",),
    ),
    (
        "step-missing",
        fault_toml(kind="kill_cell", cell=0, point="before_allreduce"),
        "faults[0] (kill_cell).step",
        ("missing",),
    ),
    (
        "bucket-missing",
        fault_toml(kind="kill_cell", cell=0, point="after_bucket"),
        "faults[0] (kill_cell).bucket",
        ("missing",),
    ),
    (
        "step-negative",
        fault_toml(kind="kill_cell", cell=0, point="step_begin", step=-1),
        "faults[0] (kill_cell).step",
        ("from 0",),
    ),
    (
        "step-float",
        fault_toml(kind="kill_cell", cell=0, point="step_begin", step=1.0),
        "faults[0] (kill_cell).step",
        ("integer",),
    ),
    (
        "step-beyond-run",
        "[loop]\nsteps = 3\n"
        + fault_toml(kind="kill_cell", cell=0, point="before_allreduce", step=3),
        "faults[0] (kill_cell).step",
        ("beyond", "--steps"),
    ),
    (
        "after-step-beyond-run",
        fault_toml(kind="kill_cell", cell=0, point="during_heal", after_step=8),
        "faults[0] (kill_cell).after_step",
        ("beyond",),
    ),
    (
        "bucket-beyond-update",
        fault_toml(kind="kill_cell", cell=0, point="after_bucket", bucket=4),
        "faults[0] (kill_cell).bucket",
        ("4 buckets",),
    ),
    # faults: targets and parameters
    (
        "cell-7-of-2",
        fault_toml(kind="kill_cell", cell=7, at=1.0),
        "faults[0] (kill_cell).cell",
        ("does not exist", "0 <= cell <= 1"),
    ),
    (
        "cell-negative",
        fault_toml(kind="kill_cell", cell=-1, at=1.0),
        "faults[0] (kill_cell).cell",
        (">= 0",),
    ),
    (
        "cell-string",
        fault_toml(kind="kill_cell", cell="1", at=1.0),
        "faults[0] (kill_cell).cell",
        ("integer",),
    ),
    (
        "cell-missing",
        fault_toml(kind="stop_cell", at=1.0),
        "faults[0] (stop_cell).cell",
        ("missing",),
    ),
    (
        "engine-9",
        fault_toml(kind="kill_engine", engine="engine-9", at=1.0),
        "faults[0] (kill_engine).engine",
        ("'engine-9'", "engine-0"),
    ),
    (
        "engine-int",
        fault_toml(kind="restart_engine", engine=0, at=1.0),
        "faults[0] (restart_engine).engine",
        ("by id, not by index", 'write engine = "engine-0"'),
    ),
    (
        "engine-index-at-a-point",
        fault_toml(kind="kill_engine", engine=2, point="mid_generation", after_step=1),
        "faults[0] (kill_engine).engine",
        ('write engine = "engine-2"',),
    ),
    (
        "engine-bool",
        fault_toml(kind="hang_engine", engine=True, at=1.0),
        "faults[0] (hang_engine).engine",
        ("string",),
    ),
    (
        "engine-on-a-cell-fault",
        fault_toml(kind="kill_cell", engine="engine-0", cell=0, at=1.0),
        "faults[0] (kill_cell).engine",
        ("would be ignored",),
    ),
    (
        "slow-factor-1.1",
        fault_toml(kind="slow_cell", cell=0, at=1.0, duration=5.0, factor=1.1),
        "faults[0] (slow_cell).factor",
        (">= 1.5",),
    ),
    (
        "slow-duration-zero",
        fault_toml(kind="slow_link", at=1.0, duration=0.0, factor=2.0),
        "faults[0] (slow_link).duration",
        ("> 0",),
    ),
    (
        "router-seconds-negative",
        fault_toml(kind="delay_router", at=1.0, duration=1.0, seconds=-1.0),
        "faults[0] (delay_router).seconds",
        ("> 0",),
    ),
    (
        "factor-missing",
        fault_toml(kind="slow_cell", cell=0, at=1.0, duration=5.0),
        "faults[0] (slow_cell).factor",
        ("missing", "1.5"),
    ),
    (
        "second-fault-named",
        fault_toml(kind="kill_cell", cell=0, at=1.0)
        + fault_toml(kind="start_cell", cell=0, at="later"),
        "faults[1] (start_cell).at",
        (),
    ),
    # hang_engine takes every point but mid_generation (a process exiting halfway through)
    (
        "hang-engine-mid-generation",
        fault_toml(kind="hang_engine", engine="engine-0", point="mid_generation"),
        "faults[0] (hang_engine).point",
        ("cannot strike at mid_generation", "'step_begin'", "'after_bucket'", "'at'"),
    ),
    # two identical faults: the second strikes nothing, yet would pass its witness
    (
        "duplicate-fault",
        fault_toml(kind="kill_cell", cell=1, at=1.0) + fault_toml(kind="kill_cell", cell=1, at=1),
        "faults[1] (kill_cell)",
        ("same fault as faults[0]", "kill_cell cell 1 at t=1", "remove one of faults[0] and"),
    ),
    (
        "duplicate-fault-at-a-point",
        fault_toml(kind="restart_engine", engine="engine-1", point="step_begin", step=2)
        + fault_toml(kind="kill_cell", cell=0, at=3.0)
        + fault_toml(kind="restart_engine", engine="engine-1", point="step_begin", step=2),
        "faults[2] (restart_engine)",
        ("same fault as faults[0]", "engine-1 step_begin step=2", "faults[2]"),
    ),
    # bounds: a count past its bound names the key and the [limits] key that raises it
    (
        "num-cells-100-million",
        "[sim]\nnum_cells = 100000000\n",
        "[sim].num_cells",
        ("100000000 cells", "1024", "[limits] cells = 100000000"),
    ),
    (
        "num-engines-2-63",
        "[sim]\nnum_engines = 9223372036854775807\n",
        "[sim].num_engines",
        ("4096", "[limits] engines = 9223372036854775807"),
    ),
    (
        "num-tensors-huge",
        "[sim]\nnum_tensors = 1000000\n",
        "[sim].num_tensors",
        ("65536", "[limits] tensors = 1000000"),
    ),
    (
        "gpus-per-cell-huge",
        "[sim]\ngpus_per_cell = 100000\n",
        "[sim].gpus_per_cell",
        ("200002 GPUs in all", "[limits] gpus = 200002"),
    ),
    (
        "gpus-per-engine-huge",
        "[sim]\nnum_engines = 4000\ngpus_per_engine = 64\n",
        "[sim].gpus_per_engine",
        ("256002 GPUs in all", "[limits] gpus"),
    ),
    ("gpus-per-node-huge", "[sim]\ngpus_per_node = 70000\n", "[sim].gpus_per_node", ("gpus",)),
    (
        "param-bytes-401-digits",
        f"[sim]\nparam_bytes = {HUGE}\n",
        "[sim].param_bytes",
        ("[limits] param_bytes",),
    ),
    (
        "steps-2-63",
        "[loop]\nsteps = 9223372036854775807\n",
        "[loop].steps",
        ("100000", "[limits] steps = 9223372036854775807"),
    ),
    (
        "until-witnessed-2-63",
        "until_witnessed = 9223372036854775807\n",
        "until_witnessed",
        ("[limits] steps = 9223372036854775807",),
    ),
    ("limits-not-a-table", "limits = 5\n", "[limits]", ("not a table",)),
    ("limits-unknown-key", "[limits]\ncels = 4096\n", "[limits]", ("'cels' may be cells",)),
    ("limits-key-at-the-top", "cells = 4096\n", SOURCE, ("cells belongs under [limits]",)),
    ("limits-float", "[limits]\nsteps = 1e6\n", "[limits].steps", ("integer",)),
    ("limits-lowered", "[limits]\ncells = 2\n", "[limits].cells", (">= 1024", "never lowers")),
    (
        "limits-past-a-float",
        f"[limits]\nparam_bytes = {HUGE}\n",
        "[limits].param_bytes",
        ("at most 1000000000000000000",),
    ),
    # an empty file ran the defaults and passed; nesting past any scenario's
    ("empty-file", "", SOURCE, ("is empty", "sets no key")),
    ("only-comments", "# my scenario\n\n   \n", SOURCE, ("is empty",)),
    ("nested-20-deep", "name = " + "[" * 20 + "]" * 20 + "\n", SOURCE, ("more than 16 deep",)),
    (
        "toml-nested-100000-deep",  # tomllib's RecursionError (a 2,995-line traceback)
        "name = " + "[" * 100_000 + "]" * 100_000 + "\n",
        SOURCE,
        ("more than 16 deep",),
    ),
    (
        "toml-inline-tables-100000-deep",
        "x = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n",
        SOURCE,
        ("more than 16 deep",),
    ),
    # [miles] profile: a bad value named as written (it was named [loop].miles_profile)
    ("miles-profile-misspelt", '[miles]\nprofile = "aug"\n', "[miles].profile", ("aug2026",)),
    ("miles-profile-a-number", "[miles]\nprofile = 2026\n", "[miles].profile", ("today",)),
    ("miles-not-a-table", "miles = 0\n", "[miles]", ("not a table",)),
    ("miles-unknown-key", '[miles]\nversion = "today"\n', "[miles]", ("profile",)),
    (
        "miles-profile-twice",
        '[miles]\nprofile = "today"\n[loop]\nmiles_profile = "today"\n',
        "[loop].miles_profile",
        ("[miles]",),
    ),
]


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [pytest.param(text, field, words, id=name) for name, text, field, words in CORPUS],
)
def test_a_bad_file_names_the_key_as_written(text: str, field: str, words: tuple[str, ...]):
    assert_names(load_error(text), field, *words)


def test_the_corpus_files_are_valid_toml_except_the_syntax_cases() -> None:
    """Each case is a loader error, not a mistake in the test's own TOML."""
    for name, text, _, _ in CORPUS:
        if name.startswith("toml-"):
            continue
        tomllib.loads(text)


@pytest.mark.parametrize("value", [8.0, "8", True, [8], {"n": 8}, None])
def test_nothing_is_coerced_into_steps(value: Any) -> None:
    assert_names(mapping_error({"loop": {"steps": value}}), "[loop].steps", repr(value))


def _bad_values(hint: Any) -> list[Any]:
    """Values of the wrong type for a field typed ``hint`` (TOML can write all of them)."""
    options = set(typing.get_args(hint)) if typing.get_args(hint) else {hint}
    options.discard(type(None))
    bad = []
    if bool in options:
        bad += [1, "true", 0.0]
    elif int in options:
        bad += [8.0, "8", True]
    elif float in options:
        bad += ["2.0", True, math.inf]
    elif str in options:
        bad += [3, 1.5, True, ["x"]]
    else:  # an enum
        bad += ["no-such-value", 1, True]
    return [*bad, [1], {"a": 1}]


LOOP_HINTS = typing.get_type_hints(LoopConfig)


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, value) for key in LOOP_KEYS for value in _bad_values(LOOP_HINTS[key])],
)
def test_every_loop_field_rejects_the_wrong_type(key: str, value: Any) -> None:
    assert_names(mapping_error({"loop": {key: value}}), f"[loop].{key}", repr(value))
    text = f"[loop]\n{key} = {toml_value(value)}\n"
    assert_names(load_error(text), f"[loop].{key}")


@pytest.mark.parametrize(("key", "value"), [(k, v) for k in SIM_KEYS for v in ("1", True, -1)])
def test_every_sim_field_rejects_wrong_types_and_negatives(key: str, value: Any) -> None:
    assert_names(mapping_error({"sim": {key: value}}), f"[sim].{key}", repr(value))


@pytest.mark.parametrize(
    ("key", "value"), [(k, 2.0) for k in sorted({*SHAPE_COUNTS, *TIME_COUNTS})]
)
def test_world_counts_take_no_floats(key: str, value: Any) -> None:
    assert_names(mapping_error({"sim": {key: value}}), f"[sim].{key}", "integer")


@pytest.mark.parametrize(
    ("key", "value"), [(k, v) for k in (*SHAPE_SWITCHES, *TIME_SWITCHES) for v in ("1", 1, 0.0)]
)
def test_world_switches_take_only_true_or_false(key: str, value: Any) -> None:
    assert_names(mapping_error({"sim": {key: value}}), f"[sim].{key}", "true or false")


# -- every fault kind at every point it takes, and a key that point would ignore -----------

PARAM_VALUES = {
    "cell": 0,
    "rank": 0,
    "engine": "engine-0",
    "duration": 5.0,
    "factor": 2.0,
    "seconds": 1.0,
    "call": "flush_cache",
}
TRIGGER_VALUES = {"at": 1.0, "step": 1, "bucket": 1, "after_step": 1, "after_time": 2.5}


def _fault(kind: FaultKind, point: FaultPoint | None) -> dict[str, Any]:
    cls = FAULT_TYPES[kind]
    fault: dict[str, Any] = {"kind": kind.value}
    if point is not None:
        fault["point"] = point.value
    fault |= {k: TRIGGER_VALUES[k] for k in trigger_keys(TRIGGERS[point])}
    fault |= {k: v for k, v in PARAM_VALUES.items() if k in cls.__dataclass_fields__}
    return fault


KIND_POINTS = [
    (kind, point)
    for kind, cls in FAULT_TYPES.items()
    for point in sorted(cls.points, key=lambda p: p.value if p else "")
]


DELTA = {"loop": {"transfer_mode": "disk-delta"}}
KIND_NEEDS: dict[FaultKind, dict[str, dict[str, Any]]] = {
    FaultKind.DELTA_APPLIED_TWICE: DELTA,
    FaultKind.DELTA_SKIPPED: DELTA,
    FaultKind.DELTA_TORN: DELTA,
    FaultKind.RAISE_HOLDING_LOCK: {"sim": {"gpus_per_cell": 2}},  # and today, the default
}
"""What a kind needs of the world to load, by section: the delta faults act on disk-delta's
files, raise_holding_lock on today's ticket lock, taken only by cells of several ranks."""


def _context(kind: FaultKind, point: FaultPoint | None) -> str:
    """The sections a fault of this kind at this point needs beside it (a save to strike
    during, the world its kind acts on), as TOML text."""
    sections = {name: dict(keys) for name, keys in KIND_NEEDS.get(kind, {}).items()}
    if point is FaultPoint.DURING_SAVE:
        sections.setdefault("loop", {})["save_interval"] = 2
    return "".join(
        f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())
        for name, keys in sections.items()
    )


def test_each_kinds_needs_are_needed() -> None:
    """Each entry of KIND_NEEDS is there because the kind does not load without it."""
    for kind in KIND_NEEDS:
        point = sorted(FAULT_TYPES[kind].points, key=lambda p: p.value if p else "")[0]
        assert_names(load_error(fault_toml(**_fault(kind, point))), f"faults[0] ({kind.value})")


@pytest.mark.parametrize(("kind", "point"), KIND_POINTS)
def test_each_kind_and_point_loads_and_rejects_a_key_it_would_ignore(
    kind: FaultKind, point: FaultPoint | None
) -> None:
    fault = _fault(kind, point)
    saves = _context(kind, point)  # a save to strike during, the world the kind acts on
    scenario = scenario_from_toml(saves + fault_toml(**fault), SOURCE)
    assert scenario.faults[0].kind is kind and scenario.faults[0].point is point
    where = f"faults[0] ({kind.value})"
    for key in (*TRIGGER_KEYS, *PARAM_KEYS):
        if key in fault or (point is not None and key == "at"):
            continue
        stray = fault | {key: TRIGGER_VALUES.get(key, PARAM_VALUES.get(key))}
        assert_names(load_error(saves + fault_toml(**stray)), f"{where}.{key}", "would be ignored")
    for key in fault.keys() - {"kind", "point", "after_step", "after_time"}:  # optional keys
        missing = {k: v for k, v in fault.items() if k != key}
        error = load_error(saves + fault_toml(**missing))
        assert error.field in (f"{where}.{key}", where), str(error)


@pytest.mark.parametrize(
    "point", [p for p in FaultPoint if p not in FAULT_TYPES[FaultKind.SLOW_CELL].points]
)
def test_a_window_fault_at_a_point_it_cannot_take(point: FaultPoint) -> None:
    fault = _fault(FaultKind.SLOW_CELL, None) | {"point": point.value}
    fault.pop("at")
    fault |= {k: TRIGGER_VALUES[k] for k in trigger_keys(TRIGGERS[point])}
    assert_names(load_error(fault_toml(**fault)), "faults[0] (slow_cell).point", "cannot strike")


def test_drop_heartbeat_loads_with_the_default_heartbeats_and_not_without_them() -> None:
    """The default loop checks heartbeats; TOML cannot switch them off (no null), a dict can."""
    fault = {"kind": "drop_heartbeat", "cell": 0, "at": 1.0, "duration": 3.0}
    assert scenario_from_mapping({"faults": [fault]}).faults[0].kind is FaultKind.DROP_HEARTBEAT
    error = mapping_error({"loop": {"heartbeat_interval": None}, "faults": [fault]})
    assert_names(error, "faults[0] (drop_heartbeat)", "[loop].heartbeat_interval")


def test_a_bucket_past_a_lora_update_is_counted_on_the_adapter() -> None:
    """With a LoRA adapter the update is one unit: one bucket, so bucket 1 never arrives."""
    fault = {"kind": "kill_cell", "cell": 0, "point": "after_bucket", "bucket": 1}
    error = mapping_error({"loop": {"lora_adapter": "a"}, "faults": [fault]})
    assert_names(error, "faults[0] (kill_cell).bucket", "1 buckets")


def test_the_dict_api_takes_no_keys_toml_could_not_write() -> None:
    assert_names(mapping_error({1: 2, "name": "x"}), SOURCE, "unknown top-level keys")
    assert_names(mapping_error({"loop": {1: 2, "stpes": 3}}), "[loop]", "stpes")
    assert_names(mapping_error({"sim": {None: 2, "x": 3}}), "[sim]", "None")
    fault = {"kind": "kill_cell", "cell": 0, "at": 1.0, 5: 1}
    assert_names(mapping_error({"faults": [fault]}), "faults[0] (kill_cell).5")
    assert_names(mapping_error([("name", "x")]), SOURCE, "not a table")


@pytest.mark.parametrize(
    "loop",
    [{"capacity_factor": 1e308}, {"rollout_batch_size": 10**400}],
    ids=["capacity-1e308", "batch-401-digits"],
)
def test_a_buffer_capacity_too_large_for_a_float(loop: dict[str, Any]) -> None:
    error = mapping_error({"loop": loop})
    assert error.field.startswith("[loop].")


# -- files on disk -------------------------------------------------------------------------


def test_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_scenario_file(tmp_path / "nope.toml")
    assert_names(caught.value, "scenario", "does not exist")
    with pytest.raises(ConfigError) as caught:
        load_scenario_file(tmp_path)
    assert_names(caught.value, "scenario", "cannot read")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"name = '\xff\xfe'\n")
    with pytest.raises(ConfigError) as caught:
        load_scenario_file(binary)
    assert_names(caught.value, "scenario", "cannot read")


def test_a_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[loop\nsteps = 3\n")
    with pytest.raises(ConfigError) as caught:
        load_scenario_file(path)
    assert_names(caught.value, str(path), "not valid TOML", "line 1")


def _load_within(path: Path | str, seconds: float = 10.0) -> ConfigError:
    """The ConfigError loading ``path`` gives, in a thread: a FIFO used to block forever and
    /dev/zero to read until MemoryError, so a hang or a long read fails the test instead."""
    caught: list[BaseException] = []

    def load() -> None:
        try:
            load_scenario_file(path)
        except BaseException as error:  # handed to the test thread
            caught.append(error)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"loading {path} still runs after {seconds} s"
    assert len(caught) == 1 and isinstance(caught[0], ConfigError), caught
    return caught[0]


def test_only_a_regular_file_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    for path, kind in [
        ("/dev/zero", "a character device"),
        (fifo, "a FIFO"),
        (tmp_path, "a directory"),
    ]:
        assert_names(_load_within(path), "scenario", kind, "not a regular file", str(path))


def test_a_file_past_16_mib_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with big.open("wb") as f:  # sparse: 16 MiB of holes cost no disk
        f.truncate(MAX_FILE_BYTES + 1)
    assert_names(_load_within(big), "scenario", "16 MiB", "scenario_from_mapping")
    at_bound = tmp_path / "at-bound.toml"
    at_bound.write_bytes(b"name = 'x'\n" + b" " * (MAX_FILE_BYTES - 11))
    assert load_scenario_file(at_bound).name == "x"  # the bound itself is allowed


# -- bounds on the world, the run and the faults -------------------------------------------

BOUNDS = [
    # (the key as written, its table, the [limits] key, the largest value the default
    # allows, what one more asks of the bound)
    ("num_cells", "sim", "cells", 1024, 1025),
    ("num_engines", "sim", "engines", 4096, 4097),
    ("num_tensors", "sim", "tensors", 65536, 65537),
    ("param_bytes", "sim", "param_bytes", 10**15, 10**15 + 1),
    ("gpus_per_node", "sim", "gpus", 65536, 65537),
    ("gpus_per_cell", "sim", "gpus", 32767, 65538),  # 2 cells of it, and 2 engines of 1 GPU
    ("steps", "loop", "steps", 100_000, 100_001),
]


@pytest.mark.parametrize(
    ("key", "table", "limit", "largest", "asked"), BOUNDS, ids=[b[0] for b in BOUNDS]
)
def test_each_bound_takes_its_largest_value_and_its_limits_key_raises_it(
    key: str, table: str, limit: str, largest: int, asked: int
) -> None:
    """At the bound loads; one past it is an error naming the key and the [limits] key that
    raises it; raised so, it loads, and the raised bound survives --save-scenario's TOML."""
    assert scenario_from_mapping({table: {key: largest}}) is not None
    error = mapping_error({table: {key: largest + 1}})
    assert_names(error, f"[{table}].{key}", f"[limits] {limit} = {asked}")
    raised = scenario_from_mapping({"limits": {limit: asked}, table: {key: largest + 1}})
    assert getattr(raised.limits, limit) == asked
    assert scenario_from_toml(scenario_to_toml(raised), "again.toml") == raised


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_and_library_scenario_keeps_within_the_default_bounds(preset: str) -> None:
    """The bounds are generous: production-64x256 (512 + 1,024 GPUs) and Kimi-K2 load."""
    assert scenario_from_mapping({"preset": preset}).limits == Limits()
    assert all(s.limits == Limits() for s in SCENARIOS.values())


def test_more_faults_than_the_bound_are_refused_before_each_is_read() -> None:
    """200,000 faults sat in the oracles for a minute; 10,001 are refused at once, before
    any is checked (these are not even faults), and [limits] faults lets them in."""
    assert_names(mapping_error({"faults": [{"kind": "nope"}] * 10_001}), "faults", "10001")
    error = mapping_error({"faults": [{"kind": "nope"}] * 10_001})
    assert "[limits] faults = 10001" in str(error)
    many = [{"kind": "kill_cell", "cell": 0, "at": float(i)} for i in range(10_001)]
    scenario = scenario_from_mapping({"limits": {"faults": 10_001}, "faults": many})
    assert len(scenario.faults) == 10_001
    with pytest.raises(ConfigError) as caught:  # the dict API's Scenario keeps the bound too
        dataclasses.replace(scenario, limits=Limits())
    assert_names(caught.value, "faults", "[limits] faults")


def test_a_steps_bound_raised_in_a_file_lets_steps_through_but_no_further() -> None:
    scenario = scenario_from_mapping({"limits": {"steps": 200_000}})
    assert scenario.with_run(steps=200_000).loop.steps == 200_000
    with pytest.raises(ConfigError) as caught:
        scenario.with_run(steps=200_001)
    assert_names(caught.value, "--steps", "200000", "[limits] steps = 200001")


def test_a_mapping_nested_without_end_is_an_error_not_a_recursion() -> None:
    loop: dict[str, Any] = {}
    loop["x"] = loop  # a dict that holds itself: a walk that recursed would never end
    assert_names(mapping_error({"loop": loop}), SOURCE, "more than 16 deep")
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    assert_names(mapping_error({"name": deep}), SOURCE, "more than 16 deep")


def test_identical_faults_are_one_too_many_but_the_same_fault_at_two_moments_is_not() -> None:
    kill = {"kind": "kill_cell", "cell": 1, "point": "before_allreduce", "step": 2}
    error = mapping_error({"faults": [kill, dict(kill)]})
    assert_names(error, "faults[1] (kill_cell)", "faults[0]", "before_allreduce step=2")
    later = kill | {"step": 3}
    other = kill | {"cell": 0}
    assert len(scenario_from_mapping({"faults": [kill, later, other]}).faults) == 3


# -- the command line ----------------------------------------------------------------------


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Exit 2 with nothing on stdout; the stderr text."""
    with pytest.raises(SystemExit) as caught:
        cli.main(list(argv))
    assert caught.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "error:" in err and "Traceback" not in err
    return err


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The run command's run_scenario (sim/cli/run.py) replaced by a recorder: a run that
    happens fails the test."""
    calls: list[Any] = []
    monkeypatch.setattr(run_command, "run_scenario", lambda *a, **k: calls.append(a) or 1 / 0)
    return calls


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--check-every", "0"], ("--check-every", "got 0", ">= 1")),
        (["run", "--check-every", "-2"], ("--check-every", ">= 1")),
        (["run", "--steps", "0"], ("--steps", ">= 1")),
        (["run", "--steps", "8.0"], ("--steps", "invalid int value")),
        (["run", "--steps", "abc"], ("--steps", "invalid int value")),
        (["run", "--seed", "x"], ("--seed", "invalid int value")),
        (["run", "--check-every", "x"], ("--check-every", "invalid int value")),
        (["run", "no_such_scenario"], ("scenario", "python -m sim list")),
        (["run", "no_such_file.toml"], ("scenario", "does not exist")),
        (["run", "--steps", "1"], ("faults[0] (kill_cell).step", "--steps")),
        (["run", "--bogus"], ("unrecognized arguments", "--bogus")),
        (["bench", "--steps", "0"], ("--steps", ">= 1")),
        (["bench", "--repeats", "0"], ("--repeats", ">= 1")),
        # bounds: 2**63 - 1 or 10**20 steps used to run on
        (["run", "--steps", "100000000000000000000"], ("--steps", "[limits] steps = 1000")),
        (["run", "swarm", "--steps", "9223372036854775807"], ("--steps", "[limits] steps")),
        (["bench", "--steps", "1000000"], ("--steps", "at most 100000")),
        (["sweep", "--steps", "100000000000000000000"], ("--steps", "[limits] steps")),
        (
            ["sweep", "--scenario", "cell_crash_before_allreduce", "--steps", "1"],
            ("faults[0] (kill_cell).step", "--steps"),
        ),
        (["run", "/dev/zero"], ("scenario", "a character device", "not a regular file")),
        (["nope"], ("invalid choice",)),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_bad_argument_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], no_run: list[Any], argv: list[str], words: tuple[str, ...]
) -> None:
    err = cli_error(capsys, *argv)
    for word in words:
        assert word in err, (word, err)
    assert not no_run


@pytest.mark.parametrize("flag", ["--trace", "--save-scenario"])
def test_an_unwritable_output_path_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_run: list[Any], flag: str
) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "out.json"
    err = cli_error(capsys, "run", "--steps", "4", flag, str(missing))
    assert flag in err and "does not exist" in err and str(missing.parent) in err
    assert not no_run and not missing.parent.exists()
    err = cli_error(capsys, "run", flag, str(tmp_path))
    assert flag in err and "is a directory" in err
    assert not no_run


def test_two_outputs_on_one_path_exit_2_naming_both(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_run: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--trace and --metrics on one file wrote the trace, then the metrics over it, and both
    were reported written; an output on the scenario file destroyed the input."""
    out = tmp_path / "out.json"
    (tmp_path / "link.json").symlink_to(out)
    scenario = tmp_path / "s.toml"
    scenario.write_text("[loop]\nsteps = 4\n")
    bench = tmp_path / "bench.json"
    bench.write_text("{}")
    import sim.cli.shrink

    monkeypatch.setattr(sim.cli.shrink, "run_scenario", lambda *a, **k: 1 / 0)
    for argv, first, second in [
        (["run", "--trace", str(out), "--metrics", str(out)], "--trace", "--metrics"),
        (
            ["run", "--metrics", str(out), "--save-scenario", f"{tmp_path}/./out.json"],
            "--metrics",
            "--save-scenario",
        ),
        (
            ["run", "--trace", str(out), "--metrics", str(tmp_path / "link.json")],
            "--trace",
            "--metrics",
        ),
        (["run", str(scenario), "--trace", str(scenario)], "the scenario file", "--trace"),
        (
            ["run", str(scenario), "--save-scenario", str(scenario)],
            "the scenario file",
            "--save-scenario",
        ),
        (["shrink", str(scenario), "--out", str(scenario)], "the scenario file", "--out"),
        (["calibrate", str(bench), "--out", str(bench)], "bench", "--out"),
    ]:
        err = cli_error(capsys, *argv)
        assert f"error: {second}: " in err and f"the path of {first} too" in err, err
        assert "give" in err and "a path of its own" in err
    assert not no_run and not out.exists() and scenario.read_text() == "[loop]\nsteps = 4\n"
    assert bench.read_text() == "{}"


def test_outputs_may_share_a_device(capsys: pytest.CaptureFixture[str]) -> None:
    """The control: /dev/null takes any number of outputs, on purpose."""
    argv = ["run", "--steps", "8", "--trace", "/dev/null", "--metrics", "/dev/null", "--json"]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 8


def test_an_empty_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_run: list[Any]
) -> None:
    """It ran the defaults and exited 0."""
    path = tmp_path / "empty.toml"
    path.write_text("")
    err = cli_error(capsys, "run", str(path))
    assert f"{path}: is empty" in err and not no_run


def test_a_bad_scenario_file_exits_2_naming_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_run: list[Any]
) -> None:
    for text, field in [
        ("[sim]\nnum_cells = -1\n", "[sim].num_cells"),
        ("[loop]\nsteps = 8.0\n", "[loop].steps"),
        ('[loop]\nmode = "synchronous"\n', "[loop].mode"),
        (fault_toml(kind="kill_cell", cell=7, at=1.0), "faults[0] (kill_cell).cell"),
        ("[loop\n", "not valid TOML"),
    ]:
        path = tmp_path / "bad.toml"
        path.write_text(text)
        err = cli_error(capsys, "run", str(path), "--steps", "2")
        assert field in err, (field, err)
    assert not no_run


def test_a_good_file_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The control: the checks above reject what is wrong, not everything."""
    path = tmp_path / "ok.toml"
    path.write_text(fault_toml(kind="kill_cell", cell=1, point="before_allreduce", step=0))
    assert cli.main(["run", str(path), "--steps", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 1


# -- random tables: a Scenario or a ConfigError, nothing else -------------------------------


JUNK_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-. 0[]", min_size=1, max_size=10)
WORDS = st.sampled_from(
    [
        "",
        "8",
        "2.0",
        "true",
        "engine-0",
        "engine-1",
        "engine-9",
        "completed",
        "failed",
        "stalled",
        "retry",
        "drop",
        "keep",
        "broadcast",
        "p2p",
        "sync",
        "fully_async",
        "one_step_off",
        "NoAliveCellError",
        "OOMError",
        "small",
        "tiny",
        "kill_cell",
        "before_allreduce",
        "after_bucket",
        "at",
    ]
)
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)


HUGE_NUMBERS = st.sampled_from(
    [2**63 - 1, -(2**63), 10**30, 10**400, -(10**400), 1e308, -1e308, math.inf, -math.inf]
)
"""TOML reads integers of any length (tomllib) and inf; a float holds neither."""


def scalars(moderate: bool) -> st.SearchStrategy[Any]:
    """Numbers, bools and strings; ``moderate`` leaves out what would make a run long."""
    if moderate:
        numbers = st.one_of(
            st.integers(-2, 6), st.sampled_from([-1.0, 0.0, 0.5, 1.1, 2.0, 3.5, 8.0])
        )
        return st.one_of(numbers, st.booleans(), WORDS)
    numbers = st.one_of(
        st.integers(-3, 12),
        HUGE_NUMBERS,
        st.integers(),
        st.floats(allow_nan=False),
        st.just(math.inf),
    )
    return st.one_of(numbers, st.booleans(), WORDS, TEXT)


def anything(moderate: bool) -> st.SearchStrategy[Any]:
    """Any TOML value: scalars, arrays and tables, nested."""
    return st.recursive(
        scalars(moderate),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(JUNK_KEYS, inner, max_size=3)
        ),
        max_leaves=5,
    )


BOUNDED = {
    # Loading a world walks its engines (an engine fault) and its tensors (a bucket fault):
    # a count up to the bound can take a second, so few are drawn; past the bound (10**30,
    # 2**63 - 1) the loader refuses it before walking anything ([limits], limits.py).
    "num_engines": st.one_of(st.integers(-2, 64), st.sampled_from([2**63 - 1, 10**30])),
    "num_tensors": st.one_of(st.integers(-2, 64), st.sampled_from([2**63 - 1, 10**30])),
    # test_a_buffer_capacity_too_large_for_a_float: the buffer's own overflow, left to it.
    "capacity_factor": st.one_of(st.floats(-1.0, 4.0), st.floats(-2.0, 1e6)),
    "rollout_batch_size": st.one_of(st.integers(-2, 8), st.integers(-2, 10**6)),
}
PLAUSIBLE = {
    "cell": st.integers(-1, 3),
    "engine": st.sampled_from(["engine-0", "engine-1", "engine-9", "", "0"]),
    "at": st.floats(-1.0, 20.0),
    "step": st.integers(-1, 9),
    "after_step": st.integers(-1, 9),
    "bucket": st.integers(-1, 5),
    "duration": st.floats(-1.0, 10.0),
    "factor": st.floats(0.0, 4.0),
    "seconds": st.floats(-1.0, 3.0),
    "kind": st.sampled_from([k.value for k in FaultKind]),
    "point": st.sampled_from([p.value for p in FaultPoint]),
    "status": st.sampled_from(["completed", "failed", "failed", "stalled"]),
    "error": st.sampled_from(["NoAliveCellError", "RetriesExhaustedError", "KeyError"]),
    "steps": st.integers(-1, 12),
    "mode": st.sampled_from(["fully_async", "one_step_off", "sync"]),
    "unused_samples_handler": st.sampled_from(["retry", "drop", "keep"]),
    "staleness_policy": st.sampled_from(["drop_at_buffer", "gate_submission", "gate"]),
    "transfer_mode": st.sampled_from(["broadcast", "p2p", "rdt", "nccl"]),
    "profile": st.sampled_from(["today", "aug2026", "Today", "31f1ca9"]),
    "preset": st.sampled_from(["small", "qwen3-30b-a3b-4x8-h100"]),
    "progress_window": st.floats(0.0, 1000.0),
    "max_seconds": st.floats(0.0, 1000.0),
    "max_weight_staleness": st.integers(-1, 4),
    "in_flight_groups": st.integers(-1, 8),
    "heartbeat_failure_threshold": st.integers(-1, 4),
    "max_step_attempts": st.integers(-1, 4),
    "max_route_attempts": st.integers(-1, 4),
    "n_samples_per_prompt": st.integers(-1, 4),
    "update_weight_buffer_size": st.integers(-1, 2**27),
    "heartbeat_interval": st.floats(-1.0, 10.0),
    "heartbeat_timeout": st.floats(-1.0, 10.0),
    **{k: st.integers(-1, 8) for k in SHAPE_COUNTS},
    **{k: st.booleans() for k in SHAPE_SWITCHES},
    **{k: st.integers(getattr(Limits(), k) - 1, getattr(Limits(), k) + 2) for k in LIMIT_KEYS},
    **{k: st.floats(-1.0, 20.0) for k in TIME_KEYS},
}


def rare(draw: st.DrawFn, one_in: int) -> bool:
    """True about once in ``one_in`` draws (false is what hypothesis shrinks towards)."""
    return draw(st.integers(1, one_in)) == one_in


@st.composite
def value_for(draw: st.DrawFn, key: str, moderate: bool, one_in: int = 6) -> Any:
    """Mostly what the key takes (so the deeper checks are reached), else anything at all."""
    plausible = PLAUSIBLE.get(key, scalars(moderate))
    if moderate and key in TIME_KEYS:
        plausible = st.sampled_from([0.05, 0.5, 1.0, 5.0, 0.0])
    rest = st.one_of(scalars(moderate), anything(moderate))
    if not moderate:
        rest = st.one_of(HUGE_NUMBERS, rest)
    if key in BOUNDED:
        plausible = BOUNDED[key]
        rest = st.one_of(st.booleans(), WORDS, st.lists(st.integers(0, 3), max_size=2))
    return draw(rest if rare(draw, one_in) else plausible)


@st.composite
def tables(draw: st.DrawFn, keys: tuple[str, ...], moderate: bool, size: int = 4) -> Any:
    """A table of mostly known keys (now and then an unknown one, or no table at all)."""
    if rare(draw, 16):
        return draw(anything(moderate))
    names = draw(st.lists(st.sampled_from(keys), max_size=size, unique=True))
    table = {name: draw(value_for(name, moderate)) for name in names}
    if rare(draw, 10):
        table[draw(JUNK_KEYS)] = draw(anything(moderate))
    return table


@st.composite
def faults(draw: st.DrawFn, moderate: bool) -> Any:
    """A fault that usually has the keys its kind and point take, now and then one too many."""
    if rare(draw, 20):
        return draw(anything(moderate))
    kind = draw(st.one_of(WORDS, TEXT) if rare(draw, 12) else PLAUSIBLE["kind"])
    point = draw(st.one_of(st.none(), st.none(), PLAUSIBLE["point"]))
    if rare(draw, 12):
        point = draw(st.one_of(WORDS, anything(moderate)))
    fault: dict[str, Any] = {} if rare(draw, 20) else {"kind": kind}
    if point is not None:
        fault["point"] = point
    wanted: list[str] = []
    if isinstance(kind, str) and kind in FaultKind._value2member_map_:
        cls = FAULT_TYPES[FaultKind(kind)]
        wanted += [k for k in PARAM_KEYS if k in cls.__dataclass_fields__]
    if point is None or (isinstance(point, str) and point in FaultPoint._value2member_map_):
        wanted += trigger_keys(TRIGGERS[FaultPoint(point) if point else None])
    for key in wanted:
        if not rare(draw, 12):
            fault[key] = draw(value_for(key, moderate, one_in=10))
    if rare(draw, 8):
        fault[draw(st.one_of(st.sampled_from(FAULT_KEYS), JUNK_KEYS))] = draw(
            value_for("", moderate, one_in=3)
        )
    return fault


@st.composite
def scenario_tables(draw: st.DrawFn, moderate: bool = False) -> dict[str, Any]:
    """A scenario file's tables, each key present or not, mostly right, now and then wrong."""
    data: dict[str, Any] = {}
    for key in TOP_KEYS:
        if not draw(st.booleans()):
            continue
        if key == "sim":
            data[key] = draw(tables(SIM_KEYS, moderate))
        elif key == "loop":
            data[key] = draw(tables(LOOP_KEYS, moderate))
        elif key == "limits":
            data[key] = draw(tables(LIMITS, moderate, size=2))
        elif key == "miles":
            data[key] = draw(tables(tuple(MILES_KEYS), moderate, size=1))
        elif key == "expect":
            data[key] = draw(tables(("status", "error"), moderate, size=2))
        elif key == "faults":
            many = st.lists(faults(moderate), max_size=3)
            data[key] = draw(anything(moderate) if rare(draw, 16) else many)
        elif key in ("name", "description"):
            data[key] = draw(scalars(moderate) if rare(draw, 12) else st.one_of(TEXT, WORDS))
        else:
            data[key] = draw(value_for(key, moderate, one_in=10))
    if rare(draw, 16):
        data[draw(JUNK_KEYS)] = draw(anything(moderate))
    return data


@st.composite
def fault_tables(draw: st.DrawFn, moderate: bool = False) -> dict[str, Any]:
    """Faults, on a world and a run of a few sizes: the checks against the world get reached."""
    data: dict[str, Any] = {"faults": draw(st.lists(faults(moderate), min_size=1, max_size=3))}
    if draw(st.booleans()):
        data["sim"] = {"num_cells": draw(st.integers(1, 3)), "num_engines": draw(st.integers(1, 3))}
    if draw(st.booleans()):
        data["loop"] = {"steps": draw(st.integers(1, 10))}
        if rare(draw, 4):
            data["loop"]["lora_adapter"] = "a"
        if rare(draw, 4):
            data["loop"]["update_weight_buffer_size"] = draw(st.integers(1, 2**27))
    return data


def one_section(moderate: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """Only [loop], only [sim] or only expect: their checks get reached more often."""
    return st.one_of(
        st.builds(lambda t: {"loop": t}, tables(LOOP_KEYS, moderate, size=2)),
        st.builds(lambda t: {"sim": t}, tables(SIM_KEYS, moderate, size=2)),
        st.builds(lambda t: {"expect": t}, tables(("status", "error"), moderate, size=2)),
    )


def scenario_like(moderate: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(scenario_tables(moderate), fault_tables(moderate), one_section(moderate))


SECTION_KEYS = {
    "[sim]": set(SIM_KEYS),
    "[loop]": set(LOOP_KEYS),
    "[limits]": set(LIMITS),
    "[miles]": set(MILES_KEYS),
    "expect": {"status", "error"},
    "liveness": {f.name for f in dataclasses.fields(Liveness)},
}


def assert_user_facing(error: ConfigError, source: str) -> None:
    """The field is a key a user writes, never an internal name or a miles flag."""
    field = error.field
    assert error.fix.strip(), str(error)
    if field in (source, "faults", *TOP_KEYS, *SECTION_KEYS):
        return
    section, dot, key = field.partition(".")
    if section in SECTION_KEYS:
        assert dot and key in SECTION_KEYS[section], str(error)
        return
    assert field.startswith("faults["), str(error)
    head = field.split("]", 1)[1]
    if head.startswith(" ("):  # faults[i] (kind) or faults[i] (kind).key
        kind = head[2:].split(")", 1)[0]
        assert kind in FaultKind._value2member_map_, str(error)
    else:
        assert head in ("", ".kind"), str(error)


def outcome(load: Any) -> Scenario | tuple[str, str]:
    """The Scenario, or the (field, message) of the ConfigError; anything else propagates."""
    try:
        return load()
    except ConfigError as error:
        assert_user_facing(error, "gen.toml")
        return error.field, str(error)


@settings(max_examples=300, deadline=None)
@given(scenario_like())
def test_random_tables_give_a_scenario_or_a_config_error(data: dict[str, Any]) -> None:
    result = outcome(lambda: scenario_from_mapping(data, "gen.toml"))
    assert isinstance(result, Scenario | tuple)


BASE_FAULTS = (
    {"kind": "slow_cell", "cell": 1, "at": 1.0, "duration": 2.0, "factor": 2.0},
    {"kind": "delay_router", "point": "step_begin", "step": 1, "duration": 2.0, "seconds": 1.0},
    {"kind": "kill_engine", "engine": "engine-1", "point": "mid_generation", "after_step": 1},
    {"kind": "kill_cell", "cell": 0, "point": "after_bucket", "bucket": 1, "after_step": 2},
    {"kind": "stop_cell", "cell": 1, "point": "before_allreduce", "step": 3},
)
PLACES = [
    *(
        ("", key)
        for key in TOP_KEYS
        if key not in ("sim", "loop", "expect", "faults", "limits", "miles")
    ),
    *(("sim", key) for key in SIM_KEYS),
    *(("miles", key) for key in MILES_KEYS),
    *(("limits", key) for key in LIMITS),
    *(("loop", key) for key in LOOP_KEYS),
    *(("expect", key) for key in ("status", "error")),
    *((f"faults[{i}]", key) for i in range(len(BASE_FAULTS)) for key in FAULT_KEYS),
]
"""Every key a user may write: (where, key); the fault keys on each of five base faults."""


@st.composite
def one_key_wrong(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """A valid scenario with one key set to anything (a huge number, a string, a table...)."""
    where, key = draw(st.sampled_from(PLACES))
    if key in BOUNDED:
        value = draw(st.one_of(BOUNDED[key], st.booleans(), WORDS, TEXT))
    else:
        small = st.one_of(st.integers(-3, 3), st.floats(-1.0, 1.5), st.sampled_from([1.0, 3]))
        value = draw(st.one_of(HUGE_NUMBERS, small, scalars(False), anything(False)))
    data: dict[str, Any] = {"faults": [dict(f) for f in BASE_FAULTS]}
    if where.startswith("faults"):
        data["faults"][int(where[7:-1])][key] = value
    elif where:
        data[where] = {key: value}
    else:
        data[key] = value
    return where, key, data


@settings(max_examples=400, deadline=None)
@given(one_key_wrong())
def test_any_value_in_any_key_is_taken_or_named(case: tuple[str, str, dict[str, Any]]) -> None:
    """Only that key changed, so an error names it, or a fault it moved out of reach."""
    where, key, data = case
    result = outcome(lambda: scenario_from_mapping(data, "gen.toml"))
    if isinstance(result, Scenario):
        return
    field, message = result
    if where.startswith("faults"):
        assert field.startswith(where), message
    elif where == "expect":  # status = "failed" wants an error
        assert field in ("expect.status", "expect.error"), message
    else:  # [loop].steps = 2 puts a fault's step 3 beyond the run
        named = f"[{where}].{key}" if where else key
        inside = field.startswith(f"{named}.")  # liveness = {} misses liveness.heal_step
        assert field == named or inside or field.startswith("faults["), message


@settings(max_examples=150, deadline=None)
@given(scenario_like())
def test_random_files_load_as_their_tables_do(data: dict[str, Any]) -> None:
    """Written as TOML the same table gives the same Scenario, or the same error."""
    text = to_toml(data)
    assert tomllib.loads(text) == data
    assert outcome(lambda: scenario_from_toml(text, "gen.toml")) == outcome(
        lambda: scenario_from_mapping(data, "gen.toml")
    )


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario_like(moderate=True))
def test_random_files_through_the_command_line_exit_0_1_or_2(data: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "gen.toml"
        path.write_text(to_toml(data))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(["run", str(path), "--steps", "1", "--json"])
            except SystemExit as exit_:
                code = exit_.code
    assert code in (0, 1, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert out.getvalue() == "" and "error:" in err.getvalue()
    else:
        assert json.loads(out.getvalue())["steps"] <= 1
