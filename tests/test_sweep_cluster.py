"""Sweeps on a Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`,
each node with its own raylet, object store and a custom resource naming it), scripted
models, real containers: runs spread over the nodes and use their own node's services,
the evidence matches a one-machine sweep, and a node lost mid-sweep costs no run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from ray.cluster_utils import Cluster

from harness.evidence.schema import TIMING_COLUMNS, TRANSPORT_COLUMNS
from harness.gateway.models import GatewaySettings, LimitSettings
from harness.sweep.nodes import split_gateway_limits

REPO = Path(__file__).resolve().parents[1]
TABLES = ("rollouts", "candidates", "proposals", "events", "model_calls")
NODE_MEMORY = 80 * 1024 * 1024
# per run: evidence fields that say when or where, not what
WHERE_AND_WHEN = {"node_id", "node_host", "moved_from", "wall_s", "evidence_dir"}

pytestmark = pytest.mark.timeout(600)


@contextmanager
def simulated_cluster(workers: int = 2) -> Iterator[Cluster]:
    """A head and `workers` worker nodes, 2 CPUs each; a dead node is declared within seconds."""
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 2, "object_store_memory": NODE_MEMORY, "resources": {"node_head": 1}, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    try:
        for i in range(workers):
            cluster.add_node(num_cpus=2, object_store_memory=NODE_MEMORY, resources={f"node_worker{i}": 1})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def sweep_cmd(evidence: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "harness", "+sweep=smoke", "models=scripted", f"evidence_root={evidence}",
            *overrides]


def sweep_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return env | {"HARNESS_DATA_DIR": str(data_dir), "COLUMNS": "250", "PYTHONUNBUFFERED": "1"}


def run_sweep(evidence: Path, data_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    out = subprocess.run(sweep_cmd(evidence, *overrides), cwd=REPO, env=sweep_env(data_dir), capture_output=True,
                         text=True, timeout=500, start_new_session=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out


def index(sweep_dir: Path) -> dict[str, dict]:
    return {row["run_id"]: row for row in pq.read_table(sweep_dir / "index.parquet").to_pylist()}


def manifest(sweep_dir: Path, run_id: str) -> dict:
    return json.loads((sweep_dir / run_id / "manifest.json").read_text())


def check_each_rollout_once(sweep_dir: Path, rows: dict[str, dict]) -> None:
    """Every run's rollouts are in its evidence once: no seq twice, as many as its manifest counts."""
    for run_id, row in rows.items():
        rollouts = pl.read_parquet(sweep_dir / run_id / "rollouts.parquet")
        assert rollouts["seq"].n_unique() == rollouts.height > 0, run_id
        totals = manifest(sweep_dir, run_id)["totals"]
        assert rollouts.height == totals["rollouts"] + totals["heldout_rollouts"] == row["rollouts"] + totals[
            "heldout_rollouts"], run_id


def test_split_gateway_limits_shares_every_cap_evenly():
    settings = GatewaySettings(limits=LimitSettings(max_concurrency=10, requests_per_min=600, tokens_per_min=90_000),
                               model_limits={"big": LimitSettings(max_concurrency=2, requests_per_min=30)})
    three = split_gateway_limits(settings, 3)
    assert (three.limits.max_concurrency, three.limits.requests_per_min, three.limits.tokens_per_min) == (3, 200, 30_000)
    assert (three.model_limits["big"].max_concurrency, three.model_limits["big"].requests_per_min) == (1, 10)
    assert three.model_limits["big"].tokens_per_min is None  # no cap stays no cap
    assert split_gateway_limits(settings, 1) == settings


