"""Swarm soak: every seed draws its own cluster, flags and fault mix; all oracles must hold.

Each failing seed prints the command that replays it.
"""

from __future__ import annotations

import pytest

from miles_core.events import FaultInjected, RunStatus
from sim.run import run_scenario
from sim.swarm import swarm_scenario

SEEDS = range(200)


@pytest.mark.parametrize("seed", SEEDS)
def test_swarm_seed(seed: int) -> None:
    result = run_scenario(swarm_scenario(seed), seed)
    replay = f"python -m sim run swarm --seed {seed}"
    failed = "\n".join(str(v) for v in result.verdicts.values() if v)
    assert result.ok, f"{failed}\nreplay: {replay}"
    assert result.report.status is RunStatus.COMPLETED, f"{result.report.reason}\nreplay: {replay}"


def test_the_swarm_really_injects_a_mix_of_faults() -> None:
    kinds: set[str] = set()
    fired = 0
    for seed in range(40):
        history = run_scenario(swarm_scenario(seed), seed).history
        faults = [e for e in history if isinstance(e, FaultInjected)]
        fired += len(faults)
        kinds |= {e.fault.value for e in faults}
    assert fired >= 80
    assert kinds >= {
        "kill_cell",
        "start_cell",
        "kill_engine",
        "restart_engine",
        "slow_cell",
        "slow_link",
        "delay_router",
        "fail_router",
    }


@pytest.mark.parametrize("seed", range(20))
def test_total_loss_ends_with_a_clear_error(seed: int) -> None:
    result = run_scenario(swarm_scenario(seed, total_loss=True), seed)
    assert result.report.status is RunStatus.FAILED
    assert "NoAliveCellError" in result.report.reason
    assert result.ok, "\n".join(str(v) for v in result.verdicts.values() if v)


def test_a_swarm_seed_replays_bit_for_bit() -> None:
    assert run_scenario(swarm_scenario(5), 5).hash == run_scenario(swarm_scenario(5), 5).hash
