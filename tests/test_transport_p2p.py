"""CollectiveTransport's sends: one bucket to every engine's pair group at once (p2p), over
the groups a cell's connect names, kept across updates until it connects again.

The world is a stand-in that records the calls the transport makes to the cell's
actor and the engines' routes, so no Ray starts; the trainer's side of the same
send (every broadcast started before any is waited for) is tested with the bench's
sender in tests/test_transfer_bench.py.
"""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")

from backends.common.world.transport import CollectiveTransport
from miles_core.backend import Delivery, EngineFailure
from miles_core.transfer import ParamSpec, UpdateUnit, plan_buckets


class _Cell:
    index = 0
    ticket_lock = False  # one rank: today's miles takes no weight-update lock

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    async def call(self, method: str, *args: Any) -> list[Any]:
        self.log.append(("cell", method, *args))
        return [{"checksum": "c0", "send_bucket": 0.5}.get(method)]


class _Engine:
    def __init__(self, log: list[tuple[Any, ...]], name: str, fail: bool = False) -> None:
        self.log, self.name, self.fail = log, name, fail

    async def request(
        self, incarnation: int, method: str, route: str, body: dict, seconds: float = 0.0
    ) -> dict:
        self.log.append((self.name, incarnation, route, body))
        if self.fail and route == "/update_weights_from_distributed":
            raise EngineFailure(self.name, "died mid-bucket")
        return {"success": True}


def _world(failing: str = "") -> tuple[SimpleNamespace, list[tuple[Any, ...]]]:
    log: list[tuple[Any, ...]] = []
    world = SimpleNamespace(
        cells={0: _Cell(log)},
        engines={e: _Engine(log, e, e == failing) for e in ("e0", "e1", "e2")},
        store_addr=("127.0.0.1", 1234),
        settings=SimpleNamespace(
            stack=SimpleNamespace(collective_backend="gloo", packed=False),
            collective_timeout=60.0,
        ),
        rt=SimpleNamespace(now=lambda: 0.0),
        impaired=lambda what: False,
        transfers=SimpleNamespace(add=lambda *a: log.append(("transfer", *a))),
        faults=SimpleNamespace(fire=lambda point, **where: log.append(("fault", where))),
    )
    return world, log


BUCKET_ROUTE = "/update_weights_from_distributed"


def _routed(log: list[tuple[Any, ...]], route: str) -> list[tuple[Any, ...]]:
    """The engines' requests to ``route``: (engine, incarnation, route, body)."""
    return [c for c in log if c[2:3] == (route,)]


def _bucket() -> Any:
    units = [UpdateUnit("w", (ParamSpec.of("w", (4, 4), "float32"),))]
    return plan_buckets(units, 1 << 20)[0]


def _connected(
    transport: CollectiveTransport, method: str, update_id: int, engines: dict[str, int], **kw: Any
) -> Any:
    """Connect cell 0 to ``engines``, then one send (``method``) to them."""

    async def main() -> Any:
        await transport.connect(update_id, 0, engines)
        return await getattr(transport, method)(update_id, 0, _bucket(), engines, **kw)

    return asyncio.run(main())


def test_send_bucket_each_sends_once_on_every_pair_group_and_delivers_each_engine() -> None:
    world, log = _world()
    transport = CollectiveTransport(world)  # type: ignore[arg-type]
    engines = {"e1": 3, "e0": 2}
    delivered = _connected(transport, "send_bucket_each", 7, engines)
    # each pair group made by this send (the stand-in's clock stands still: 0 s)
    assert delivered == (Delivery(("e0",), 0.0, "c0", 0.0), Delivery(("e1",), 0.0, "c0", 0.0))
    groups = {
        e: c[3]["group_name"]
        for c in log
        if c[2:3] == ("/init_weights_update_group",)
        for e in [c[0]]
    }
    assert set(groups) == {"e0", "e1"} and len(set(groups.values())) == 2  # a pair group each
    joins = [c[3] for c in _routed(log, "/init_weights_update_group")]
    assert all((j["rank_offset"], j["world_size"]) == (1, 2) for j in joins)
    sends = [c for c in log if c[:2] == ("cell", "send_bucket")]
    assert sends == [("cell", "send_bucket", [groups["e0"], groups["e1"]], _bucket(), False)]
    received = {
        c[0]: c[3]["group_name"] for c in log if c[2:3] == ("/update_weights_from_distributed",)
    }
    assert received == groups  # each engine receives on its own pair group, same call
    assert [c[0] for c in log].count("transfer") == 2  # p2p counts a send per engine
    assert [c for c in log if c[0] == "fault"] == [("fault", {"cell": 0, "bucket": 0})] * 2


