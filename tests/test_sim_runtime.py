"""The SimPy runtime: virtual time, tasks, signals, cancellation, seeded ties."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_core.runtime import Cancelled
from sim.world.runtime import SimRuntime, derive_seed


def test_sleep_advances_virtual_time_only() -> None:
    rt = SimRuntime(seed=0)

    async def main() -> float:
        await rt.sleep(2.5)
        await rt.sleep(0)
        return rt.now()

    assert rt.run(main()) == 2.5


def test_tasks_run_concurrently_and_join_with_values() -> None:
    rt = SimRuntime(seed=1)

    async def worker(delay: float, value: str) -> str:
        await rt.sleep(delay)
        return f"{value}@{rt.now():g}"

    async def main() -> tuple[list[str], float]:
        tasks = [rt.spawn(worker(3, "a"), "a"), rt.spawn(worker(1, "b"), "b")]
        values = await rt.wait_all(tasks)
        return values, rt.now()

    assert rt.run(main()) == (["a@3", "b@1"], 3.0)


def test_wait_any_gives_the_first_and_await_task_gives_its_result() -> None:
    rt = SimRuntime(seed=2)

    async def worker(delay: float) -> float:
        await rt.sleep(delay)
        return delay

    async def main() -> tuple[int, float, float]:
        slow, fast = rt.spawn(worker(5), "slow"), rt.spawn(worker(2), "fast")
        first = await rt.wait_any([slow, fast])
        at = rt.now()
        return first, at, await slow

    assert rt.run(main()) == (1, 2.0, 5)


def test_signal_wakes_every_waiter_with_its_value() -> None:
    rt = SimRuntime(seed=3)
    ready = rt.signal()
    seen: list[tuple[str, object, float]] = []

    async def waiter(name: str) -> None:
        seen.append((name, await ready, rt.now()))

    async def main() -> None:
        tasks = [rt.spawn(waiter(n), n) for n in ("x", "y")]
        await rt.sleep(4)
        ready.set("go")
        ready.set("ignored: a signal is set once")
        await rt.wait_all(tasks)

    rt.run(main())
    assert sorted(seen) == [("x", "go", 4.0), ("y", "go", 4.0)]
    assert ready.is_set()


def test_cancel_raises_inside_the_task_and_in_whoever_awaits_it() -> None:
    rt = SimRuntime(seed=4)
    cleanup: list[float] = []

    async def cell() -> None:
        try:
            await rt.sleep(100)
        except Cancelled as stop:
            cleanup.append(rt.now())
            assert stop.reason == "kill before allreduce"
            raise

    async def main() -> str:
        task = rt.spawn(cell(), "cell-0")
        await rt.sleep(7)
        task.cancel("kill before allreduce")
        try:
            await task
        except Cancelled as stop:
            return f"{stop.reason} at {rt.now():g}"
        return "not cancelled"

    assert rt.run(main()) == "kill before allreduce at 7"
    assert cleanup == [7.0]


def test_a_cancelled_task_nobody_awaits_does_not_crash_the_run() -> None:
    rt = SimRuntime(seed=5)

    async def forever() -> None:
        await rt.sleep(1e9)

    async def main() -> bool:
        task = rt.spawn(forever(), "engine-0")
        task.cancel("engine killed")  # even before it started
        await rt.sleep(1)
        return task.done()

    assert rt.run(main()) is True


def test_a_failure_propagates_to_the_awaiter() -> None:
    rt = SimRuntime(seed=6)

    async def broken() -> None:
        await rt.sleep(1)
        raise ValueError("bucket 3 checksum mismatch")

    async def main() -> None:
        await rt.spawn(broken(), "updater")

    with pytest.raises(ValueError, match="bucket 3 checksum mismatch"):
        rt.run(main())


def test_a_deadlock_is_reported_not_hung() -> None:
    rt = SimRuntime(seed=7)

    async def main() -> None:
        await rt.signal()  # nobody will ever set it

    with pytest.raises(RuntimeError, match="deadlock at t=0"):
        rt.run(main())


def test_awaiting_a_foreign_awaitable_is_refused() -> None:
    rt = SimRuntime(seed=8)

    class Foreign:
        def __await__(self):
            yield "not a simpy event"

    async def main() -> None:
        await Foreign()

    with pytest.raises(TypeError, match="may await only what the Runtime hands out"):
        rt.run(main())


def _tie_order(seed: int) -> list[str]:
    rt = SimRuntime(seed=seed)
    order: list[str] = []

    async def at_one(name: str) -> None:
        await rt.sleep(1)
        order.append(name)

    async def main() -> None:
        await rt.wait_all([rt.spawn(at_one(n), n) for n in "abcdef"])

    rt.run(main())
    return order


def test_simultaneous_events_are_ordered_by_the_seed() -> None:
    orders = {tuple(_tie_order(seed)) for seed in range(12)}
    assert len(orders) > 1  # insertion order does not decide
    assert _tie_order(3) == _tie_order(3)  # the seed does


def test_rng_streams_are_named_seeded_and_independent() -> None:
    a, b = SimRuntime(seed=9), SimRuntime(seed=9)
    assert a.rng("engine-0") is a.rng("engine-0")
    assert [a.rng("engine-0").random() for _ in range(3)] == [
        b.rng("engine-0").random() for _ in range(3)
    ]
    b.rng("a-new-stream").random()  # drawing elsewhere does not shift engine-0's stream
    assert a.rng("engine-0").random() == b.rng("engine-0").random()
    assert a.rng("engine-1").random() != SimRuntime(seed=9).rng("engine-0").random()
    assert derive_seed(9, "x") == derive_seed(9, "x") != derive_seed(10, "x")


def test_run_until_stops_virtual_time() -> None:
    rt = SimRuntime(seed=10)

    async def main() -> None:
        await rt.sleep(50)

    with pytest.raises(TimeoutError, match="main did not finish by t=5"):
        rt.run(main(), until=5)
    assert rt.now() == 5.0


def test_negative_sleep_is_refused() -> None:
    with pytest.raises(ValueError, match="seconds >= 0, got -1"):
        SimRuntime(seed=0).sleep(-1)


def test_a_zero_delay_loop_is_reported_as_a_livelock() -> None:
    from sim.world.runtime import Livelock, SeededEnvironment

    rt = SimRuntime(seed=11)
    rt.env = SeededEnvironment(11, max_events_per_instant=500)

    async def spin() -> None:
        while True:
            await rt.sleep(0)

    with pytest.raises(Livelock, match="livelock at t=0: 500 events without time advancing"):
        rt.run(spin())


def test_an_eager_task_runs_its_first_step_before_spawn_returns() -> None:
    rt = SimRuntime(seed=9)
    order: list[str] = []

    async def answer(name: str) -> str:
        order.append(f"{name} starts")
        return name

    async def main() -> list[str]:
        lazy = rt.spawn(answer("lazy"), "lazy")
        eager = rt.spawn(answer("eager"), "eager", eager=True)
        order.append("spawned")
        return await rt.wait_all([lazy, eager])

    assert rt.run(main()) == ["lazy", "eager"]
    assert order == ["eager starts", "spawned", "lazy starts"]


def test_calls_that_answer_at_once_cost_no_simpy_event() -> None:
    """Eager tasks that end in their first step, joined: nothing to queue (a large run makes
    hundreds of thousands of such control calls); a task that waits still costs its wait."""
    rt = SimRuntime(seed=10)

    async def answer(engine: int) -> int:
        return engine

    async def main() -> list[int]:
        tasks = [rt.spawn(answer(e), f"pause-{e}", eager=True) for e in range(256)]
        return await rt.wait_all(tasks)

    assert rt.run(main()) == list(range(256))
    assert rt.env.processed == 1  # main's own end; no start, no end, no condition event

    waits = SimRuntime(seed=10)

    async def slow() -> None:
        await waits.sleep(1)

    async def joined() -> float:
        await waits.wait_all([waits.spawn(slow(), "slow", eager=True)])
        return waits.now()

    assert waits.run(joined()) == 1.0
    assert waits.env.processed == 2  # the sleep, and main's end


def test_an_eager_task_that_fails_at_once_fails_its_awaiter_or_else_the_run() -> None:
    rt = SimRuntime(seed=11)

    async def refuse() -> None:
        raise ValueError("engine-3 refused the pause")

    async def awaited() -> str:
        try:
            await rt.spawn(refuse(), "pause-3", eager=True)
        except ValueError as error:
            return str(error)
        return "no failure"

    assert rt.run(awaited()) == "engine-3 refused the pause"

    unawaited = SimRuntime(seed=11)

    async def forgotten() -> None:
        unawaited.spawn(refuse(), "pause-3", eager=True)
        await unawaited.sleep(1)

    with pytest.raises(ValueError, match="engine-3 refused the pause"):  # a crash, not a pass
        unawaited.run(forgotten())


def test_a_waiter_goes_on_at_the_instant_its_task_ends() -> None:
    rt = SimRuntime(seed=12)

    async def worker() -> float:
        await rt.sleep(2)
        return rt.now()

    async def main() -> tuple[float, float, int]:
        ended = await rt.spawn(worker(), "worker")
        first = await rt.wait_any([rt.spawn(worker(), "again"), rt.timer(5)])
        return ended, rt.now(), first

    assert rt.run(main()) == (2.0, 4.0, 0)


def test_ties_at_one_instant_do_not_depend_on_events_for_other_instants() -> None:
    """The order of simultaneous events at t=1 is the same whether or not other events
    (at 0.5, at 2) were scheduled first: what an aimed fault's probe relies on."""

    def order(extra: tuple[float, ...]) -> list[str]:
        rt = SimRuntime(seed=5)
        seen: list[str] = []

        async def at(name: str, t: float) -> None:
            await rt.sleep(t)
            seen.append(name)

        async def main() -> None:
            others = [rt.spawn(at(f"x{t}", t), f"x{t}", eager=True) for t in extra]
            mine = [rt.spawn(at(n, 1.0), n, eager=True) for n in "abcdef"]
            await rt.wait_all([*others, *mine])

        rt.run(main())
        return [n for n in seen if not n.startswith("x")]

    assert order(()) == order((0.5,)) == order((2.0, 0.5, 3.0))


