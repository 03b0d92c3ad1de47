"""The event history: order, canonical form (enums as their values), hash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle

import pytest

from miles_core.cells import CellState, Decision, Outcome
from miles_core.engines import EngineState
from miles_core.errors import ConfigError
from miles_core.events import (
    _REGISTRY,
    AttemptEnded,
    BucketReceived,
    CellStateChanged,
    CellTrained,
    EngineStateChanged,
    FaultInjected,
    FaultScheduled,
    GroupPut,
    History,
    RunEnded,
    RunStarted,
    SampleGenerated,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
    event_from_dict,
)
from miles_core.kinds import (
    AbortCause,
    FaultKind,
    FaultPoint,
    PutFate,
    RunStatus,
    SampleOutcome,
)
from miles_core.scenario import SCENARIOS
from miles_core.weight_update import UpdateKind
from sim.run import run_scenario
from sim.search.swarm import swarm_scenario


def _history() -> History:
    return History(
        [
            RunStarted(
                t=0.0,
                seed=3,
                scenario="s",
                engines=("e0", "e1"),
                num_cells=2,
                max_weight_staleness=None,
                steps=4,
                expected_status=RunStatus.FAILED,
                expected_error="NoAliveCellError",
            ),
            FaultScheduled(
                t=0.0,
                index=0,
                fault=FaultKind.KILL_CELL,
                cell=1,
                detail="before_allreduce step=2",
                point=FaultPoint.BEFORE_ALLREDUCE,
            ),
            FaultScheduled(t=0.0, index=1, fault=FaultKind.SLOW_LINK, at=2.5),
            FaultInjected(
                t=0.5,
                index=0,
                fault=FaultKind.KILL_CELL,
                cell=1,
                detail="before allreduce",
                point=FaultPoint.BEFORE_ALLREDUCE,
            ),
            CellStateChanged(
                t=0.5, cell=1, old=CellState.ALIVE, new=CellState.ERRORED, reason="killed"
            ),
            CellTrained(
                t=0.6,
                cell=0,
                step=0,
                attempt=1,
                outcome=Outcome.DISCARDED,
                exchange=(0, 1),
                seconds=0.25,
            ),
            AttemptEnded(
                t=0.7,
                step=0,
                attempt=1,
                decision=Decision.RETRY,
                normal=(),
                discarded=(0,),
                errored=(1,),
            ),
            UpdateBegan(
                t=1.0,
                update_id=0,
                version=1,
                updater=0,
                kind=UpdateKind.LORA,
                n_buckets=2,
                engines=("e0", "e1"),
            ),
            BucketReceived(
                t=1.2,
                update_id=0,
                bucket=0,
                n_buckets=2,
                engines=("e0", "e1"),
                incarnations=(0, 2),
                nbytes=1024,
                seconds=0.2,
            ),
            UpdateAborted(
                t=1.3,
                update_id=0,
                version=1,
                cause=AbortCause.ENGINE,
                component="e1",
                reason="e1 died",
            ),
            VersionPublished(t=1.5, update_id=1, version=1, updater=0),
            EngineStateChanged(
                t=1.6,
                engine="e1",
                old=EngineState.SERVING,
                new=EngineState.DOWN,
                incarnation=2,
                reason="died",
            ),
            SampleGenerated(
                t=1.7,
                group_id=4,
                prompt_id=3,
                sample=1,
                turn=0,
                engine="e0",
                incarnation=0,
                version=None,
                outcome=SampleOutcome.ROUTER_FAILED,
                sent=1.1,
            ),
            GroupPut(t=1.8, group_id=4, prompt_id=3, fate=PutFate.BLOCKED),
            RunEnded(
                t=2.0,
                status=RunStatus.CRASHED,
                reason="KeyError: 'x'",
                outstanding_prompts=(3, 4),
                awaiting_regeneration=(4,),
                error="KeyError",
                traceback="KeyError: 'x'\n  miles_core/loop/run.py:10 in run",
            ),
        ]
    )


def test_time_never_goes_backwards() -> None:
    history = _history()
    with pytest.raises(
        ConfigError, match=r"event.t: VersionPublished at t=1.0 is earlier than the last event"
    ):
        history.append(VersionPublished(t=1.0, update_id=1, version=2, updater=0))
    assert len(history) == 15
    history.append(VersionPublished(t=2.0, update_id=1, version=2, updater=0))  # same time: fine
    assert len(history) == 16


def test_enums_are_written_as_their_values() -> None:
    rows = _history().to_dicts()
    assert rows[0]["expected_status"] == "failed"
    assert rows[1]["point"] == "before_allreduce" and rows[2]["point"] is None
    assert (rows[4]["old"], rows[4]["new"]) == ("alive", "errored")
    assert rows[6]["decision"] == "retry"
    assert rows[7]["kind"] == "lora"
    assert rows[8]["incarnations"] == [0, 2]
    assert rows[9]["cause"] == "engine"
    assert rows[11]["new"] == "down"
    assert rows[12]["outcome"] == "router_failed" and rows[12]["version"] is None
    assert rows[13]["fate"] == "blocked"
    assert rows[14]["status"] == "crashed"
    for row in rows:  # plain JSON: nothing an encoder has to know about
        assert json.loads(json.dumps(row)) == row
        assert all(type(v) in (int, float, str, bool, list, type(None)) for v in row.values())


def test_round_trip_through_dicts_keeps_types_and_hash() -> None:
    history = _history()
    again = History.from_dicts(json.loads(json.dumps(history.to_dicts())))
    assert list(again) == list(history)
    assert type(again[0].expected_status) is RunStatus
    assert again[1].point is FaultPoint.BEFORE_ALLREDUCE  # an `X | None` enum field
    assert again[2].point is None and again[2].at == 2.5
    assert again[3].fault is FaultKind.KILL_CELL and again[3].point is FaultPoint.BEFORE_ALLREDUCE
    assert again[4].old is CellState.ALIVE and again[4].new is CellState.ERRORED
    assert again[5].outcome is Outcome.DISCARDED and again[5].exchange == (0, 1)
    assert again[6].decision is Decision.RETRY and again[6].errored == (1,)
    assert again[7].kind is UpdateKind.LORA and again[7].publishes is True
    assert again[8].incarnations == (0, 2)
    assert again[9].cause is AbortCause.ENGINE
    assert again[11].new is EngineState.DOWN and not again[11].up
    assert again[12].outcome is SampleOutcome.ROUTER_FAILED and again[12].aborted
    assert again[12].engine_seconds is None
    assert again[13].fate is PutFate.BLOCKED
    assert again[14].status is RunStatus.CRASHED and again[14].awaiting_regeneration == (4,)
    assert again[14].traceback.endswith("run.py:10 in run")
    assert again.hash() == history.hash()


def test_every_event_holds_its_fields_in_slots_and_stays_frozen() -> None:
    """A long run keeps a million events: each is one object, with no dict beside it (vars()
    still reads its fields). A pickled event (a sweep's, through Ray) comes back equal, and
    of the registered class."""
    for event in _history():
        cls = type(event)
        assert _REGISTRY[cls.__name__] is cls
        assert cls.__dictoffset__ == 0, cls.__name__  # no dict of its own
        assert vars(event) == {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
        again = pickle.loads(pickle.dumps(event))
        assert again == event and type(again) is cls
        with pytest.raises(dataclasses.FrozenInstanceError):
            event.t = 0.0  # type: ignore[misc]
    assert len({type(e) for e in _history()}) >= 14


def test_properties_read_the_enum_fields() -> None:
    sample = _history()[12]
    assert isinstance(sample, SampleGenerated)
    for outcome in SampleOutcome:
        assert sample.__class__(**{**vars(sample), "outcome": outcome}).aborted is (
            outcome is not SampleOutcome.COMPLETED
        )
    change = _history()[11]
    assert isinstance(change, EngineStateChanged)
    for state in EngineState:
        assert change.__class__(**{**vars(change), "new": state}).up is (
            state is not EngineState.DOWN
        )


def _reference_hash(history: History) -> str:
    """The hash as its docstring defines it: each row's canonical JSON, a newline after each,
    a RunEnded's traceback read as "" (where the code raised, not what happened)."""
    digest = hashlib.sha256()
    for row in history.to_dicts():
        if row["type"] == "RunEnded":
            row["traceback"] = ""
        digest.update(json.dumps(row, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    return digest.hexdigest()


def test_hash_is_sha256_of_the_canonical_json() -> None:
    history = _history()
    assert history.hash() == _reference_hash(history)
    assert len(history.hash()) == 64
    assert History().hash() == hashlib.sha256().hexdigest()


def test_the_hash_of_simulated_histories_is_that_of_their_canonical_rows() -> None:
    """Every event class a run records, with enums and tuples in every position: the rows
    the hash reads in one call each hash as ``to_dict``'s."""
    runs = [run_scenario(scenario, 0) for scenario in SCENARIOS.values()]
    runs += [run_scenario(swarm_scenario(seed), seed) for seed in range(12)]
    kinds = {type(event) for run in runs for event in run.history}
    assert len(kinds) >= 35, sorted(k.__name__ for k in kinds)
    for run in runs:
        assert run.history.hash() == _reference_hash(run.history), run.scenario.name


def test_hash_changes_with_any_field() -> None:
    base = _history().hash()
    for seq, field, value in [
        (10, "version", 2),
        (1, "point", "after_bucket"),
        (2, "point", "step_begin"),
        (4, "new", "stopped"),
        (8, "incarnations", [0, 1]),
        (14, "reason", "another"),
    ]:
        changed = _history().to_dicts()
        changed[seq][field] = value
        assert History.from_dicts(changed).hash() != base, (seq, field)


def test_hash_reads_no_traceback() -> None:
    """A traceback names source files and lines: moving code must not change a run's hash,
    so the hash reads it as "" (and a history keeps it: --history, to_dict)."""
    base = _history()
    moved = base.to_dicts()
    assert moved[14]["type"] == "RunEnded" and moved[14]["traceback"]
    moved[14]["traceback"] = "NoAliveCellError: ...\n  sim/world/runtime.py:519 in __await__"
    assert History.from_dicts(moved).hash() == base.hash()
    assert History.from_dicts(moved).to_dicts()[14]["traceback"] != base.to_dicts()[14]["traceback"]


def test_unknown_or_incomplete_events_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown event type 'Nope'"):
        event_from_dict({"type": "Nope", "t": 0})
    with pytest.raises(ConfigError, match="unknown event type 'BucketSent'"):
        event_from_dict({"type": "BucketSent", "t": 0})
    with pytest.raises(ConfigError, match=r"VersionPublished.updater: is missing"):
        event_from_dict({"type": "VersionPublished", "t": 0, "update_id": 0, "version": 1})
    row = _history().to_dicts()[0]
    del row["steps"]  # a field with a default is still required in a row
    with pytest.raises(ConfigError, match=r"RunStarted.steps: is missing"):
        event_from_dict(row)
    with pytest.raises(ConfigError, match="append Event instances"):
        History().append({"type": "RunEnded"})  # type: ignore[arg-type]


def test_an_unknown_enum_value_is_refused() -> None:
    row = _history().to_dicts()[3]
    row["fault"] = "kill_everything"
    with pytest.raises(ValueError, match="'kill_everything' is not a valid FaultKind"):
        event_from_dict(row)
