"""One benchmark process: build the state, join the groups, run every trial in lockstep.

Every trial starts after a barrier of all ranks; each rank times itself until
its part is done (a receiver: the weights are in place), and a trial's time is
the slowest rank's. Methods are interleaved within each repeat, so drift in
the machine's load hits them alike. Before the last repeat of each method that
writes weights, receivers zero their parameters, and after it they compare them
bitwise with the sender's (regenerated from the seed).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from backends.bench.backend_path import EngineSide, TrainerSide, join_groups
from backends.bench.ceiling import ceilings_for, shared_segment
from backends.bench.launch import CONFIG_KEY, HOST, RAW_KEY
from backends.bench.methods import (
    CPU_ONLY,
    P2P_ONLY,
    QUICK_METHODS,
    QUICK_REFERENCES,
    WRITES_WEIGHTS,
    Rank,
)
from backends.bench.state import bench_units
from backends.common.wire.buckets import BucketViews
from backends.common.wire.groups import GLOO_TIMEOUT, gloo_group, update_group
from backends.common.wire.shm_group import ShmArena
from miles_core.transfer import ParamSpec, plan_buckets


@dataclass(frozen=True)
class BenchConfig:
    size_bytes: int = 256 * 1024**2
    mix: str = "qwen3-30b-a3b"
    tensors: int = 64
    receivers: int = 1
    bucket_sizes: tuple[int, ...] = tuple(m * 1024**2 for m in (4, 16, 64, 256))
    default_bucket: int = 64 * 1024**2
    modes: tuple[str, ...] = ("broadcast", "p2p")
    repeats: int = 5
    warmup: int = 1
    seed: int = 0
    backend: str = "gloo"
    progress: bool = True
    methods: tuple[str, ...] = QUICK_METHODS
    """The bucketed methods timed (the ceiling's ways always are)."""
    references: tuple[str, ...] = QUICK_REFERENCES

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchConfig:
        """The config a launcher sent (JSON lists back to tuples)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


Key = tuple[str, str, int | None]
"""(mode, method, bucket bytes or None for methods that do not depend on the bucket size)."""


def schedule(cfg: BenchConfig) -> list[tuple[str, int, list[tuple[str, int | None]]]]:
    """Blocks of (mode, bucket size, methods with their key's bucket): the ceiling's ways in
    every block, each beside a method (a figure is paired with the block's fastest way,
    ratios.py), the references once per mode, in the default bucket's block."""
    blocks = []
    for mode in cfg.modes:
        for size in cfg.bucket_sizes:
            methods: list[tuple[str, int | None]] = [
                (m, size)
                for m in cfg.methods
                if (mode == "p2p" or m not in P2P_ONLY)
                and (cfg.backend == "gloo" or m not in CPU_ONLY)
            ]
            if size == cfg.default_bucket:
                methods += [(r, None) for r in cfg.references]
            ways = [(c, size) for c in ceilings_for(cfg.backend)]
            blocks.append((mode, size, interleave(ways, methods)))
    return blocks


def interleave(ways: Sequence[Any], methods: Sequence[Any]) -> list[Any]:
    """A ceiling's way before each method, in turn (the rest after): every method runs
    next to a way of the ceiling it is divided by, not seconds away from all of them."""
    order: list[Any] = []
    for i in range(max(len(ways), len(methods))):
        order += ways[i : i + 1] + methods[i : i + 1]
    return order


def in_repeat(methods: list[Any], rep: int) -> list[Any]:
    """Every other repeat runs the block backwards, so a drift in the machine's speed over a
    repeat favours no position."""
    return methods if rep % 2 == 0 else methods[::-1]


def module_of(specs: Sequence[ParamSpec], device: torch.device) -> torch.nn.Module:
    """A module whose named_parameters() are exactly the specs (dotted names as submodules)."""
    root = torch.nn.Module()
    for spec in specs:
        *path, leaf = spec.name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, torch.nn.Module())
            node = getattr(node, part)
        dtype = getattr(torch, spec.dtype)
        tensor = torch.zeros(spec.shape, dtype=dtype, device=device)
        node.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))
    return root