def test_send_bucket_each_names_the_engine_that_failed() -> None:
    world, _ = _world(failing="e1")
    transport = CollectiveTransport(world)  # type: ignore[arg-type]
    with pytest.raises(EngineFailure) as failure:
        _connected(transport, "send_bucket_each", 1, {"e0": 1, "e1": 1})
    assert failure.value.engine == "e1"


def test_send_bucket_to_one_group_still_names_it_alone() -> None:
    """Broadcast (and the update loop's one-engine p2p calls): the cell gets one group name."""
    world, log = _world()
    transport = CollectiveTransport(world)  # type: ignore[arg-type]
    delivery = _connected(transport, "send_bucket", 2, {"e0": 1, "e2": 1})
    assert delivery.engines == ("e0", "e2")
    (send,) = [c for c in log if c[:2] == ("cell", "send_bucket")]
    assert isinstance(send[2], str)
    received = {c[3]["group_name"] for c in _routed(log, BUCKET_ROUTE)}
    assert received == {send[2]}


@pytest.mark.parametrize("packed", [False, True])
def test_each_bucket_body_is_what_miles_sends(packed: bool) -> None:
    """miles' broadcast.py: no load_format (one broadcast per tensor), the version as a
    string with every bucket, flush_cache false; --flattened-bucket asks for the packed one,
    and the trainer is told which it sends."""
    world, log = _world()
    world.settings.stack.packed = packed
    transport = CollectiveTransport(world)  # type: ignore[arg-type]
    _connected(transport, "send_bucket", 4, {"e0": 1}, version=12)
    (body,) = [c[3] for c in _routed(log, BUCKET_ROUTE)]
    assert body["weight_version"] == "12" and body["flush_cache"] is False
    assert body.get("load_format") == ("flattened_bucket" if packed else None)
    assert ("load_format" in body) is packed
    (send,) = [c for c in log if c[:2] == ("cell", "send_bucket")]
    assert send[-1] is packed


def test_a_cells_group_is_kept_across_updates_until_it_connects_again() -> None:
    """miles keeps its update group from update to update; a new connect destroys the old
    group on both sides (in the background) and the next bucket makes the new one."""
    world, log = _world()
    world.rt = SimpleNamespace(now=itertools.count().__next__)  # a second per reading
    transport = CollectiveTransport(world)  # type: ignore[arg-type]
    engines = {"e0": 1, "e1": 1}

    async def main() -> list[float | None]:
        made = []
        await transport.connect(1, 0, engines)
        for update_id in (1, 2, 3):  # three updates, one group
            made.append(
                (await transport.send_bucket(update_id, 0, _bucket(), engines)).group_seconds
            )
        assert len(_routed(log, "/init_weights_update_group")) == 2  # one join per engine
        await transport.connect(4, 0, {"e0": 1, "e1": 2})
        made.append(
            (await transport.send_bucket(4, 0, _bucket(), {"e0": 1, "e1": 2})).group_seconds
        )
        await asyncio.gather(*transport._destroying)
        return made

    # the first bucket over each new group reports its making (timed alone), no other
    assert asyncio.run(main()) == [1, None, None, 1]
    joins = _routed(log, "/init_weights_update_group")
    assert [(c[0], c[1]) for c in joins[2:]] == [("e0", 1), ("e1", 2)]
    first, second = joins[0][3]["group_name"], joins[2][3]["group_name"]
    assert first != second
    destroyed = _routed(log, "/destroy_weights_update_group")
    assert {(c[0], c[1], c[3]["group_name"]) for c in destroyed} == {
        ("e0", 1, first),
        ("e1", 1, first),
    }
    assert ("cell", "destroy_update_group", first) in log


def test_a_process_the_cell_did_not_connect_is_in_none_of_its_groups() -> None:
    world, log = _world()
    transport = CollectiveTransport(world)  # type: ignore[arg-type]

    async def main() -> None:
        await transport.connect(1, 0, {"e0": 1, "e1": 1})
        await transport.send_bucket(1, 0, _bucket(), {"e0": 1, "e1": 2})

    with pytest.raises(EngineFailure) as failure:
        asyncio.run(main())
    assert failure.value.engine == "e1" and "process 2 is not in cell 0's" in failure.value.reason
    assert not _routed(log, BUCKET_ROUTE)  # nothing was sent
