"""A cluster from a file (``python -m sim predict --cluster FILE.toml``), turned into the
Preset and mode the simulator replays, so any cluster's update time and its terms are the
simulator's own (``predict_update_seconds``, ``update_terms``). docs/clusters.md has the
rules at length and worked examples; clusters/ holds every anchor preset as a file.

    [model]
    name = "Kimi-K2"            # shown in the output
    params_billions = 1040
    dtype = "bf16"              # on the wire: bf16 or fp16 (2 bytes), fp8 (1), fp32 (4)
    layers = 61                 # a pipeline stage needs one
    experts = 384               # optional: routed experts (absent: dense, EP must be 1)

    [trainer]
    nodes = 32
    gpus_per_node = 8           # default 8; the engines' nodes are the same size
    tp = 8                      # tp, pp, cp, ep: default 1
    pp = 8
    cp = 4
    ep = 32

    [engines]
    count = 8
    gpus = 32                   # per engine
    tp = 32                     # default: gpus
    ep = 32                     # default 1
    colocated = false           # true: the engines are the trainer's own GPUs
    requantize_seconds = 0.884  # optional, measured: the engines' requantization per update

    [links]                     # GB/s (10**9 bytes a second) per GPU; optional with a system
    nvlink_gbps = 370
    inter_node_gbps = 47
    rdma_gbps = 45              # p2p only

    [transfer]
    system = "miles-rdma"       # one of anchor_presets.SYSTEMS: its fitted terms and mode
    mode = "p2p"                # broadcast or p2p: required without a system
    bucket_mib = 1024           # default 1024

The trainer (whole nodes, one GPU sending) and the engines (on the nodes after it) are
anchor_presets.Cluster's world; ``gather_shares`` is pp (every trainer GPU under
perplexity-rdma), ``engine_ep`` and ``engine_tp`` are [engines] ep and tp. A system's fitted
rates are the defaults, a rate in the file wins, and the output names each one's origin.
Every refusal (the list is docs/clusters.md's) comes before any work and names the key as
written, ``[trainer].tp``, and the fix.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from miles_core.errors import ConfigError, int_at_least
from miles_core.scenario.anchor_presets import SYSTEM_MODES, SYSTEMS
from miles_core.transfer import TransferMode
from miles_core.user_files import read_user_text

DTYPES: Mapping[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp32": 4.0}
"""Bytes a parameter takes on the wire."""
KEYS: Mapping[str, tuple[str, ...]] = {
    "model": ("name", "params_billions", "dtype", "layers", "experts"),
    "trainer": ("nodes", "gpus_per_node", "tp", "pp", "cp", "ep"),
    "engines": ("count", "gpus", "tp", "ep", "colocated", "requantize_seconds"),
    "links": ("nvlink_gbps", "inter_node_gbps", "rdma_gbps"),
    "transfer": ("system", "mode", "bucket_mib"),
}
REQUIRED: Mapping[str, tuple[str, ...]] = {
    "model": ("name", "params_billions", "dtype", "layers"),
    "trainer": ("nodes",),
    "engines": ("count", "gpus"),
    "transfer": (),
}
"""The required sections and their required keys ([links] may be left out)."""
GATHER_EVERY_GPU = frozenset({"perplexity-rdma"})
"""Systems whose every trainer GPU gathers its own share (not one share per PP stage)."""
MAX_FILE_BYTES = 1 << 20
"""A cluster file is a few hundred bytes; anything near a MiB is not one."""
MAX_SENDS = 2_000_000
"""Buckets x engines the replay may take: 2,000,000 p2p sends took 8 s here."""
TENSOR_BYTES = 256 * 10**6
"""anchor_presets.Cluster's tensor size: the model is planned as tensors of it."""
MODES = (TransferMode.BROADCAST.value, TransferMode.P2P.value)


@dataclass(frozen=True)
class Model:
    name: str
    params_billions: float
    dtype: str
    layers: int
    experts: int | None


@dataclass(frozen=True)
class Trainer:
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    ep: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Engines:
    count: int
    gpus: int
    tp: int
    ep: int
    colocated: bool
    requantize_seconds: float | None


@dataclass(frozen=True)
class Transfer:
    system: str | None
    mode: TransferMode
    bucket_mib: int


@dataclass(frozen=True)
class ClusterFile:
    """A cluster file as read and checked: nothing in it is impossible."""

    path: str
    model: Model
    trainer: Trainer
    engines: Engines
    links: Mapping[str, float]
    """The [links] rates the file gives, GB/s by key."""
    transfer: Transfer