def random_bytes(seed: int, index: int, nbytes: int) -> torch.Tensor:
    """The sender's bytes for parameter ``index``: any bit pattern, NaNs included."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)


def _flat_bytes(p: torch.Tensor) -> torch.Tensor:
    return p.detach().view(torch.uint8).reshape(-1)


def _device(cfg: BenchConfig, rank: int) -> torch.device:
    if cfg.backend == "nccl":
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _group(cfg: BenchConfig, port: int, prefix: str, rank: int, size: int) -> Any:
    if cfg.backend == "gloo":
        return gloo_group((HOST, port), prefix, rank, size)
    # NCCL: written for CUDA hosts, never run on the CPU machine this bench was built on
    store = dist.TCPStore(HOST, port, is_master=False, timeout=GLOO_TIMEOUT)
    return dist.ProcessGroupNCCL(dist.PrefixStore(prefix, store), rank, size)


def _allreduce(group: Any, tensor: torch.Tensor, op: Any) -> torch.Tensor:
    options = dist.AllreduceOptions()
    options.reduceOp = op
    group.allreduce([tensor], options).wait()
    return tensor


def _model(
    cfg: BenchConfig, rank: int, device: torch.device
) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model (the sender's holds the seeded bytes) and, on a receiver, what it expects."""
    units = bench_units(cfg.mix, cfg.size_bytes, cfg.tensors)
    specs = [p for u in units for p in u.params]
    model = module_of(specs, device)
    expected: dict[str, torch.Tensor] = {}
    for i, spec in enumerate(specs):
        data = random_bytes(cfg.seed, i, spec.nbytes).to(device)
        if rank == 0:
            _flat_bytes(model.get_parameter(spec.name)).copy_(data)
        else:
            expected[spec.name] = data
    return model, expected


def _setup(
    cfg: BenchConfig, rank: int, port: int, store: Any
) -> tuple[Rank, dict[str, torch.Tensor]]:
    """This process's Rank: model, flat tensor, groups (the bench's and the backend's own),
    and the shared segment of the shm ceilings (rank 0's memfd, mapped by the others)."""
    device = _device(cfg, rank)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model, expected = _model(cfg, rank, device)
    payload = sum(p.numel() * p.element_size() for p in model.parameters())
    flat = torch.zeros(payload, dtype=torch.uint8, device=device)
    if rank == 0:
        torch.cat([_flat_bytes(p) for p in model.parameters()], out=flat)
    world = cfg.receivers + 1
    everyone = _group(cfg, port, "everyone", rank, world)
    if rank == 0:
        pairs = {r: _group(cfg, port, f"pair{r}", 0, 2) for r in range(1, world)}
    else:
        pairs = {rank: _group(cfg, port, f"pair{rank}", 1, 2)}
    me = Rank(rank, cfg.receivers, everyone, pairs, model, device, flat, sync)
    if rank == 0:
        me.views = BucketViews(model)
        me.backend = TrainerSide(device, me.views)
    else:
        me.backend = EngineSide(model, device)
        me.views = me.backend.weights.views
    join_groups(rank, cfg.receivers, (HOST, port), me.backend, cfg.backend)
    if device.type == "cpu":  # the CPU backend's other wire
        join_groups(rank, cfg.receivers, (HOST, port), me.backend, cfg.backend, "shm")
        me.wires = ("", "shm")
        arena = ShmArena() if rank == 0 else None
        me.shm_everyone = update_group("shm", (HOST, port), "ceiling-shm", rank, world, arena)
        me.shared = shared_segment(store, rank, payload)
        me.shared.zero_()  # every process faults its mapping in before timing
    return me, expected


def rank_main(rank: int, port: int) -> None:
    """The body of process ``rank`` (0 sends): its config from the launcher's store; rank 0
    writes the raw timings back to it."""
    torch.set_num_threads(1)
    store = dist.TCPStore(HOST, port, is_master=False, timeout=GLOO_TIMEOUT)
    cfg = BenchConfig.from_json(json.loads(store.get(CONFIG_KEY)))
    started = time.perf_counter()
    me, expected = _setup(cfg, rank, port, store)
    setup_seconds = time.perf_counter() - started
    try:
        times, checks, phases = _trials(cfg, me, expected)
    finally:
        if isinstance(me.backend, EngineSide):
            me.backend.close()
    phases["setup_seconds"] = setup_seconds
    raw = _report(cfg, me, times, checks)
    if raw is not None:
        store.set(RAW_KEY, json.dumps(raw | {"phases": phases}))