def test_a_task_cancelled_before_it_ran_fails_with_cancelled_and_no_warning() -> None:
    """Nor does the coroutine handed to it (RunContext.spawn wraps each task's coroutine in
    a guard): neither will ever run, so both are closed, not left to warn that they were
    never awaited when collected."""
    import gc
    import warnings

    ran: list[bool] = []

    def run() -> str:
        rt = SimRuntime(seed=0)

        async def body() -> None:
            ran.append(True)

        async def guard(inner: Coroutine[Any, Any, None]) -> None:
            await inner

        async def main() -> str:
            task = rt.spawn(guard(body()), "never-ran")  # not eager: it has not started yet
            task.cancel("stopped before it ran")
            try:
                await task
            except Cancelled as cancelled:
                return cancelled.reason
            return "ran"

        return rt.run(main())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run() == "stopped before it ran"
        gc.collect()
    assert ran == []
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


def test_a_task_that_never_started_by_the_end_of_the_run_is_closed_without_warning() -> None:
    """A run that stops (a crash mid-instant, say) with a task still waiting for its first
    step: that coroutine, and the one handed to it, are closed, not left to warn."""
    import gc
    import warnings

    def run() -> None:
        rt = SimRuntime(seed=0)

        async def body() -> None:
            raise AssertionError("a task of a finished run ran")

        async def guard(inner: Coroutine[Any, Any, None]) -> None:
            await inner

        rt.spawn(guard(body()), "late")  # not eager: its start event is queued
        rt._close_never_started()  # what run() does on its way out, however it ends

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


