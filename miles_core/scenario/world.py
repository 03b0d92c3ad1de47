"""The world a scenario runs on: its shape (every world) and the simulator's time models.

``WorldShape`` is what every world builds: how many trainer cells of how many
GPUs, how many engines, how the GPUs sit on nodes, and the model's size (which
sets the number of weight-update buckets, so "after bucket 2" means the same in
every world). ``TimeModel`` is how long things take in the simulator; a real
world's time is its own and it ignores these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from miles_core.errors import ConfigError, int_at_least
from miles_core.transfer import ParamSpec, UpdateUnit, units_of


@dataclass(frozen=True)
class WorldShape:
    """Cells, engines, nodes and the model's size, as the scenario's [sim] section gives them."""

    num_cells: int = 2
    """Independent-DP trainer cells (miles' --indep-dp)."""
    gpus_per_cell: int = 1
    """Ranks per cell (TP x PP x CP); the CPU backend shards a cell with FSDP2."""
    num_engines: int = 2
    gpus_per_engine: int = 1
    gpus_per_node: int = 8
    param_bytes: int = 64 * 1024**2
    num_tensors: int = 16
    flush_refuses_while_queued: bool = False
    """The engines' SGLang is one before sglang#31962: /flush_cache refuses while any request
    waits in the engine's queue, the ones a retract pause put back there included (not only
    while requests hold KV pages), so a flush after a retract pause is refused for as long as
    the pause lasts (miles #1497, #1750)."""
    engine_token_seconds: float = 0.0
    """The engines' token pace: a floor on each generated token's time, in every world (the
    CPU backend's local engines sleep to it, the simulator decodes at the larger of it and
    its decode_seconds_per_token); longer requests live across more weight updates. The
    CPU backend's --engine-token-seconds overrides it."""
    prefix_cache: str = "off"
    """The engines' prefix cache (SGLang's radix cache), in every world: ``off`` (each
    request computes its prompt's KV), ``shared`` (SGLang's: a prompt's KV is reused by any
    later request for it, whatever weights computed it, until /flush_cache drops it, miles
    #2782) or ``by_version`` (reused only under the weights that computed it). Every world
    records the versions of the KV a request reused; ``cached_kv_fresh`` judges them."""

    unit_bytes: tuple[int, ...] = ()
    """The model's update units' bytes, in order, in place of num_tensors equal tensors of
    param_bytes: a real model's own layout (the timing fit's check rebuilds it from a real
    run's ModelDescribed). Not a scenario key."""

    def __post_init__(self) -> None:
        if not all(int_at_least(b, 1) for b in self.unit_bytes):
            raise ConfigError("unit_bytes", f"got {self.unit_bytes!r}", "pass byte counts >= 1")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "unit_bytes":
                continue
            if f.name in SHAPE_CHOICES:
                if value not in SHAPE_CHOICES[f.name]:
                    choices = ", ".join(SHAPE_CHOICES[f.name])
                    raise ConfigError(f.name, f"got {value!r}", f"pass one of {choices}")
            elif f.name in SHAPE_SWITCHES:
                if not isinstance(value, bool):
                    raise ConfigError(f.name, f"got {value!r}", "pass true or false")
            elif f.name in SHAPE_PACES:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                if not (ok and math.isfinite(value) and 0 <= value <= MAX_TOKEN_SECONDS):
                    raise ConfigError(
                        f.name, f"got {value!r}", f"pass seconds from 0 to {MAX_TOKEN_SECONDS:g}"
                    )
            elif not int_at_least(value, 1):
                raise ConfigError(f.name, f"got {value!r}", "pass an integer >= 1")

    @property
    def engine_ids(self) -> tuple[str, ...]:
        return tuple(f"engine-{i}" for i in range(self.num_engines))

    def units(self) -> tuple[UpdateUnit, ...]:
        """num_tensors bf16 tensors of equal size adding up to param_bytes (or the units of
        ``unit_bytes``)."""
        if self.unit_bytes:
            return units_of(
                [
                    ParamSpec.of(f"unit{i}.weight", (n,), "uint8")
                    for i, n in enumerate(self.unit_bytes)
                ]
            )
        per_tensor = max(1, self.param_bytes // (2 * self.num_tensors))
        params = [
            ParamSpec.of(f"layer{i}.weight", (per_tensor,), "bfloat16")
            for i in range(self.num_tensors)
        ]
        return units_of(params)

    def lora_params(self) -> tuple[ParamSpec, ...]:
        """A rank-16 adapter on each layer: lora_A (16 x 1024) and lora_B (1024 x 16), bf16."""
        return tuple(
            ParamSpec.of(f"layer{i}.{name}.weight", shape, "bfloat16")
            for i in range(self.num_tensors)
            for name, shape in (("lora_A", (16, 1024)), ("lora_B", (1024, 16)))
        )


@dataclass(frozen=True)
class TimeModel:
    """How long things take in the simulator (seconds, bytes per second)."""

    response_tokens_mean: float = 256.0
    response_tokens_sigma: float = 0.5
    response_tokens_max: float = 0.0
    """A response stops at this many tokens (the engines' max_new_tokens: the lognormal's
    tail is cut there); 0: no cap."""
    decode_seconds_per_token: float = 0.01
    concurrency_slowdown: float = 0.02
    prompt_tokens: float = 256.0
    prefill_seconds_per_token: float = 0.0002
    """A retracted request's KV is recomputed when it resumes: prefill of prompt and response
    so far, at this many seconds per token."""
    charge_every_prefill: bool = False
    """Every prefill is charged, a request's first too (prompt_tokens x
    prefill_seconds_per_token), and the prefix cache saves a prefill's prompt part when it
    reuses the prompt's KV (False: only a retracted request's recompute, in full, as
    before). docs/generation.md."""
    response_tokens_max_fraction: float = 0.0
    """This fraction of responses run to response_tokens_max whatever the lognormal drew (a
    model that rambles until max_new_tokens cuts it: RL rollouts' truncated tail); 0: none."""
    max_running_requests: int = 0
    """The most requests an engine decodes at once (SGLang's --max-running-requests); more
    wait in its queue, first come first served. 0: no cap (the KV pool may still set one)."""
    engine_gpu_memory_bytes: float = 0.0
    """One engine GPU's memory: with model_weight_bytes_per_gpu, mem_fraction_static and
    kv_bytes_per_token it sizes the KV pool, which caps the running requests at
    prompt_tokens + response_tokens_max reserved each. 0: the KV pool sets no cap."""
    mem_fraction_static: float = 0.88
    """SGLang's --mem-fraction-static: the share of a GPU's memory for weights and the KV
    pool. SGLang works it out from the GPU's memory when unset (about 0.835 on an 80 GB
    H100, 0.907 on a 141 GB H200) and falls back to 0.88, the default here."""
    model_weight_bytes_per_gpu: float = 0.0
    """The model's weights on one engine GPU (its TP / EP shard)."""
    kv_bytes_per_token: float = 0.0
    """One token's KV on one engine GPU: layers x kv_heads x head_dim x 2 (K and V) x the
    KV dtype's bytes, divided by the engine's TP where it splits the KV heads."""
    decode_step_fixed_seconds: float = 0.0
    """The decode law (docs/generation.md): one decode step of the running batch takes this
    + decode_step_seconds_per_request x requests + decode_step_seconds_per_kv_token x their
    context tokens, and makes one token for each. All three 0: each request's token time
    is decode_seconds_per_token slowed by concurrency_slowdown, fixed at its start."""
    decode_step_seconds_per_request: float = 0.0
    """The decode law's cost of each running request in a step (its weights-side work)."""
    decode_step_seconds_per_kv_token: float = 0.0
    """The decode law's cost of each context token (prompt and tokens so far) of the
    running requests in a step (attention reading their KV)."""
    train_step_seconds: float = 5.0
    train_jitter: float = 0.1
    """A step's compute time is uniform in [1 - jitter, 1 + jitter] x train_step_seconds."""
    batch_split_by_quorum: bool = False
    """train_step_seconds is a cell's share of the step's batch with every cell in the
    quorum: a quorum of fewer cells (a cell lost) gives each a larger share and a longer
    step, as miles' indep-DP splits the global batch among the cells that train it (False:
    a cell's step takes the same whatever the quorum). ``python -m sim plan`` sets it."""
    train_fixed_seconds: float = 0.0
    """A step's cost on each cell that its share of the batch does not shrink: the optimizer
    step and, with FSDP, each mini-batch's all-gather and reduce-scatter of the whole model
    (verl's fully-async 7B trains 512 prompts in 269.8 / 157.0 / 113.2 s on 16 / 32 / 64
    GPUs: about 60 s of it does not split; see docs/timing.md). Not scaled by the quorum."""
    allreduce_seconds: float = 0.2
    link_latency_seconds: float = 1e-4
    link_bytes_per_second: float = 10e9
    """Between nodes (the weight-transfer link: InfiniBand / RoCE)."""
    nvlink_bytes_per_second: float = 100e9
    """Within a node: a bucket whose source and targets share a node moves at this rate."""
    checkpoint_bytes_per_second: float = 2e9
    heartbeat_reply_seconds: float = 0.01
    control_reply_seconds: float = 0.0
    """An engine control call's round trip (pause, flush, begin and end of the update session,
    the version stamp, resume, adapter unload): the engine acts when it ends. It opens the
    windows between an update's start and its first bucket, and between its last bucket and
    the stamp, that a fault at a time can land in (0: calls answer at once)."""
    engine_start_seconds: float = 0.0
    """From an engine's restart (a fault's, or fault tolerance's recovery) to its new process
    answering: importing, loading weights, serving (10 to 13 s on the CPU backend here). The
    old process dies at once; meanwhile the slot has none (0: the new one answers at once)."""
    cell_start_seconds: float = 0.0
    """From a cell's start (the scenario's start_cell, or the FT controller's resume) to its
    new processes answering: Ray creating the actors, importing, building the model. The old
    processes die at once; meanwhile the cell has none (0: the new ones answer at once)."""
    job_restart_seconds: float = 10.0
    """From a job killed whole (kill_job) to its new controller starting: the scheduler
    restarts the job and its processes come up; reading the save back (weights and two
    optimizer moments at checkpoint_bytes_per_second) comes on top."""
    update_fixed_seconds: float = 0.0
    """A weight update's fixed cost on its source, charged before its first bucket: the
    session's setup (transfer plan, locks, Python), which small models show (miles' P2P
    loses to NCCL on one node: ``docs/advanced/p2p-weight-transfer.md``). See
    sim/world/update_cost.py for every term of the update path and the anchors they are fitted
    to."""
    bucket_fixed_seconds: float = 0.0
    """Each bucket's fixed cost on its source (packing it, one call per bucket)."""
    broadcast_hop_seconds: float = 0.0
    """A broadcast's time per bucket for each doubling of its members (log2 of the target
    GPUs and the source): what makes one broadcast slower over more GPUs, as
    checkpoint-engine's Kimi-K2 and DeepSeek-V3.1 rows are from 16 to 256 GPUs (0: not
    charged; sim/world/update_cost.py)."""
    group_make_seconds: float = 0.0
    """Making a cell's weight-update group afresh (after it connects: first, new engines,
    stale, a member failed), charged on the source with the first bucket over the new group:
    the trainer's rendezvous and every engine's /init_weights_update_group, at once. miles
    pays it on every reconnect, which at scale follows each engine change (0: not charged,
    and not recorded; the CPU backend measures it, docs/timing.md)."""
    group_make_seconds_per_engine: float = 0.0
    """What each engine in the group adds to its making (a broadcast group of N engines pays
    N of these; p2p's pair groups, made in turn, one each)."""
    gather_bytes_per_second: float = 0.0
    """Megatron's TP/EP all-gather of a bucket within each PP stage (0: not charged)."""
    convert_bytes_per_second: float = 0.0
    """Megatron -> HF conversion of a gathered bucket, per PP stage (0: not charged)."""
    quantize_bytes_per_second: float = 0.0
    """The rollout side's requantization (e.g. FP8), per engine GPU (0: not charged)."""
    load_bytes_per_second: float = 0.0
    """The engine's load of a received bucket into its model, per GPU (0: not charged)."""
    gather_shares: int = 1
    """Pipeline stages of the trainer: each gathers and sends its own share at once."""
    engine_ep: int = 1
    """Expert shards of an engine: under many-source p2p each rank receives 1/engine_ep."""
    engine_tp: int = 1
    """Tensor-parallel shards of an engine: under many-source p2p each rank receives
    1/max(engine_ep, engine_tp) (SGLang builds EP within TP, so a rank's share is its TP
    shard; 1 with engine_ep 1: the whole bucket, the old model)."""
    reshard_bytes_per_second: float = 0.0
    """A p2p sender's re-shard of its stage's bucket into one target engine rank's layout,
    once per engine rank it serves, in turn (miles' p2p.py send_bucket: load_weights into
    that rank's CPU replica before its writes; sim/world/update_cost.py reshard_seconds).
    0: not charged."""
    many_source_p2p: bool = False
    """p2p as miles' RDMA path sends: every trainer GPU writes its own share, so the source
    side has one NIC per GPU and each target rank takes its shard (False: each engine has a
    link of its own from the source, at that link's rate)."""
    pipelined_buckets: bool = False
    """A bucket's gather, wire and load overlap the next bucket's (miles' p2p hands the last
    engine's writes to a thread pool); False: they follow one another (miles' broadcast)."""
    router_failure_seconds: float = 0.5
    """How long a failing router takes to answer with an error."""
    reward_success_rate: float | None = None
    """Rewards are a verifier's 0 or 1, 1 with this probability (so a group can have equal
    rewards, which miles' check_reward_nonzero_std filter drops); None: uniform in [0, 1)."""
    node_addresses: str = "ipv4"
    """How the simulator's nodes are named, each drawn at random per run: ipv4 (10.a.b.c),
    ipv6 (fd00::x), hostnames (node-N, which resolve to nothing) or mixed (a node each way
    in turn). The bundles' order must not depend on it beyond the documented rule."""

    def __post_init__(self) -> None:
        may_be_zero = {
            "concurrency_slowdown",
            "response_tokens_max",
            "train_jitter",
            "link_latency_seconds",
            "control_reply_seconds",
            "engine_start_seconds",
            "cell_start_seconds",
            "job_restart_seconds",
            *UPDATE_COST_RATES,
            "update_fixed_seconds",
            "bucket_fixed_seconds",
            "broadcast_hop_seconds",
            "group_make_seconds",
            "group_make_seconds_per_engine",
            "train_fixed_seconds",
            *GENERATION_ZEROS,
        }
        rate = self.reward_success_rate
        if rate is not None and not (
            isinstance(rate, int | float) and not isinstance(rate, bool) and 0 < rate < 1
        ):
            raise ConfigError(
                "reward_success_rate", f"got {rate!r}", "pass a probability strictly in (0, 1)"
            )
        if self.node_addresses not in NODE_ADDRESSES:
            raise ConfigError(
                "node_addresses",
                f"got {self.node_addresses!r}",
                f"pass one of {', '.join(NODE_ADDRESSES)}",
            )
        for name in TIME_SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"got {getattr(self, name)!r}", "pass true or false")
        for name in TIME_COUNTS:
            if not int_at_least(getattr(self, name), 1):
                raise ConfigError(name, f"got {getattr(self, name)!r}", "pass an integer >= 1")
        for name in TIME_CAPS:
            if not int_at_least(getattr(self, name), 0):
                raise ConfigError(
                    name, f"got {getattr(self, name)!r}", "pass an integer >= 0 (0: no cap)"
                )
        for f in fields(self):
            value = getattr(self, f.name)
            skip = ("reward_success_rate", "node_addresses", *TIME_SWITCHES, *TIME_COUNTS)
            if f.name in skip or f.name in TIME_CAPS:
                continue
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = (
                ok
                and math.isfinite(value)
                and (value > 0 or (value == 0 and f.name in may_be_zero))
            )
            if not ok:
                floor = ">= 0" if f.name in may_be_zero else "> 0"
                raise ConfigError(f.name, f"got {value!r}", f"pass a finite number {floor}")
        if self.train_jitter >= 1:
            raise ConfigError(
                "train_jitter", f"got {self.train_jitter!r}", "pass a fraction below 1, e.g. 0.1"
            )
        _check_generation(self)

    def batch_law(self) -> bool:
        """Decode steps follow the running batch (docs/generation.md), not the per-request law."""
        return bool(
            self.decode_step_fixed_seconds
            or self.decode_step_seconds_per_request
            or self.decode_step_seconds_per_kv_token
        )

    def kv_tokens(self) -> int:
        """Tokens the KV pool of one engine holds (SGLang's max_total_num_tokens): the GPU's
        static share less the weights, over one token's KV; 0: not modelled."""
        if not self.engine_gpu_memory_bytes:
            return 0
        pool = self.engine_gpu_memory_bytes * self.mem_fraction_static
        tokens = (pool - self.model_weight_bytes_per_gpu) / self.kv_bytes_per_token
        return max(0, math.floor(min(tokens, MAX_KV_TOKENS)))  # a float past it would overflow

    def running_cap(self) -> int | None:
        """The most requests one engine runs at once: max_running_requests or as many as the KV
        pool holds at prompt_tokens + response_tokens_max each, the smaller; None: no cap."""
        caps = [self.max_running_requests] if self.max_running_requests else []
        if self.engine_gpu_memory_bytes:
            reserved = self.prompt_tokens + self.response_tokens_max
            caps.append(math.floor(self.kv_tokens() / reserved))
        return min(caps) if caps else None


UPDATE_COST_RATES = (
    "gather_bytes_per_second",
    "convert_bytes_per_second",
    "quantize_bytes_per_second",
    "load_bytes_per_second",
    "reshard_bytes_per_second",
)
"""Rates of the update path that 0 leaves uncharged (the simulator's default)."""
TIME_SWITCHES = (
    "many_source_p2p",
    "pipelined_buckets",
    "batch_split_by_quorum",
    "charge_every_prefill",
)
TIME_CAPS = ("max_running_requests",)
"""Counts where 0 means no cap."""
MAX_KV_TOKENS = 1e15
"""A KV pool is counted up to this many tokens (a PB of memory at one byte a token)."""
GENERATION_ZEROS = (
    "response_tokens_max_fraction",
    "engine_gpu_memory_bytes",
    "model_weight_bytes_per_gpu",
    "kv_bytes_per_token",
    "decode_step_fixed_seconds",
    "decode_step_seconds_per_request",
    "decode_step_seconds_per_kv_token",
)
"""The generation model's numbers that 0 leaves off (docs/generation.md)."""
TIME_COUNTS = ("gather_shares", "engine_ep", "engine_tp")
NODE_ADDRESSES = ("ipv4", "ipv6", "hostnames", "mixed")
"""How the simulator may name its nodes ([sim] node_addresses)."""
PREFIX_CACHES = ("off", "shared", "by_version")
"""The engines' prefix caches ([sim] prefix_cache)."""
SHAPE_SWITCHES = frozenset({"flush_refuses_while_queued"})
"""The shape's keys that are true or false (SGLang's behaviours)."""
SHAPE_PACES = frozenset({"engine_token_seconds"})
"""The shape's keys that are seconds (the engines' pace)."""
SHAPE_CHOICES = {"prefix_cache": PREFIX_CACHES}
"""The shape's keys that name one of a few choices; every other one is a count."""
MAX_TOKEN_SECONDS = 10.0
"""The slowest token pace a scenario may set: a request of a few hundred tokens then lasts
about an hour already."""
SHAPE_KEYS = frozenset(f.name for f in fields(WorldShape)) - {"unit_bytes"}
SHAPE_COUNTS = SHAPE_KEYS - SHAPE_SWITCHES - SHAPE_PACES - SHAPE_CHOICES.keys()
TIME_KEYS = frozenset(f.name for f in fields(TimeModel))


def _check_generation(timing: TimeModel) -> None:
    """The generation model's keys that only make sense together, each error naming the key
    that asked for what the others do not give (docs/generation.md)."""
    fraction = timing.response_tokens_max_fraction
    if fraction >= 1 or (fraction and not timing.response_tokens_max):
        fix = "pass a fraction below 1 with response_tokens_max set (the length they run to)"
        raise ConfigError("response_tokens_max_fraction", f"got {fraction!r}", fix)
    if timing.mem_fraction_static > 1:
        raise ConfigError(
            "mem_fraction_static", f"got {timing.mem_fraction_static!r}", "pass a share in (0, 1]"
        )
    memory, kv = timing.engine_gpu_memory_bytes, timing.kv_bytes_per_token
    if kv and not memory:
        fix = "set engine_gpu_memory_bytes too (the KV pool is sized from it), or leave this 0"
        raise ConfigError("kv_bytes_per_token", f"got {kv!r}", fix)
    if timing.model_weight_bytes_per_gpu and not memory:
        fix = "set engine_gpu_memory_bytes too (the weights take their share of it), or leave 0"
        raise ConfigError(
            "model_weight_bytes_per_gpu", f"got {timing.model_weight_bytes_per_gpu!r}", fix
        )
    if not memory:
        return
    if not kv:
        fix = "set kv_bytes_per_token too (layers x kv_heads x head_dim x 2 x dtype bytes)"
        raise ConfigError("engine_gpu_memory_bytes", f"got {memory!r}", fix)
    if not timing.response_tokens_max:
        fix = "set response_tokens_max too: each running request reserves prompt + it in KV"
        raise ConfigError("engine_gpu_memory_bytes", f"got {memory!r}", fix)
    reserved = timing.prompt_tokens + timing.response_tokens_max
    if timing.kv_tokens() < reserved:
        raise ConfigError(
            "engine_gpu_memory_bytes",
            f"got {memory!r}: its KV pool holds {timing.kv_tokens()} tokens, less than one "
            f"request's prompt_tokens + response_tokens_max = {reserved:g}",
            "pass more memory, or lower model_weight_bytes_per_gpu or kv_bytes_per_token",
        )
