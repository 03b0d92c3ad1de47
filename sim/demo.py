"""A core demonstration: miles_core's state machines driven step by step, no SimPy.

The story of seed report 004 in a few seconds: two independent-DP cells train
while two engines generate; at ``crash_step`` the updating cell dies after
bucket 1 of a weight update; the update fails over to the next alive cell and
the version continues from the ledger; at ``heal_step`` the dead cell is
restarted and healed from the first alive cell. Rollout runs ahead of training,
so old groups go stale and are recycled. Every action is recorded in the event
history and all six oracles judge it.

``private_counter=True`` replays the bug instead: each cell counts versions
itself, so after the failover the version goes backwards; the buffer refuses
the regression and the monotonic_versions oracle reports it.

This is a stepping stone: the simulator issue replaces it with the fully-async
loop under SimPy virtual time.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from miles_core.buffer import BufferConfig, DataBuffer, Fate, Group, Sample, UnusedHandler
from miles_core.cells import CellGroup, Decision, Outcome
from miles_core.errors import MilesCoreError
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    BucketSent,
    CellStateChanged,
    EnginesPaused,
    EnginesResumed,
    EngineStamped,
    Event,
    FaultInjected,
    FaultKind,
    GroupDropped,
    GroupGot,
    GroupPut,
    GroupRecycled,
    GroupTrained,
    HealBegan,
    HealEnded,
    History,
    PromptDrawn,
    QuorumChanged,
    RunEnded,
    RunStarted,
    RunStatus,
    SampleGenerated,
    StepBegan,
    StepCommitted,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.oracles import Violation, check_all
from miles_core.transfer import ParamSpec, plan_buckets, units_of
from miles_core.versions import VersionLedger
from miles_core.weight_update import (
    PauseEngines,
    PublishVersion,
    ResumeEngines,
    SendBucket,
    StampEngines,
    WeightUpdate,
)

PROGRESS_WINDOW = 60.0
"""Seconds (demo time) within which a step must commit after the last fault."""


@dataclass(frozen=True)
class DemoConfig:
    seed: int = 0
    steps: int = 8
    num_cells: int = 2
    num_engines: int = 2
    rollout_batch_size: int = 4
    n_samples_per_prompt: int = 2
    max_weight_staleness: int = 1
    unused_samples_handler: UnusedHandler = UnusedHandler.RETRY
    crash_step: int | None = 3
    """The updating cell dies after bucket 1 of this step's weight update."""
    heal_step: int | None = 5
    """The dead cell is restarted before this step."""
    private_counter: bool = False
    """Replay the seed-report bug: each cell counts versions itself."""


@dataclass
class DemoResult:
    config: DemoConfig
    history: History
    verdicts: dict[str, Violation | None]
    versions: list[int] = field(default_factory=list)
    steps_done: int = 0
    status: RunStatus = RunStatus.COMPLETED
    reason: str = ""

    @property
    def ok(self) -> bool:
        return all(v is None for v in self.verdicts.values())


# A tiny model's parameters, packed into 3 buckets of 4 KiB.
_PARAMS = (
    ParamSpec.of("embed.weight", (64, 16), "float32"),
    ParamSpec.of("layer0.attn.qkv", (48, 16), "bfloat16"),
    ParamSpec.of("layer0.mlp.up", (32, 16), "float32"),
    ParamSpec.of("layer0.mlp.down", (16, 32), "float32"),
    ParamSpec.of("lm_head.weight", (64, 16), "bfloat16"),
)
_BUCKETS = plan_buckets(units_of(_PARAMS), buffer_size=4096)