def test_twelve_runs_spread_over_three_nodes_and_match_a_one_machine_sweep(tmp_path, data_dir):
    """12 runs (2 containers x 6 seeds), 6 in flight, on a head and two workers: each node
    takes runs, each run calls its own node's gateway and container (the manifest says
    which), and every table matches the same sweep on one machine, timings aside."""
    seeds, budget = "sweep.seeds=[0,1,2,3,4,5]", "budget.max_rollouts=20"
    no_wall = "budget.max_wall_s=null"  # both stop on rollouts alone, however loaded the machine
    with simulated_cluster() as cluster:
        out = run_sweep(tmp_path / "cluster", data_dir, seeds, budget, no_wall, f"ray.address={cluster.address}",
                        "ray.max_runs_in_flight=6")
    run_sweep(tmp_path / "one", data_dir, seeds, budget, no_wall, "ray.max_runs_in_flight=6")
    on_cluster, on_one = tmp_path / "cluster" / "smoke", tmp_path / "one" / "smoke"
    rows, single = index(on_cluster), index(on_one)
    assert len(rows) == 12 and set(rows) == set(single)
    assert {r["status"] for r in rows.values()} == {"done"}
    placement = {run_id: row["node_id"] for run_id, row in rows.items()}
    print("\n" + "\n".join(f"{run_id[:8]} {rows[run_id]['container']:<14} seed {rows[run_id]['seed']} -> "
                           f"{rows[run_id]['node_host']}-{node[:8]}" for run_id, node in sorted(placement.items())))
    assert len(set(placement.values())) == 3, placement
    assert all(row["moved_from"] is None for row in rows.values())
    assert all(r["node_id"] is None for r in single.values())  # one machine: no node fields
    gateways: dict[str, set[str]] = {}
    for run_id, node in placement.items():
        where = manifest(on_cluster, run_id)["node"]
        assert where["node_id"] == node and where["policy_url"].startswith(where["gateway_url"])
        gateways.setdefault(node, set()).add(where["gateway_url"])
        assert f"-{node[:8]}" in out.stdout.split(run_id[:8], 1)[1].splitlines()[0]  # the table names the node
    assert all(len(urls) == 1 for urls in gateways.values()), gateways  # one gateway per node ...
    assert len(set.union(*gateways.values())) == 3  # ... and a different one on each
    for node in placement.values():  # every run's own log is in its node's folder beside the evidence
        assert list((on_cluster / "logs" / "nodes").glob(f"*-{node[:8]}/*.log"))
    check_each_rollout_once(on_cluster, rows)
    for run_id in sorted(rows):
        for name in TABLES:
            tables = [pl.read_parquet(d / run_id / f"{name}.parquet") for d in (on_cluster, on_one)]
            keep = [c for c in tables[0].columns if c not in TIMING_COLUMNS | TRANSPORT_COLUMNS]
            assert tables[0].select(keep).equals(tables[1].select(keep)), (run_id, name)
        manifests = [manifest(d, run_id) for d in (on_cluster, on_one)]
        for key in ("totals", "heldout", "best_candidate_id", "stop_reason", "identity", "status"):
            assert manifests[0][key] == manifests[1][key], (run_id, key)
        same = {k: v for k, v in rows[run_id].items() if k not in WHERE_AND_WHEN}
        assert same == {k: v for k, v in single[run_id].items() if k not in WHERE_AND_WHEN}, run_id


def test_a_node_lost_mid_sweep_moves_its_runs_and_every_run_finishes_once(tmp_path, data_dir):
    """The sweep runs 6 runs on three nodes; once a run on one worker node has done
    rollouts, that node is removed (its raylet and every process on it killed). Its
    runs move to the surviving nodes and finish there; every run is done once."""
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "smoke"
    with simulated_cluster() as cluster:
        victim = sorted(cluster.worker_nodes, key=lambda n: n.node_id)[0]
        log = open(tmp_path / "sweep.log", "w")
        proc = subprocess.Popen(sweep_cmd(evidence, "sweep.seeds=[0,1,2]", f"ray.address={cluster.address}",
                                          "ray.max_runs_in_flight=6", "budget.max_rollouts=60"),
                                cwd=REPO, env=sweep_env(data_dir), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            progressing = wait_for_progress_on(sweep_dir, victim.node_id, proc)
            cluster.remove_node(victim, allow_graceful=False)
            assert proc.wait(timeout=500) == 0, (tmp_path / "sweep.log").read_text()[-4000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            log.close()
    output = (tmp_path / "sweep.log").read_text()
    rows = index(sweep_dir)
    assert len(rows) == 6 and {r["status"] for r in rows.values()} == {"done"}, output[-4000:]
    moved = {run_id for run_id, row in rows.items() if row["moved_from"]}
    print("\n" + "\n".join(f"{run_id[:8]} seed {row['seed']} {row['container']:<14} -> {row['node_host']}-"
                           f"{row['node_id'][:8]} (moved from {row['moved_from']}), {row['attempts']} attempts"
                           for run_id, row in sorted(rows.items()) if row["moved_from"]))
    assert progressing and progressing <= moved, (progressing, moved)  # the runs caught mid-way moved ...
    for run_id in moved:
        row = rows[run_id]
        assert row["moved_from"].endswith(victim.node_id[:8]) and row["node_id"] != victim.node_id
        assert row["attempts"] == 2  # the lost attempt and the one that finished: no crash retry spent
        assert manifest(sweep_dir, run_id)["node"]["node_id"] == row["node_id"]  # ... and finished elsewhere
        assert "(moved from" in output.split(run_id[:8], 1)[1].splitlines()[0]  # the table says so
    check_each_rollout_once(sweep_dir, rows)
    staging = sweep_dir / ".staging"
    assert not (list(staging.iterdir()) if staging.exists() else []), "a lost attempt left evidence behind"


def wait_for_progress_on(sweep_dir: Path, node_id: str, proc: subprocess.Popen, timeout: float = 300) -> set[str]:
    """The runs on `node_id` that have logged rollouts (the index shows them running there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the sweep ended before a run on the victim node made progress"
        try:
            running = {run_id for run_id, row in index(sweep_dir).items()
                       if row["status"] == "running" and row["node_id"] == node_id}
        except (OSError, ValueError):  # not written yet
            running = set()
        progressing = {run_id for run_id in running
                       for p in (sweep_dir / "logs" / "nodes").glob(f"*-{node_id[:8]}/{run_id}.log")
                       if " rollouts, best " in p.read_text()}
        if progressing:
            return progressing
        time.sleep(0.2)
    raise AssertionError(f"no run on node {node_id[:8]} made progress within {timeout:.0f}s")
