"""What ``python -m sim plan`` reads: a cluster, a model, a workload, fault rates and the
settings to search, and the scenario each point of the search runs.

    name = "my-cluster"
    steps = 8                  # training steps each point runs
    seeds = 2                  # runs per point (each with faults drawn from its seed)

    [cluster]
    gpus = 16
    gpus_per_node = 8

    [model]
    param_bytes = 15e9         # the weights an update sends
    gpus_per_cell = 4          # one trainer replica (TP x PP)
    gpus_per_engine = 2        # one engine (its TP)
    train_seconds_per_sample = 0.05   # forward/backward of one sample on one replica
    train_seconds_per_step = 0.0      # each replica's step cost its share does not shrink
    colocated_train_seconds_per_sample = 0.08  # mode "sync" trains beside the engines
    colocated_train_seconds_per_step = 0.0     # (neither given: the two figures above)

    [workload]
    rollout_batch_size = 32
    n_samples_per_prompt = 4
    response_tokens_mean = 1024.0
    response_tokens_sigma = 0.8
    decode_seconds_per_token = 0.01

    [timing]                   # any [sim] time key (link rates, engine_start_seconds, ...),
                               # the generation model's too (docs/generation.md): decode_step_*
                               # (the decode law; decode_seconds_per_token then does nothing),
                               # engine_gpu_memory_bytes, mem_fraction_static,
                               # model_weight_bytes_per_gpu, kv_bytes_per_token (the KV pool,
                               # with [workload] response_tokens_max); checked together

    [faults]                   # mean seconds between failures (absent: none)
    cell_mtbf_seconds = 600.0
    engine_mtbf_seconds = 1200.0
    cell_restart_seconds = 60.0

    [search]                   # every combination is a point (invalid ones say why)
    rollout_share = [0.25, 0.5, 0.75]  # or trainer_gpus = {step = 4}: every split
    max_weight_staleness = [1, 2]
    pause_generation_mode = ["retract", "in_place"]
    transfer_mode = ["broadcast", "p2p"]
    update_weight_buffer_mib = [512]
    use_fault_tolerance = [true]
    mini_ft_controller_enable = [false, true]
    mode = ["fully_async", "one_step_off", "sync"]

    [published]                # optional: where the source's own choice lands
    [sensitivity]              # optional: the inputs --sensitivity moves

``trainer_gpus`` (every split the cluster allows) in sim/timing/plan_split.py; ``[published]``
and ``[sensitivity]`` in sim/timing/plan_published.py.

A point's trainer is the GPUs the rollout share leaves, as replicas of ``gpus_per_cell``
(miles' --indep-dp cells, each training its share of the batch); its engines the rollout
share's GPUs as engines of ``gpus_per_engine``. A replica's step takes
``train_seconds_per_sample`` x its share of the batch + ``train_seconds_per_step`` (the
optimizer step and FSDP's per-mini-batch gathers, which more replicas do not shrink).
``mode = "sync"`` (miles' train.py) runs colocated: every GPU is an engine's while the
batch is generated and a cell's while it trains. Training beside a resident engine is
its own figure where one is measured (``colocated_train_seconds_per_*``: verl's colocated
rows offload the engine and recompute the old log-probs on the trainer); without one the
swap between the two is not charged.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError
from miles_core.loop import LoopConfig
from miles_core.scenario import Scenario, TimeModel, WorldShape
from miles_core.scenario.faults import AnyFault, make_fault
from miles_core.scenario.liveness import step_parts
from miles_core.scenario.world import TIME_KEYS
from miles_core.transfer import TransferMode
from miles_core.user_files import JSON_BYTES, read_user_text
from sim.horizon import window_for
from sim.timing.plan_published import check_published, check_sensitivity
from sim.timing.plan_split import expand_trainer_gpus, point_split, split_key

TRAIN_FIGURES = (
    "train_seconds_per_step",
    "colocated_train_seconds_per_sample",
    "colocated_train_seconds_per_step",
)
"""The model's optional training figures (seconds, >= 0)."""
SECTIONS = {
    "cluster": {"gpus", "gpus_per_node"},
    "model": {
        "param_bytes",
        "gpus_per_cell",
        "gpus_per_engine",
        "train_seconds_per_sample",
        *TRAIN_FIGURES,
    },
    "workload": {
        "rollout_batch_size",
        "n_samples_per_prompt",
        "response_tokens_mean",
        "response_tokens_sigma",
        "response_tokens_max",
        "decode_seconds_per_token",
        "concurrency_slowdown",
    },
    "timing": set(TIME_KEYS),
    "faults": {
        "cell_mtbf_seconds",
        "engine_mtbf_seconds",
        "cell_restart_seconds",
        "engine_restart_seconds",
    },
    "search": {
        "rollout_share",
        "max_weight_staleness",
        "pause_generation_mode",
        "transfer_mode",
        "update_weight_buffer_mib",
        "use_fault_tolerance",
        "mini_ft_controller_enable",
        "mode",
        "trainer_gpus",
    },
    "published": set(),  # filled below: the searched keys
    "sensitivity": {"assumed", "factors"},
}
SECTIONS["published"] = set(SECTIONS["search"])
REQUIRED = {
    "cluster": {"gpus"},
    "model": {"param_bytes", "gpus_per_cell", "gpus_per_engine", "train_seconds_per_sample"},
    "workload": {"rollout_batch_size", "n_samples_per_prompt"},
}
SEARCH_DEFAULTS: Mapping[str, list[Any]] = {
    "max_weight_staleness": [1],
    "pause_generation_mode": ["retract"],
    "transfer_mode": ["broadcast"],
    "update_weight_buffer_mib": [512],
    "use_fault_tolerance": [True],
    "mini_ft_controller_enable": [False],
    "mode": ["fully_async"],
}


