"""What the orchestration needs from a world: trainer cells, engines, a router, a transport.

The simulator implements these over SimPy models, the CPU backend over Ray
actors. Each call is a coroutine; a component that died raises
ComponentFailure (naming what died), and the orchestration decides what that
means through the cell group, the engine table and the ledger. Implementations
translate; they never decide (no retries, no version numbers of their own).

A world also reports what it sees without being asked (WorldObserver): a new
process for an engine or a cell, an engine process that exited, the way a real
cluster learns of them (an actor that died, a server answering its health
check). A trainer cell's death is found the way miles finds it: by its calls
failing and its heartbeats going unanswered. Calls to an engine are
addressed to one process (its incarnation): a call that reaches a process
which has since been replaced raises EngineFailure instead of landing on the
new one. Replies carry what the world measured (a cell's compute time, which
engines a bucket reached), so the history records what happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from miles_core.buffer import Group
from miles_core.cells import Heal, Outcome
from miles_core.kinds import PauseMode
from miles_core.placement import Placement
from miles_core.saves import SaveState, StoredSave
from miles_core.transfer import Bucket, ParamSpec, UpdateUnit
from miles_core.values import frozen_value


class ComponentFailure(Exception):
    """A cell, an engine or the router failed (died, or was unreachable) during a call.

    ``args`` are exactly the constructor's arguments, so the exception can be
    re-created from them (SimPy and Ray both do).
    """

    def __init__(self, component: str, reason: str) -> None:
        super().__init__(component, reason)
        self.component = component
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.component}: {self.reason}"


class CellFailure(ComponentFailure):
    def __init__(self, cell: int, reason: str) -> None:
        super().__init__(f"cell-{cell}", reason)
        self.args = (cell, reason)
        self.cell = cell


LINK_CUT = "the link to the engines is cut"
"""What a collective that waited out its timeout on a partition says (both worlds); the
partition's witness and probe read it."""


def link_cut(cell: int, bucket: int, timeout: float) -> CellFailure:
    """The source cell's failure when a bucket's collective waited ``timeout`` on a cut link
    (torch's broadcast raises there, in the sending rank)."""
    reason = f"its broadcast of bucket {bucket} heard from no engine for {timeout:g}s: {LINK_CUT}"
    return CellFailure(cell, reason)


class EngineFailure(ComponentFailure):
    def __init__(self, engine: str, reason: str) -> None:
        super().__init__(engine, reason)
        self.engine = engine


class VersionOutOfSync(EngineFailure):
    """An engine answered under a weight version the control plane cannot trust: one it
    cannot read (SGLang's /update_weight_version takes any string as ``new_version``, and
    so does the CPU engine), or one that no stamp of this control plane explains. The
    process is alive and its label is wrong: the control plane takes it out of rotation
    and re-syncs it (supervision.py ``out_of_sync``); the sample is not used. A caller
    that knows only EngineFailure takes it out of rotation all the same."""


class RequestRefused(Exception):
    """An engine that is alive refused a request (SGLang answered 4xx): the request was
    wrong, which is the control plane's bug, not a failure of the engine."""

    def __init__(self, component: str, reason: str) -> None:
        super().__init__(component, reason)
        self.component = component
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.component} refused: {self.reason}"


class SessionAlreadyOpen(RequestRefused):
    """/begin_weight_update refused because the engine's update session is still open
    (SGLang 0.5.23 refuses a second begin: scheduler_components/weight_updater.py
    ``begin_weight_update``). An aborted attempt of an update leaves it open: a retry's
    begin meets it, and miles' retry fails there."""


class RouterFailure(ComponentFailure):
    """The router could not deliver a request; the engine behind it may be fine."""

    def __init__(self, reason: str) -> None:
        super().__init__("router", reason)
        self.args = (reason,)


@frozen_value()
class GenerateRequest:
    group_id: int
    prompt_id: int
    sample: int
    turn: int = 0
    kv_namespace: str | None = None
    """The prefix-cache namespace its group was submitted under (miles'
    ``--namespaced-radix-cache``: ``train:-:{rollout_id}``, sent as ``extra_key``); None: one
    cache for every request."""
    start_weight_version: int | None = None
    """The version published when the request was sent, declared to the engine (SGLang's
    draft ``GenerateReqInput.start_weight_version``, sglang #34185) under
    --pause-abort-below-start-weight-version; None: not sent (miles sends none today)."""


