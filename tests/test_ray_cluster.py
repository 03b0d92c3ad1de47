"""`--address`: the sweep and the CPU backend on a real two-node Ray cluster started here.

Both nodes run on this machine (two `ray start` processes with their own raylets);
the sweep's tasks and the CPU backend's GPU bundles must land on both, and no
process of the cluster may outlive the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.ray_cluster import Cluster, leftovers, two_node_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with two_node_cluster(cpus=1, gpus=2) as running:
        yield running
    assert leftovers(str(running.temp_dir)) == []  # every node process is gone


def _json_run(cluster: Cluster, *argv: str, expect: int = 0) -> dict:
    done = subprocess.run(
        [sys.executable, *argv, "--address", cluster.address, "--json"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == expect, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sweep_tasks_land_on_both_nodes(cluster: Cluster) -> None:
    info = _json_run(cluster, "-m", "sim", "sweep", "--seeds", "48", "--recheck", "4")
    assert info["nodes"] == 2 and info["workers"] == 2  # the cluster's CPUs, not this machine's
    assert len(info["seeds_per_node"]) == 2, info["seeds_per_node"]
    assert sum(info["seeds_per_node"].values()) == 48
    assert info["ok"] and info["determinism"]["rechecked"] == 4


def test_cpu_backend_actors_land_on_both_nodes(cluster: Cluster) -> None:
    info = _json_run(cluster, "-m", "backends.cpu", "run", "--steps", "3")
    assert info["status"] == "completed", info["reason"]
    assert all(v == "pass" for v in info["oracles"].values()), info["oracles"]
    # 2 cells and 2 engines of one GPU each, on nodes of 2 GPUs: both nodes hold bundles
    assert sorted(info["ray_nodes"].values()) == [2, 2], info["ray_nodes"]