@dataclass(frozen=True)
class Plan:
    name: str
    steps: int
    seeds: int
    tables: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Point:
    """One combination of the searched settings, and the scenario it runs (None: the
    combination is not a valid configuration, and ``why`` says so)."""

    index: int
    settings: Mapping[str, Any]
    scenario: Scenario | None
    why: str = ""


def _number(table: Mapping[str, Any], key: str, where: str, floor: float = 0.0) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > floor:
        raise ConfigError(f"[{where}].{key}", f"got {value!r}", f"pass a number > {floor:g}")
    return float(value)


def load_plan(path: str) -> Plan:
    """The plan file, checked key by key before anything runs."""
    try:
        data = tomllib.loads(read_user_text(path, "plan", JSON_BYTES, "a plan TOML file"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("plan", f"{path} is not TOML ({error})", "fix its syntax") from None
    unknown = sorted(set(data) - {"name", "steps", "seeds", *SECTIONS})
    if unknown:
        raise ConfigError("plan", f"unknown keys {unknown}", f"use {sorted(SECTIONS)}")
    tables: dict[str, Mapping[str, Any]] = {}
    for section, keys in SECTIONS.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{section}]", f"got {table!r}", "write it as a table")
        extra = sorted(set(table) - keys)
        if extra:
            raise ConfigError(f"[{section}]", f"unknown keys {extra}", f"use {sorted(keys)}")
        missing = sorted(REQUIRED.get(section, set()) - set(table))
        if missing:
            raise ConfigError(f"[{section}]", f"missing {missing}", "give every one of them")
        tables[section] = table
    counts = [("cluster", k) for k in ("gpus", "gpus_per_node") if k in tables["cluster"]]
    counts += [("model", k) for k in ("param_bytes", "gpus_per_cell", "gpus_per_engine")]
    for section, key in counts:  # 15e9 bytes is a float in TOML: whole numbers only
        value = tables[section][key]
        whole = isinstance(value, int | float) and not isinstance(value, bool)
        if not (whole and value >= 1 and float(value).is_integer()):
            raise ConfigError(f"[{section}].{key}", f"got {value!r}", "pass a whole number >= 1")
    _number(tables["model"], "train_seconds_per_sample", "model")
    for key in sorted(set(TRAIN_FIGURES) & set(tables["model"])):
        value = tables["model"][key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
            raise ConfigError(f"[model].{key}", f"got {value!r}", "pass a number >= 0")
    for key in SECTIONS["faults"] & set(tables["faults"]):
        _number(tables["faults"], key, "faults")
    _check_workload(tables)
    tables["search"] = _check_search(tables)
    steps, seeds = data.get("steps", 8), data.get("seeds", 1)
    for key, value in (("steps", steps), ("seeds", seeds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(key, f"got {value!r}", "pass an integer >= 1")
    return Plan(str(data.get("name", Path(path).stem)), steps, seeds, tables)


def _check_workload(tables: Mapping[str, Mapping[str, Any]]) -> None:
    """The workload's counts and figures, and the [timing] keys, named as the plan has them."""
    work = tables["workload"]
    for key in ("rollout_batch_size", "n_samples_per_prompt"):
        value = work[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"[workload].{key}", f"got {value!r}", "pass an integer >= 1")
    figures = {k: v for k, v in work.items() if k in TIME_KEYS}
    try:  # together, as a point's time model has them: the KV pool needs the response cap
        TimeModel(**{**tables["timing"], **figures})
    except ConfigError as error:
        section = "workload" if error.field in figures else "timing"
        raise ConfigError(f"[{section}].{error.field}", error.problem, error.fix) from None


def _check_search(tables: Mapping[str, Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The searched lists (trainer_gpus expanded to its counts), the published configuration
    among them, and the assumed inputs (sim/timing/plan_split.py, plan_published.py)."""
    search = dict(tables["search"])
    key = split_key(search)
    if key == "trainer_gpus":
        search[key] = expand_trainer_gpus(tables)
    for name, values in search.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"[search].{name}", f"got {values!r}", "pass a non-empty list")
    check_published(tables["published"], {**SEARCH_DEFAULTS, **search}, key)
    check_sensitivity(tables)
    return search


def points(plan: Plan) -> list[Point]:
    """Every combination of the searched settings, in order."""
    search = {**SEARCH_DEFAULTS, **plan.tables["search"]}
    keys = sorted(search)
    out = []
    for i, values in enumerate(itertools.product(*(search[k] for k in keys))):
        settings = dict(zip(keys, values, strict=True))
        try:
            out.append(Point(i, settings, scenario_of(plan, settings)))
        except ConfigError as error:
            out.append(Point(i, settings, None, str(error)))
    return out


def scenario_of(plan: Plan, settings: Mapping[str, Any]) -> Scenario:
    """The point's world, time model and loop (no faults: they are drawn per seed)."""
    cluster, model, work = plan.tables["cluster"], plan.tables["model"], plan.tables["workload"]
    per_cell, per_engine = int(model["gpus_per_cell"]), int(model["gpus_per_engine"])
    engines, cells = point_split(plan.tables, settings)
    _check_sync_bound(plan, settings)
    world = WorldShape(
        num_cells=cells,
        gpus_per_cell=per_cell,
        num_engines=engines,
        gpus_per_engine=per_engine,
        gpus_per_node=int(cluster.get("gpus_per_node", 8)),
        param_bytes=int(model["param_bytes"]),
        num_tensors=max(16, int(model["param_bytes"]) // (256 * 10**6)),
    )
    batch, n = int(work["rollout_batch_size"]), int(work["n_samples_per_prompt"])
    per_sample, per_step = _train_figures(model, colocated=settings["mode"] == "sync")
    timing_keys = {k: v for k, v in work.items() if k in TIME_KEYS}
    timing = TimeModel(
        **{
            **plan.tables["timing"],
            **timing_keys,
            "train_step_seconds": per_sample * batch * n / cells,  # each cell its share
            "train_fixed_seconds": per_step,
            "batch_split_by_quorum": True,  # and a larger one when a cell is lost
        }
    )
    loop = LoopConfig(
        steps=plan.steps,
        rollout_batch_size=batch,
        n_samples_per_prompt=n,
        max_weight_staleness=settings["max_weight_staleness"],
        pause_generation_mode=settings["pause_generation_mode"],
        transfer_mode=_choice(TransferMode, settings["transfer_mode"], "transfer_mode"),
        update_weight_buffer_size=int(settings["update_weight_buffer_mib"]) << 20,
        use_fault_tolerance=settings["use_fault_tolerance"],
        mini_ft_controller_enable=settings["mini_ft_controller_enable"],
        mode=settings["mode"],
        heartbeat_interval=10.0,
        heartbeat_timeout=10.0,
        heartbeat_failure_threshold=3,
    )
    nominal = sum(step_parts(world, timing, loop).values())
    # a fault late in the run may take effect after its last step: the run goes on until
    # every fault is witnessed (more steps), so throughput and ETTR are per second and per step
    return Scenario(
        name=f"{plan.name}-point",
        world=world,
        timing=timing,
        loop=loop,
        until_witnessed=UNTIL_WITNESSED * plan.steps,
        progress_window=window_for(nominal),
        max_seconds=HORIZON_STEPS * UNTIL_WITNESSED * plan.steps * nominal,
    )


HORIZON_STEPS = 50
"""A point's run that has not ended by this many nominal steps per step stalled (the
simulator's own default takes the longer of training and generation, sim/horizon.py, not
the whole nominal step with its update)."""


def _check_sync_bound(plan: Plan, settings: Mapping[str, Any]) -> None:
    """sync trains each batch on the weights that generated it: one point runs it, not one
    per searched bound."""
    bounds = plan.tables["search"].get(
        "max_weight_staleness", SEARCH_DEFAULTS["max_weight_staleness"]
    )
    if settings["mode"] == "sync" and settings["max_weight_staleness"] != bounds[0]:
        raise ConfigError(
            "[search].max_weight_staleness",
            "sync trains every batch on the weights that generated it: the bound does not apply",
            f"the point with max_weight_staleness = {bounds[0]} runs it",
        )


def _train_figures(model: Mapping[str, Any], colocated: bool) -> tuple[float, float]:
    """(seconds per sample, seconds per step) of a replica: a colocated point's own figures
    where the plan gives either (the other is then 0), else the dedicated trainer's."""
    if colocated and any(k.startswith("colocated_") for k in model):
        return (
            float(model.get("colocated_train_seconds_per_sample", 0.0)),
            float(model.get("colocated_train_seconds_per_step", 0.0)),
        )
    return (
        float(model["train_seconds_per_sample"]),
        float(model.get("train_seconds_per_step", 0.0)),
    )


UNTIL_WITNESSED = 4
"""A point's run goes on to at most this many times its steps while a fault has not taken
effect yet."""


def _choice(kind: type[TransferMode], value: Any, key: str) -> TransferMode:
    try:
        return kind(value)
    except ValueError:
        choices = [m.value for m in kind]
        raise ConfigError(f"[search].{key}", f"got {value!r}", f"use {choices}") from None


def drawn_faults(
    plan: Plan, scenario: Scenario, seed: int, horizon: float, step_seconds: float
) -> tuple[AnyFault, ...]:
    """Faults at times drawn from the plan's rates within ``horizon`` seconds (the run
    without faults lasted longer than that, so every fault falls inside the run), each on a
    component that is up (a kill of a dead process does nothing): a cell dies and is started
    ``cell_restart_seconds`` later (with the FT controller, the point's own
    --mini-ft-controller-enable, it is not started by the plan: the controller resumes it,
    and its processes take the [timing] cell_start_seconds), and is not struck again, nor
    another cell, until three steps after (its heal); an engine dies and is up again after
    fault tolerance's check and its start (or, without it, ``engine_restart_seconds`` later
    if given; else never)."""
    rates, rng = plan.tables["faults"], random.Random(seed)
    faults: list[AnyFault] = []
    cell_mtbf = rates.get("cell_mtbf_seconds")
    if cell_mtbf and scenario.world.num_cells > 1:  # a lone cell lost is a total loss
        controller = scenario.loop.mini_ft_controller_enable
        restart = (
            _controller_back(scenario)
            if controller
            else float(rates.get("cell_restart_seconds", 60.0))
        )
        t = rng.expovariate(1 / cell_mtbf)
        while t + restart < horizon:  # started again inside the run
            cell = rng.randrange(scenario.world.num_cells)
            faults.append(make_fault("kill_cell", cell=cell, at=t))
            if not controller:
                faults.append(make_fault("start_cell", cell=cell, at=t + restart))
            t += restart + 3 * step_seconds + rng.expovariate(1 / cell_mtbf)
    faults += _engine_faults(plan, scenario, rng, horizon, step_seconds)
    return tuple(sorted(faults, key=lambda f: f.when.at))  # type: ignore[union-attr]


def _controller_back(scenario: Scenario) -> float:
    """The longest a killed cell takes to be started again under the FT controller: the
    heartbeat's verdict (every miss refused at once; a call may find it sooner), the
    controller's next poll, its resume delay, and the cell's start."""
    loop = scenario.loop
    detect = (loop.heartbeat_interval or 0.0) * loop.heartbeat_failure_threshold
    return (
        detect
        + loop.mini_ft_controller_poll_interval
        + loop.mini_ft_controller_resume_delay
        + scenario.timing.cell_start_seconds
    )


def _engine_faults(
    plan: Plan, scenario: Scenario, rng: random.Random, horizon: float, step_seconds: float
) -> list[AnyFault]:
    rates, loop = plan.tables["faults"], scenario.loop
    mtbf = rates.get("engine_mtbf_seconds")
    if not mtbf:
        return []
    later = rates.get("engine_restart_seconds")
    if loop.use_fault_tolerance:
        back = loop.rollout_health_check_interval + loop.rollout_health_check_timeout
        back += scenario.timing.engine_start_seconds + step_seconds
    else:
        back = float(later) + step_seconds if later else math.inf
    up_at = dict.fromkeys(scenario.world.engine_ids, 0.0)
    faults: list[AnyFault] = []
    t = rng.expovariate(1 / mtbf)
    while t < horizon:
        up = [e for e, when in up_at.items() if when <= t]
        if len(up) > 1:  # the last engine up is left alone: nothing would generate
            engine = rng.choice(up)
            faults.append(make_fault("kill_engine", engine=engine, at=t))
            if later and not loop.use_fault_tolerance:
                faults.append(make_fault("restart_engine", engine=engine, at=t + float(later)))
            up_at[engine] = t + back
        t += rng.expovariate(1 / mtbf)
    return faults


def with_faults(scenario: Scenario, faults: Sequence[AnyFault]) -> Scenario:
    return dataclasses.replace(scenario, faults=tuple(faults))


def horizon_of(seconds: float) -> float:
    """Faults are drawn in the first 80 % of the run without them."""
    return 0.8 * seconds if math.isfinite(seconds) else 0.0


__all__ = [
    "Plan",
    "Point",
    "drawn_faults",
    "horizon_of",
    "load_plan",
    "points",
    "scenario_of",
    "with_faults",
]