@frozen_value()
class GenerateResult:
    """What SGLang's /generate returns that the control plane reads (meta_info)."""

    engine: str
    weight_version: int | None
    aborted: bool
    reward: float = 0.0
    payload: Any = field(default=None, compare=False, repr=False)
    """Opaque to the control plane (token ids for the trainer); copied into the Sample."""
    engine_seconds: float | None = None
    """How long the engine says it worked on the request (meta_info's e2e latency)."""
    versions: tuple[int | None, ...] = ()
    """The versions of the response's token spans, in order (meta_info's weight_versions)."""
    kept_kv: bool = False
    """Tokens after an update attended to KV an older version computed (in_place)."""
    cached_versions: tuple[int | None, ...] = ()
    """The versions of the weights that computed the prompt KV it reused from the engine's
    prefix cache (SGLang reports only ``cached_tokens``; the world says which weights)."""
    incarnation: int | None = None
    """The process that answered, where the router sent it elsewhere than asked (None: the
    one asked): a server whose actor is gone may still be in the router (miles #100)."""


@dataclass(frozen=True)
class TrainReport:
    """A cell's own account of one attempt it finished."""

    outcome: Outcome
    """NORMAL, or DISCARDED when the cross-cell exchange failed (no optimizer step)."""
    exchange: tuple[int, ...]
    """The cells it exchanged gradients with (the group it joined)."""
    seconds: float
    """Its forward/backward time, as the cell measured it."""


@dataclass(frozen=True)
class Delivery:
    """What a bucket send achieved, as the transport saw it."""

    engines: tuple[str, ...]
    """The engines that hold the bucket now."""
    seconds: float
    trainer_checksum: str | None = None
    """The source's checksum of the whole model this update sends, where the world can read
    weights (the Ray world); the engines' stamps answer theirs, and the updater records
    both (WeightsChecked). None where it cannot (the simulator, no weights)."""
    group_seconds: float | None = None
    """How long making the group this bucket went over took, where this send made it (the
    first bucket after the cell connected; the updater records it, UpdateGroupMade); None
    where the group was made before, or (the simulator) its making is not charged. Not part
    of ``seconds``."""


class TrainCell(Protocol):
    index: int

    async def train(
        self, step: int, attempt: int, batch: Sequence[Group], members: tuple[int, ...]
    ) -> TrainReport:
        """One attempt of a step, exchanging gradients with ``members``.

        Raises CellFailure when this cell dies.
        """
        ...

    async def heal(self, heal: Heal) -> None:
        """Receive a checkpoint from ``heal.src_cell`` into this cell's running processes
        (raises CellFailure naming who died, or this cell when it has no processes)."""
        ...

    async def ping(self) -> None:
        """Raise CellFailure if the cell is dead (its rank 0 stamps and publishes)."""
        ...

    async def heartbeat(self) -> None:
        """Return when the cell answers a heartbeat. A dead cell's raises CellFailure, as
        soon as the world knows it is dead (Ray refuses a call to a dead actor at once); a
        muted or hung one never answers."""
        ...

    def stop(self) -> None:
        """Kill the cell's processes (the control plane declared it failed)."""
        ...


class RolloutEngine(Protocol):
    """One engine process, through SGLang's API as miles uses it."""

    id: str

    async def pause(self, mode: PauseMode, abort_below: int | None = None) -> None:
        """Stop generating (/pause_generation): abort ends what is in flight; retract puts
        it back in the queue, its KV freed; in_place freezes it. New requests wait.
        ``abort_below`` (SGLang's draft ``abort_below_start_weight_version``, sglang #34185;
        never with abort): the requests in flight that declared a ``start_weight_version``
        strictly below it end aborted instead; None: not sent."""
        ...

    async def flush_cache(self) -> None:
        """Drop the KV and prefix cache; refused (RequestRefused) while a request holds pages."""
        ...

    async def begin_update(self) -> None:
        """/begin_weight_update: open the session that buckets load into; SessionAlreadyOpen
        if one is open already (SGLang refuses a second)."""
        ...

    async def end_update(self) -> None:
        """/end_weight_update: close it (post-load processing of the whole model); refused
        (RequestRefused) when none is open."""
        ...

    async def resume(self) -> None: ...

    async def stamp(self, version: int, abort_all_requests: bool = True) -> str | None:
        """/update_weight_version: the weight_version the engine reports from now on. As in
        SGLang, unless told ``abort_all_requests=False`` it aborts every request in flight.
        Answers the checksum of the weights the engine now serves where its world can read
        them (the CPU world's local engine), else None."""
        ...

    async def health(self) -> None:
        """/health_generate: return once the engine generated a token; a hung engine never
        returns (the caller times it out), a dead one raises EngineFailure."""
        ...

    async def unload_adapter(self, adapter: str) -> None:
        """Drop a LoRA adapter (SGLang's unload_lora_adapter) before its new weights load."""
        ...