class _Demo:
    def __init__(self, config: DemoConfig) -> None:
        self.c = config
        self.rng = random.Random(config.seed)
        self.t = 0.0
        self.history = History()
        self.ledger = VersionLedger()
        self.private = [0] * config.num_cells
        self.cells = CellGroup(config.num_cells, gpus_per_cell=1)
        self.buffer = DataBuffer(
            BufferConfig(
                rollout_batch_size=config.rollout_batch_size,
                max_weight_staleness=config.max_weight_staleness,
                unused_samples_handler=config.unused_samples_handler,
                n_samples_per_prompt=config.n_samples_per_prompt,
            )
        )
        self.engines = {f"engine-{i}": None for i in range(config.num_engines)}
        self.next_prompt = 0
        self.next_group = 0
        self.next_update = 0
        self.recycled: deque[int] = deque()
        self.blocked: deque[Group] = deque()
        self.published: list[int] = []

    def emit(self, event_type: type[Event], dt: float = 0.01, **fields: object) -> None:
        self.t = round(self.t + dt, 6)
        self.history.append(event_type(t=self.t, **fields))

    # -- rollout -------------------------------------------------------------

    def generate_group(self) -> Group:
        if self.recycled:
            prompt = self.recycled.popleft()
        else:
            prompt = self.next_prompt
            self.next_prompt += 1
            self.emit(PromptDrawn, prompt_id=prompt)
        group_id = self.next_group
        self.next_group += 1
        samples = []
        for index in range(self.c.n_samples_per_prompt):
            engine = self.rng.choice(sorted(self.engines))
            version = self.engines[engine]
            self.emit(
                SampleGenerated,
                dt=self.rng.uniform(0.05, 0.2),
                group_id=group_id,
                prompt_id=prompt,
                sample=index,
                turn=0,
                engine=engine,
                version=version,
            )
            samples.append(Sample(index, (version,), reward=self.rng.random()))
        return Group(group_id, prompt, tuple(samples))

    def put(self, group: Group) -> bool:
        verdict = self.buffer.put(group)
        if verdict.fate in (Fate.QUEUED, Fate.BLOCKED):
            self.emit(
                GroupPut,
                group_id=group.group_id,
                prompt_id=group.prompt_id,
                fate=verdict.fate.value,
            )
        else:
            self.record_unused(verdict.group, verdict.fate, str(verdict.reason))
        return verdict.fate is not Fate.BLOCKED

    def record_unused(self, group: Group, fate: Fate, reason: str) -> None:
        if fate is Fate.RECYCLE:
            self.recycled.append(group.prompt_id)
            self.emit(
                GroupRecycled, group_id=group.group_id, prompt_id=group.prompt_id, reason=reason
            )
        else:
            self.emit(
                GroupDropped, group_id=group.group_id, prompt_id=group.prompt_id, reason=reason
            )

    def produce(self, n: int) -> None:
        """Rollout runs ahead: keep generating until n groups were offered or the buffer blocks."""
        for _ in range(n):
            group = self.blocked.popleft() if self.blocked else self.generate_group()
            if not self.put(group):
                self.blocked.appendleft(group)
                return

    def drain(self) -> list[Group]:
        batch: list[Group] = []
        while len(batch) < self.c.rollout_batch_size:
            if not len(self.buffer):
                self.produce(1)
                continue
            for verdict in self.buffer.get(self.ledger_version()):
                group = verdict.group
                if verdict.fate is Fate.TRAIN:
                    self.emit(
                        GroupGot,
                        group_id=group.group_id,
                        prompt_id=group.prompt_id,
                        current_version=self.ledger_version(),
                        staleness=verdict.staleness,
                    )
                    batch.append(group)
                else:
                    self.record_unused(group, verdict.fate, str(verdict.reason))
            if self.blocked:
                self.produce(1)
        return batch

    def ledger_version(self) -> int | None:
        return self.published[-1] if self.published else None

    # -- training --------------------------------------------------------------

    def record_cells(self) -> None:
        for tr in self.cells.take_transitions():
            self.emit(
                CellStateChanged, cell=tr.cell, old=tr.old.value, new=tr.new.value, reason=tr.reason
            )

    def train(self, step: int, batch: list[Group]) -> None:
        self.emit(StepBegan, step=step)
        while True:
            plan = self.cells.refresh()
            self.record_cells()
            if plan.reconfigure:
                self.emit(QuorumChanged, quorum_id=plan.quorum_id, members=plan.members)
            for heal in plan.heals:
                self.emit(
                    HealBegan,
                    quorum_id=plan.quorum_id,
                    src_cell=heal.src_cell,
                    dst_cell=heal.dst_cell,
                    src_ranks=heal.src_ranks,
                    dst_ranks=heal.dst_ranks,
                )
                self.cells.heal_done(heal.dst_cell)
                self.record_cells()
                self.emit(HealEnded, dt=1.0, dst_cell=heal.dst_cell, ok=True)
            attempt = self.cells.begin_attempt(step)
            self.emit(
                AttemptBegan,
                step=step,
                attempt=attempt.attempt,
                quorum_id=attempt.quorum_id,
                cells=attempt.cells,
            )
            result = self.cells.finish_attempt({c: Outcome.NORMAL for c in attempt.cells})
            self.emit(
                AttemptEnded,
                dt=2.0,
                step=step,
                attempt=attempt.attempt,
                decision=result.decision.value,
                normal=result.normal,
                discarded=result.discarded,
                errored=result.errored,
            )
            if result.decision is Decision.COMMIT:
                break
        self.emit(StepCommitted, step=step, attempt=attempt.attempt, n_groups=len(batch))
        for group in batch:
            self.emit(
                GroupTrained, dt=0.0, group_id=group.group_id, prompt_id=group.prompt_id, step=step
            )

    def update_weights(self, step: int) -> None:
        call = self.cells.routed("update_weights")
        engines = tuple(sorted(self.engines))
        while True:
            cell = call.target()
            updater = f"cell-{cell}"
            if self.c.private_counter:
                self.private[cell] += 1
                version = self.private[cell]
            else:
                version = self.ledger.reserve(updater)
            update_id = self.next_update
            self.next_update += 1
            update = WeightUpdate(version, engines, len(_BUCKETS))
            self.emit(
                UpdateBegan,
                update_id=update_id,
                version=version,
                updater=cell,
                kind=update.kind.value,
                n_buckets=len(_BUCKETS),
                engines=engines,
            )
            if self.run_update(step, cell, update_id, update):
                return
            call.failed("died during the weight update")
            self.ledger.abandon(version)
            self.emit(UpdateAborted, update_id=update_id, version=version, reason=f"{updater} died")

    def run_update(self, step: int, cell: int, update_id: int, update: WeightUpdate) -> bool:
        """Execute the plan's steps; False when the updater dies mid-way."""
        while (item := update.next_step()) is not None:
            if isinstance(item, PauseEngines):
                self.emit(EnginesPaused, update_id=update_id, engines=item.engines)
            elif isinstance(item, SendBucket):
                nbytes = _BUCKETS[item.bucket].nbytes
                self.emit(
                    BucketSent,
                    dt=0.5,
                    update_id=update_id,
                    bucket=item.bucket,
                    n_buckets=item.n_buckets,
                    engines=item.engines,
                    nbytes=nbytes,
                )
                if step == self.c.crash_step and cell == 0 and item.bucket == 1:
                    self.emit(
                        FaultInjected, fault=FaultKind.KILL_CELL, cell=cell, detail="after bucket 1"
                    )
                    return False
            elif isinstance(item, StampEngines):
                for engine in item.engines:
                    self.engines[engine] = item.version
                    self.emit(
                        EngineStamped, update_id=update_id, engine=engine, version=item.version
                    )
            elif isinstance(item, PublishVersion):
                if not self.c.private_counter:
                    self.ledger.publish(item.version, f"cell-{cell}")
                self.published.append(item.version)
                self.emit(VersionPublished, update_id=update_id, version=item.version, updater=cell)
            elif isinstance(item, ResumeEngines):
                self.emit(EnginesResumed, update_id=update_id, engines=item.engines)
            update.complete(item)
        return True

    # -- the run ----------------------------------------------------------------

    def run(self) -> DemoResult:
        c = self.c
        self.emit(
            RunStarted,
            dt=0.0,
            seed=c.seed,
            scenario="demo-private-counter" if c.private_counter else "demo",
            engines=tuple(sorted(self.engines)),
            num_cells=c.num_cells,
            max_weight_staleness=c.max_weight_staleness,
        )
        status, reason, steps = RunStatus.COMPLETED, f"{c.steps} steps", 0
        try:
            for step in range(c.steps):
                if step == c.heal_step and self.cells.alive() != tuple(range(c.num_cells)):
                    dead = next(i for i in range(c.num_cells) if i not in self.cells.alive())
                    self.emit(
                        FaultInjected,
                        fault=FaultKind.START_CELL,
                        cell=dead,
                        detail="operator restart",
                    )
                    self.cells.restart(dead, "operator restart")
                    self.record_cells()
                self.produce(c.rollout_batch_size + 2)
                self.train(step, self.drain())
                self.update_weights(step)
                steps += 1
        except MilesCoreError as error:
            status, reason = RunStatus.FAILED, f"{type(error).__name__}: {error}"
        self.record_cells()
        outstanding = [g.prompt_id for g in self.buffer.queued()] + list(self.recycled)
        outstanding += [g.prompt_id for g in self.blocked]
        self.emit(
            RunEnded, status=status, reason=reason, outstanding_prompts=tuple(sorted(outstanding))
        )
        return DemoResult(
            config=c,
            history=self.history,
            verdicts=check_all(self.history, PROGRESS_WINDOW),
            versions=self.published,
            steps_done=steps,
            status=status,
            reason=reason,
        )


def run_demo(config: DemoConfig = DemoConfig()) -> DemoResult:
    """Run the demonstration; the same config gives the same history hash."""
    return _Demo(config).run()
