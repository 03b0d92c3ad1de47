"""Data-buffer put/get throughput: 10k groups through DataBuffer under a staleness bound.

Timed: the puts and gets (and one metrics() call) of 10,000 groups of 8
samples; the groups are built before each round (``setup``), as the rollout
side would build them, so a round times the buffer alone. The driver mimics
the fully-async loop: for each weight version, 32 groups are put, then the
trainer gets until it has 32 groups to train or the queue runs dry; the next
version's groups are put after that. Groups lag the current version by 0 to 4
versions; with --max-weight-staleness 2 the ones 3 or 4 behind are stale, every
101st group has an aborted sample, and the handler is retry.
"""

from __future__ import annotations

from miles_core.buffer import (
    BufferConfig,
    DataBuffer,
    Fate,
    Group,
    Reason,
    Sample,
    SampleStatus,
    UnusedHandler,
)

GROUPS, BATCH, N_SAMPLES, BOUND, MAX_LAG, ABORT_EVERY = 10_000, 32, 8, 2, 4, 101


def lag_of(group_id: int, version: int) -> int:
    return min(version, group_id % (MAX_LAG + 1))


def make_groups() -> list[list[Group]]:
    """Groups per version: batch b (version b) holds groups generated b - lag versions ago."""
    batches = []
    for version in range(GROUPS // BATCH + (GROUPS % BATCH > 0)):
        batch = []
        for gid in range(version * BATCH, min(GROUPS, (version + 1) * BATCH)):
            old = version - lag_of(gid, version)
            aborted = gid % ABORT_EVERY == 0
            samples = tuple(
                Sample(
                    gid * N_SAMPLES + k,
                    (old, version) if k % 2 else (old,),
                    SampleStatus.ABORTED if aborted and k == 0 else SampleStatus.COMPLETED,
                )
                for k in range(N_SAMPLES)
            )
            batch.append(Group(gid, gid, samples))
        batches.append(batch)
    return batches


def drive(batches: list[list[Group]]) -> tuple[DataBuffer, list, dict[str, float]]:
    buffer = DataBuffer(
        BufferConfig(
            rollout_batch_size=BATCH,
            max_weight_staleness=BOUND,
            unused_samples_handler=UnusedHandler.RETRY,
            n_samples_per_prompt=N_SAMPLES,
        )
    )
    verdicts = []
    for version, batch in enumerate(batches):
        for group in batch:
            verdict = buffer.put(group)
            if verdict.fate is not Fate.QUEUED:
                verdicts.append(verdict)
        trained = 0
        while trained < BATCH and len(buffer):
            for verdict in buffer.get(version):
                verdicts.append(verdict)
                trained += verdict.fate is Fate.TRAIN
    return buffer, verdicts, buffer.metrics(len(batches) - 1)


def test_buffer_put_get_10k_groups(benchmark) -> None:
    buffer, verdicts, metrics = benchmark.pedantic(
        drive, setup=lambda: ((make_groups(),), {}), rounds=10, iterations=1, warmup_rounds=1
    )

    # Every group gets exactly one final verdict; nothing is lost or blocked.
    assert len(buffer) == 0
    assert sorted(v.group.group_id for v in verdicts) == list(range(GROUPS))
    aborted = {g for g in range(GROUPS) if g % ABORT_EVERY == 0}
    stale = {g for g in range(GROUPS) if g not in aborted and lag_of(g, g // BATCH) > BOUND}
    by_fate: dict[tuple[Fate, Reason | None], set[int]] = {}
    for v in verdicts:
        by_fate.setdefault((v.fate, v.reason), set()).add(v.group.group_id)
        if v.fate is Fate.TRAIN:
            assert v.staleness == lag_of(v.group.group_id, v.group.group_id // BATCH) <= BOUND
    assert by_fate.pop((Fate.RECYCLE, Reason.ABORTED)) == aborted
    assert by_fate.pop((Fate.RECYCLE, Reason.STALE)) == stale
    assert by_fate.pop((Fate.TRAIN, None)) == set(range(GROUPS)) - aborted - stale
    assert not by_fate
    # The last window's metrics: everything since the last reset, under miles' names.
    assert metrics["rollout/fully_async/recycled_groups"] == len(aborted) + len(stale)
    assert metrics["rollout/fully_async/blocked_puts"] == 0

    benchmark.extra_info.update(
        groups=GROUPS,
        samples_per_group=N_SAMPLES,
        trained=GROUPS - len(aborted) - len(stale),
        recycled_stale=len(stale),
        recycled_aborted=len(aborted),
    )
    if benchmark.stats is not None:  # None under --benchmark-disable
        stats = benchmark.stats.stats
        benchmark.extra_info["groups_per_s_median"] = round(GROUPS / stats.median)
        benchmark.extra_info["groups_per_s_min_time"] = round(GROUPS / stats.min)