def _same_instant_order(seed: int, set_signal: str, waiter: bool) -> tuple[list[str], int]:
    """Eight tasks woken at one instant after a signal is set (by ``set_signal``): the order
    they ran in, and the events processed."""
    rt = SimRuntime(seed=seed)
    order: list[str] = []
    signal = rt.signal()

    async def sleeper(name: str) -> None:
        await rt.sleep(0)  # queued for this instant: its tie follows the signal's
        order.append(name)

    async def waiting() -> None:
        await signal
        order.append("waiter")

    async def main() -> None:
        tasks = [rt.spawn(waiting(), "waiter", eager=True)] if waiter else []
        await rt.sleep(1)
        getattr(signal, set_signal)()
        tasks += [rt.spawn(sleeper(f"s{i}"), f"s{i}", eager=True) for i in range(8)]
        await rt.wait_all(tasks)
        assert signal.is_set()

    rt.run(main())
    return order, rt.env.processed


@pytest.mark.parametrize("seed", range(6))
def test_a_signal_set_for_its_current_waiters_keeps_every_other_event_in_place(seed: int) -> None:
    """With nobody waiting it queues no event (an update sets one on each of 256 engines)
    and the events after it keep their order; with a waiter it is a plain set."""
    plain, plain_events = _same_instant_order(seed, "set", waiter=False)
    unheard, unheard_events = _same_instant_order(seed, "set_for_current_waiters", waiter=False)
    assert unheard == plain
    assert unheard_events == plain_events - 1
    waited, waited_events = _same_instant_order(seed, "set", waiter=True)
    assert _same_instant_order(seed, "set_for_current_waiters", waiter=True) == (
        waited,
        waited_events,
    )
    assert "waiter" in waited