def require(ok: object, field: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(field, problem, fix)


def _count(table: Mapping[str, Any], section: str, key: str, default: int = 1) -> int:
    value = table.get(key, default)
    require(
        int_at_least(value, 1), f"[{section}].{key}", f"got {value!r}", "write a whole number >= 1"
    )
    return value


def _number(table: Mapping[str, Any], section: str, key: str) -> float | None:
    value = table.get(key)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and value > 0
    require(value is None or ok, f"[{section}].{key}", f"got {value!r}", "write a number > 0")
    return None if value is None else float(value)


def _choice(table: Mapping[str, Any], section: str, key: str, choices: tuple[str, ...]) -> Any:
    value = table.get(key)
    ok = value is None or value in choices
    require(ok, f"[{section}].{key}", f"got {value!r}", f"use one of {', '.join(choices)}")
    return value


def _tables(data: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Every section a table of known keys, the required ones present."""
    for name, value in data.items():
        where = f"[{name}]" if isinstance(value, dict) else name
        require(name in KEYS, where, "is not a section of a cluster file", f"use {list(KEYS)}")
    tables = {}
    for section, keys in KEYS.items():
        table = data.get(section, None if section in REQUIRED else {})
        require(table is not None, f"[{section}]", "missing", "add it (docs/clusters.md)")
        fix = f"write it as a table: [{section}]"
        require(isinstance(table, dict), f"[{section}]", f"got {table!r}", fix)
        for key in table:
            require(key in keys, f"[{section}].{key}", "unknown key", f"use one of {list(keys)}")
        for key in REQUIRED.get(section, ()):
            require(key in table, f"[{section}].{key}", "missing", "add it (docs/clusters.md)")
        tables[section] = table
    return tables


def _model(t: Mapping[str, Any]) -> Model:
    name = t["name"]
    ok = isinstance(name, str) and name.strip()
    require(ok, "[model].name", f"got {name!r}", 'write the model\'s name, e.g. "Kimi-K2"')
    params = _number(t, "model", "params_billions")
    dtype = _choice(t, "model", "dtype", tuple(DTYPES))
    experts = _count(t, "model", "experts") if "experts" in t else None
    assert params is not None  # a required key
    return Model(name, params, dtype, _count(t, "model", "layers"), experts)


def _trainer(t: Mapping[str, Any]) -> Trainer:
    return Trainer(
        _count(t, "trainer", "nodes"),
        _count(t, "trainer", "gpus_per_node", 8),
        *(_count(t, "trainer", key) for key in ("tp", "pp", "cp", "ep")),
    )


def _engines(t: Mapping[str, Any]) -> Engines:
    colocated = t.get("colocated", False)
    fix = "write true or false"
    require(isinstance(colocated, bool), "[engines].colocated", f"got {colocated!r}", fix)
    gpus = _count(t, "engines", "gpus")
    tp, ep = _count(t, "engines", "tp", gpus), _count(t, "engines", "ep")
    requantize = _number(t, "engines", "requantize_seconds")
    return Engines(_count(t, "engines", "count"), gpus, tp, ep, colocated, requantize)


def _transfer(t: Mapping[str, Any]) -> Transfer:
    system = _choice(t, "transfer", "system", tuple(SYSTEMS))
    mode = _choice(t, "transfer", "mode", MODES)
    require(
        system or mode,
        "[transfer]",
        "names neither a system nor a mode",
        f"add system = one of {', '.join(SYSTEMS)} (its fitted terms), or mode = "
        '"broadcast" or "p2p" (the [links] rates alone)',
    )
    sends = SYSTEM_MODES[system] if system else TransferMode(mode)
    require(
        mode is None or mode == sends,
        "[transfer].mode",
        f"{mode} contradicts system {system}, which sends by {sends}",
        f'drop mode, or write mode = "{sends}"',
    )
    return Transfer(system, sends, _count(t, "transfer", "bucket_mib", 1024))


def _check_trainer(m: Model, tr: Trainer) -> None:
    group, named = 1, []
    for key in ("tp", "pp", "cp"):
        group *= getattr(tr, key)
        named.append(f"{key.upper()} {getattr(tr, key)}")
        product = " x ".join(named) + (f" = {group}" if len(named) > 1 else "")
        where = f"the trainer's {tr.gpus} GPUs ({tr.nodes} nodes x {tr.gpus_per_node})"
        fix = "make TP x PP x CP a divisor of nodes x gpus_per_node"
        require(tr.gpus % group == 0, f"[trainer].{key}", f"{product} does not divide {where}", fix)
    problem = f"{tr.pp} pipeline stages for {m.layers} layers: a stage holds at least one"
    require(tr.pp <= m.layers, "[trainer].pp", problem, f"use pp <= {m.layers}")
    stage = tr.gpus // tr.pp
    require(
        stage % tr.ep == 0,
        "[trainer].ep",
        f"EP {tr.ep} does not divide a pipeline stage's {stage} GPUs ({tr.gpus} / PP {tr.pp}): "
        "Megatron builds expert parallelism within a stage",
        f"use a divisor of {stage}",
    )


def _check_engines(en: Engines, tr: Trainer, experts: int | None) -> None:
    for key in ("tp", "ep"):
        n, fix = getattr(en, key), f"use a divisor of {en.gpus}"
        problem = f"{key.upper()} {n} does not divide an engine's {en.gpus} GPUs"
        require(en.gpus % n == 0, f"[engines].{key}", problem, fix)
    node = tr.gpus_per_node
    require(
        en.gpus % node == 0 or node % en.gpus == 0,
        "[engines].gpus",
        f"an engine of {en.gpus} GPUs on nodes of {node} straddles a node: a multi-node "
        "engine takes whole nodes",
        f"use a divisor or a multiple of [trainer] gpus_per_node ({node})",
    )
    require(
        not en.colocated or en.count * en.gpus == tr.gpus,
        "[engines].count",
        f"colocated engines are the trainer's GPUs, but {en.count} x {en.gpus} = "
        f"{en.count * en.gpus} and the trainer has {tr.gpus}",
        "make count x gpus equal nodes x gpus_per_node, or drop colocated",
    )
    for section, ep in (("trainer", tr.ep), ("engines", en.ep)):
        if experts is None:
            problem = f"EP {ep}, but [model] names no experts (a dense model has none to shard)"
            require(ep == 1, f"[{section}].ep", problem, "give [model] experts, or ep = 1")
        else:
            problem = f"{experts} experts do not split into {ep} equal shards"
            require(experts % ep == 0, f"[{section}].ep", problem, f"use a divisor of {experts}")


def wire_keys(f: ClusterFile) -> tuple[str, ...]:
    """The [links] keys that may time the wire, the first one given winning."""
    if f.engines.colocated and f.trainer.nodes == 1:
        return ("nvlink_gbps",)
    if f.transfer.mode is TransferMode.P2P:
        return ("rdma_gbps", "inter_node_gbps")
    return ("inter_node_gbps",)


def _check_links(f: ClusterFile) -> None:
    broadcast = f.transfer.mode is TransferMode.BROADCAST
    require(
        "rdma_gbps" not in f.links or not broadcast,
        "[links].rdma_gbps",
        "a broadcast goes over NCCL, not RDMA writes: nothing would use it",
        "remove it, or send by p2p",
    )
    keys = wire_keys(f)
    require(
        f.transfer.system or any(k in f.links for k in keys),
        f"[links].{keys[-1]}",
        "missing: with no [transfer] system, the [links] rates alone time the wire",
        "give the rate in GB/s per GPU (a 400 Gb/s NIC: about 47), or name a system",
    )


def load_cluster(path: str) -> ClusterFile:
    """The file, read and checked before any work: each error names its key and the fix."""
    text = read_user_text(path, "--cluster", MAX_FILE_BYTES, "a cluster TOML file")
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as error:
        problem = f"{path!r} is not TOML ({error or 'nested too deep'})"
        raise ConfigError("--cluster", problem, "fix its syntax (docs/clusters.md)") from None
    t = _tables(data)
    links = {k: _number(t["links"], "links", k) for k in t["links"]}
    model, trainer, engines = _model(t["model"]), _trainer(t["trainer"]), _engines(t["engines"])
    f = ClusterFile(path, model, trainer, engines, links, _transfer(t["transfer"]))
    _check_trainer(model, trainer)
    _check_engines(engines, trainer, model.experts)
    _check_links(f)
    return f


__all__ = [
    "DTYPES",
    "GATHER_EVERY_GPU",
    "MAX_SENDS",
    "TENSOR_BYTES",
    "ClusterFile",
    "load_cluster",
    "require",
    "wire_keys",
]