def _trials(
    cfg: BenchConfig, me: Rank, expected: dict[str, torch.Tensor]
) -> tuple[dict[Key, list[float]], dict[Key, bool], dict[str, Any]]:
    """Every block's trials in lockstep: this rank's seconds, its bitwise checks, and where
    the time went (each block's preparing, each figure's trials with warmups and barriers)."""
    rank, device, sync = me.rank, me.device, me.sync
    units = bench_units(cfg.mix, cfg.size_bytes, cfg.tensors)
    token = torch.zeros(1, device=device)

    def barrier() -> None:
        _allreduce(me.everyone, token, dist.ReduceOp.SUM)
        sync()

    def weights_equal() -> bool:
        if rank == 0:
            return True
        params = me.params()
        return all(torch.equal(_flat_bytes(params[n]), e) for n, e in expected.items())

    blocks = schedule(cfg)
    trials = sum(len(m) for _, _, m in blocks) * (cfg.warmup + cfg.repeats)
    bar = tqdm(total=trials, unit="trial", disable=not (cfg.progress and rank == 0), leave=False)
    times: dict[Key, list[float]] = {}
    checks: dict[Key, bool] = {}
    spent: dict[Key, float] = {}
    prepared: list[dict[str, Any]] = []
    for mode, size, methods in blocks:
        began = time.perf_counter()
        me.prepare(plan_buckets(units, size))
        prepared.append(
            {"mode": mode, "bucket_bytes": size, "seconds": time.perf_counter() - began}
        )
        for rep in range(cfg.warmup + cfg.repeats):
            last = rep == cfg.warmup + cfg.repeats - 1
            for method, bucket in in_repeat(methods, rep):
                key = (mode, method, bucket)
                bar.set_description(f"{mode} {size / 1024**2:g} MiB {method}", refresh=False)
                began = time.perf_counter()
                checked = last and method in WRITES_WEIGHTS
                if checked and rank:
                    for p in me.params().values():
                        p.detach().zero_()
                barrier()
                started = time.perf_counter()
                me.run(method, mode)
                seconds = time.perf_counter() - started
                if rep >= cfg.warmup:
                    times.setdefault(key, []).append(seconds)
                if checked:
                    checks[key] = weights_equal()
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - began
                bar.update(1)
    bar.close()
    phases = {
        "blocks": prepared,
        "figures": [
            {"mode": k[0], "method": k[1], "bucket_bytes": k[2], "seconds": v}
            for k, v in spent.items()
        ],
    }
    return times, checks, phases


def _report(
    cfg: BenchConfig, me: Rank, times: dict[Key, list[float]], checks: dict[Key, bool]
) -> dict[str, Any] | None:
    """On rank 0, each trial's slowest rank's seconds and every receiver's checks."""
    device, everyone, rank = me.device, me.everyone, me.rank
    units = bench_units(cfg.mix, cfg.size_bytes, cfg.tensors)
    specs = [p for u in units for p in u.params]
    payload = sum(s.nbytes for s in specs)
    # a trial lasts as long as its slowest rank; a check passes only if every receiver's does
    keys = list(times)
    values = [t for k in keys for t in times[k]]
    slowest = torch.tensor(values, dtype=torch.float64, device=device)
    slowest = _allreduce(everyone, slowest, dist.ReduceOp.MAX).cpu().tolist()
    ends = list(itertools.accumulate(len(times[k]) for k in keys))
    passed = torch.tensor([int(checks.get(k, True)) for k in keys], device=device)
    passed = _allreduce(everyone, passed, dist.ReduceOp.MIN).cpu()
    if rank != 0:
        return None
    return {
        "payload_bytes": payload,
        "tensors": len(specs),
        "buckets": {str(s): len(plan_buckets(units, s)) for s in cfg.bucket_sizes},
        "trials": [
            {
                "mode": k[0],
                "method": k[1],
                "bucket_bytes": k[2],
                "seconds": slowest[end - len(times[k]) : end],
                "weights_bitwise_equal": bool(passed[i]) if k in checks else None,
            }
            for i, (k, end) in enumerate(zip(keys, ends, strict=True))
        ],
    }