def test_a_signal_set_for_its_current_waiters_lets_a_later_await_go_on_at_once() -> None:
    rt = SimRuntime(seed=3)
    signal = rt.signal()

    async def main() -> float:
        signal.set_for_current_waiters()
        signal.set_for_current_waiters()  # set already: nothing more
        await signal
        return rt.now()

    assert rt.run(main()) == 0.0
    assert rt.env.processed == 1  # main's own end


def _races(plan: dict[str, Any], timer_or: bool) -> tuple[list[tuple[str, int, float]], int]:
    """Waiters racing timers against shared signals, as requests race their engine's death and
    interrupt; each waits twice. What woke each, when, and the events processed."""
    rt = SimRuntime(plan["seed"])
    signals = [rt.signal() for _ in plan["signals"]]
    log: list[tuple[str, int, float]] = []

    def race(seconds: float) -> Any:
        if timer_or:
            return rt.timer_or(seconds, signals)
        return rt.wait_any([rt.timer(seconds), *signals])

    async def waiter(name: str, start: float, seconds: float) -> None:
        await rt.sleep(start)
        for round_ in range(2):
            log.append((f"{name}.{round_}", await race(seconds), rt.now()))

    async def setter(i: int, at: float, method: str) -> None:
        await rt.sleep(at)
        getattr(signals[i], method)()

    async def main() -> None:
        for i, (at, method) in enumerate(plan["signals"]):
            if at == "before":  # set and processed before any wait
                getattr(signals[i], method)()
                await rt.sleep(0)
        tasks = [
            rt.spawn(setter(i, at, method), f"set{i}")
            for i, (at, method) in enumerate(plan["signals"])
            if isinstance(at, float)
        ]
        tasks += [
            rt.spawn(waiter(f"w{j}", start, seconds), f"w{j}", eager=j % 2 == 0)
            for j, (start, seconds) in enumerate(plan["waiters"])
        ]
        await rt.wait_all(tasks)

    rt.run(main())
    return log, rt.env.processed


_TIMES = st.sampled_from([0.0, 0.5, 1.0, 2.0])


@given(
    st.fixed_dictionaries(
        {
            "seed": st.integers(0, 2**16),
            "signals": st.lists(
                st.tuples(
                    st.one_of(st.just("before"), st.just(None), _TIMES),
                    st.sampled_from(["set", "set_for_current_waiters"]),
                ),
                min_size=1,
                max_size=3,
            ),
            "waiters": st.lists(st.tuples(_TIMES, _TIMES), min_size=1, max_size=3),
        }
    )
)
def test_timer_or_is_wait_any_of_a_timer_and_the_signals(plan: dict[str, Any]) -> None:
    """``timer_or`` (every decode and train step waits on one) decides as ``wait_any`` of
    the same timer and signals: the same index, at the same instant, and the same events
    in the same order (the count, and the waiters' order at shared instants), whether a
    signal was set before the wait, during it, after it or never."""
    assert _races(plan, timer_or=True) == _races(plan, timer_or=False)