class Router(Protocol):
    async def generate(
        self, engine: str, incarnation: int, request: GenerateRequest
    ) -> GenerateResult:
        """Send one generate call to that process of ``engine``; raises EngineFailure if it
        is dead or replaced, RouterFailure if the router could not deliver it. A server the
        router still lists after its actor went (an orphan) may take the call instead, as
        the router's least-requests policy sends it there (the result names it)."""
        ...

    def remove_worker(self, engine: str, incarnation: int) -> bool:
        """Take that process's server out of the router, by its address (its actor may be
        gone), and abort what it still serves; True if it was still listed (an orphan).
        miles' ``SGLangEngine.shutdown`` removes the worker through the actor, so a lost
        actor's server stays (miles #100)."""
        ...


class WeightTransport(Protocol):
    async def connect(self, update_id: int, source_cell: int, engines: Mapping[str, int]) -> None:
        """Make the source cell's weight-update group for these engine processes (id ->
        incarnation), in place of the group it held: SGLang's /init_weights_update_group on
        each engine as the cell's rank joins. Buckets then travel over it until the control
        plane connects that cell again. Raises CellFailure or EngineFailure naming who failed."""
        ...

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        """Move one bucket from the source cell to these engine processes (id -> incarnation)
        over the group it connected; raises CellFailure or EngineFailure naming who failed
        (a process the cell's group was not made for fails the collective). ``version``: the
        version the update stamps, which miles sends with every bucket (SGLang's
        ``weight_version``)."""
        ...

    async def send_bucket_each(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> tuple[Delivery, ...]:
        """p2p: the bucket to each engine on its own link, all at once (one Delivery per
        engine, as that many ``send_bucket`` calls would return); raises as send_bucket."""
        ...


class WorldObserver(Protocol):
    """What a world tells the control plane without being asked."""

    def engine_started(self, engine: str, incarnation: int, how: str) -> None:
        """A new process for ``engine`` answers (initial weights, no version)."""
        ...

    def engine_exited(self, engine: str, incarnation: int, how: str) -> None:
        """That process of ``engine`` is gone (a dead actor, a process exit)."""
        ...

    def cell_started(self, cell: int, incarnation: int, how: str) -> None:
        """New processes for ``cell`` answer (initial weights, ready to be healed)."""
        ...


class CheckpointStore(Protocol):
    """A world's saves (miles' ``--save`` directory), kept across a job's death: written by a
    cell's processes, listed when a killed job resumes. A world that can save has one as its
    cluster's ``checkpoints``; the loop asks for it only with ``--save-interval``."""

    async def write(self, cell: int, state: SaveState) -> None:
        """Write a save from ``cell``'s processes (their weights and optimizer, and ``state``),
        committed once every byte is written (its tracker last); raises CellFailure if the
        cell dies first, which leaves the save torn."""
        ...

    def saves(self) -> tuple[StoredSave, ...]:
        """Every save the storage holds, committed or torn."""
        ...


class Cluster(Protocol):
    """One world: its components, and the model's parameters for the bucket plan."""

    num_cells: int
    gpus_per_cell: int
    engine_ids: tuple[str, ...]
    units: tuple[UpdateUnit, ...]
    """The full model's parameters, grouped into update units."""
    lora_params: tuple[ParamSpec, ...]
    """The LoRA adapter's parameters (lora_A / lora_B), when training one."""
    router: Router
    transport: WeightTransport
    placement: Placement
    """Where the world put each cell's ranks and each engine's GPUs (recorded at the start)."""

    def cell(self, index: int) -> TrainCell: ...

    def engine(self, engine_id: str, incarnation: int) -> RolloutEngine:
        """That process of the engine; its calls raise EngineFailure once it was replaced."""
        ...

    def attach(self, observer: WorldObserver) -> None:
        """Report new processes to ``observer`` from now on."""
        ...

    def restart_engine(self, engine_id: str) -> None:
        """Start a new process for the engine slot (killing what is left of the old one);
        the world reports it (engine_started) once it answers. The control plane's own
        recovery of an engine (--use-fault-tolerance)."""
        ...

    def stop_engine(self, engine_id: str) -> None:
        """Stop the engine's process (what is left of it), starting none; the world reports
        the exit. Today's mini FT controller's suspend (miles'
        ``stop_cell_between_weight_updates``); its resume is ``restart_engine``."""
        ...

    def start_cell(self, index: int) -> None:
        """New processes for a cell (killing what is left of the old ones); the world reports
        them (cell_started), and the next refresh heals them. The control plane's own
        restart of a cell (--mini-ft-controller-enable; miles' ``allocate_for_pending``).
        Raises CellFailure if the world could not create them."""
        ...
