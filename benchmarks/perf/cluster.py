"""Cluster benchmark (not a test): the same scripted sweep on 1, 2 and 3 simulated Ray
nodes on this machine, and from it a paper estimate of a hosted-model sweep on 8 nodes.

Each point is a fresh `ray.cluster_utils.Cluster` (a head plus N-1 workers, 2 logical
CPUs each) and a `python -m harness +sweep=smoke models=scripted ray.address=<head>`
subprocess: every node starts its own service set (containers, scripted model, gateway)
and runs go to the least loaded node. All nodes share this machine's cores, so more
nodes cannot mean more speed here: the figure is the harness's own cost per node.
Measured per point:

- `wall_s`, `startup_s` (launch -> first run start, from the manifests), `runs_span_s`
  (first start -> last finish) and `rollouts_per_s` (every rollout row over the span);
- `cpu_s`: CPU seconds of every process of the point (Ray's, the sweep's, the
  containers and models), sampled every 0.5 s from /proc, a lower bound (a process that
  exits between samples loses its last half second); `cpu_ms_per_rollout` divides it by
  the rollouts; `cpu_s_per_node` the part above the 1-node point, per added node.

The estimate (printed, and in the results as the `estimate` row) takes the measured CPU
cost per rollout and per node, and the stated assumptions below for the hosted model.

    python -m benchmarks.perf.cluster [--nodes 1,2,3] [--seeds 3] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.perf.common import default_data_dir, write_results  # noqa: E402

NAME = "cluster"
NODE_MEMORY = 80 * 1024 * 1024
TICKS = os.sysconf("SC_CLK_TCK")
# the hosted sweep of the estimate, and what it assumes of the hosted model
HOSTED = {"runs": 100, "nodes": 8, "rollouts_per_run": 400, "runs_in_flight_per_node": 4, "concurrency_per_run": 8,
          "model_latency_s": 2.0, "requests_per_min": 10_000, "node_cores": 8}


class CpuMeter:
    """Sums the CPU time of every process below this one, sampled from /proc."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        parents: dict[int, int] = {}
        cpu: dict[int, tuple[str, float]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (fields[19], (int(fields[11]) + int(fields[12])) / TICKS)
        mine, frontier = set(), [os.getpid()]
        while frontier:
            parent = frontier.pop()
            for pid, ppid in parents.items():
                if ppid == parent and pid not in mine:
                    mine.add(pid)
                    frontier.append(pid)
        for pid in mine:
            start, seconds = cpu[pid]
            self._seen[(pid, start)] = max(seconds, self._seen.get((pid, start), 0.0))

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __enter__(self) -> "CpuMeter":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self._seen.values())


def measure(nodes: int, seeds: int, data_dir: str, work: Path) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    evidence = work / f"nodes{nodes}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"HARNESS_DATA_DIR": data_dir}
    with CpuMeter() as meter:
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 2, "object_store_memory": NODE_MEMORY, "include_dashboard": False})
        try:
            for _ in range(nodes - 1):
                cluster.add_node(num_cpus=2, object_store_memory=NODE_MEMORY)
            cluster.wait_for_nodes()
            launched = time.time()
            out = subprocess.run(
                [sys.executable, "-m", "harness", "+sweep=smoke", "models=scripted", f"evidence_root={evidence}",
                 f"ray.address={cluster.address}", f"sweep.seeds={list(range(seeds))}", "ray.max_runs_in_flight=6"],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
            ended = time.time()
        finally:
            cluster.shutdown()
    if out.returncode != 0:
        raise SystemExit(f"the {nodes}-node sweep failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    sweep_dir = evidence / "smoke"
    rows = pq.read_table(sweep_dir / "index.parquet").to_pylist()
    manifests = [json.loads((sweep_dir / r["run_id"] / "manifest.json").read_text()) for r in rows]
    starts = [datetime.fromisoformat(m["timings"]["started_at"]).timestamp() for m in manifests]
    ends = [datetime.fromisoformat(m["timings"]["finished_at"]).timestamp() for m in manifests]
    rollouts = sum(pq.read_metadata(sweep_dir / r["run_id"] / "rollouts.parquet").num_rows for r in rows)
    span = max(ends) - min(starts)
    return {"point": f"{nodes} node(s)", "nodes": nodes, "runs": len(rows),
            "nodes_used": len({r["node_id"] for r in rows}), "rollouts": rollouts, "wall_s": ended - launched,
            "startup_s": min(starts) - launched, "runs_span_s": span, "rollouts_per_s": rollouts / span,
            "cpu_s": meter.seconds, "cpu_ms_per_rollout": 1000 * meter.seconds / rollouts}


def estimate(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A 100-run hosted sweep on 8 nodes: the slowest of the model's latency, its rate
    limit and the harness's own CPU, plus each node's fixed cost."""
    one = points[0]
    per_node_cpu = (max((p["cpu_s"] - one["cpu_s"]) / (p["nodes"] - 1) for p in points[1:]) if len(points) > 1
                    else 0.0)
    harness_cpu_per_rollout = one["cpu_s"] / one["rollouts"]  # scripted model and grading included: an upper bound
    h = HOSTED
    rollouts = h["runs"] * h["rollouts_per_run"]
    in_flight = h["nodes"] * h["runs_in_flight_per_node"] * h["concurrency_per_run"]
    latency_bound = in_flight / h["model_latency_s"]
    rate_bound = h["requests_per_min"] / 60
    cpu_bound = h["nodes"] * h["node_cores"] / harness_cpu_per_rollout
    throughput = min(latency_bound, rate_bound, cpu_bound)
    waves = -(-h["runs"] // (h["nodes"] * h["runs_in_flight_per_node"]))
    wall = rollouts / throughput + one["startup_s"]
    return {"point": "estimate: 100 hosted runs on 8 nodes", "nodes": h["nodes"], "runs": h["runs"],
            "rollouts": rollouts, "rollouts_per_s": throughput, "wall_s": wall,
            "cpu_ms_per_rollout": 1000 * harness_cpu_per_rollout, "cpu_s_per_node": per_node_cpu,
            "estimate_json": json.dumps({**h, "latency_bound_rollouts_per_s": latency_bound,
                                         "rate_bound_rollouts_per_s": rate_bound,
                                         "harness_cpu_bound_rollouts_per_s": cpu_bound, "waves_of_runs": waves,
                                         "harness_cpu_share_of_node": rollouts * harness_cpu_per_rollout
                                         / (wall * h["nodes"] * h["node_cores"])})}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,2,3", help="comma-separated node counts")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the smoke sweep (2 runs each)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    points = []
    with TemporaryDirectory(prefix="bench-cluster-") as work:
        for nodes in (int(n) for n in args.nodes.split(",")):
            point = measure(nodes, args.seeds, default_data_dir(args.data_dir), Path(work))
            print(json.dumps(point), flush=True)
            points.append(point)
    one = points[0]
    for point in points[1:]:
        point["cpu_s_per_node"] = (point["cpu_s"] - one["cpu_s"]) / (point["nodes"] - one["nodes"])
    result = estimate(points)
    print(json.dumps(result, indent=1), flush=True)
    rows = [*points, result]
    columns = dict.fromkeys(key for row in rows for key in row)  # Parquet takes its columns from the first row
    where = write_results(NAME, [{key: row.get(key) for key in columns} for row in rows], args.results_dir)
    print(f"results: {where}")
    return where


if __name__ == "__main__":
    main()
