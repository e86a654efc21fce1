"""Scale benchmark (not a test): sweeps of 1, 4, 16 and 64 runs on Ray against the same fake
endpoints; total rollouts per second as the runs grow, and the sweep driver's memory.

Each point is a fresh `python -m harness +sweep=scale_<N> models=scripted` subprocess (a
generated sweep of N seeds of GEPA on banking77 with small pools and a fixed rollout budget
per run, scripted policy and proposer, a fresh local Ray) writing into a fresh temp evidence
root. Measured per point:

- `wall_s`: the whole command, end to end (Hydra expansion, Ray and service startup, the
  runs, the closing report); `startup_s`, `runs_span_s` and `teardown_s` split it using the
  runs' own `started_at`/`finished_at` (their manifests): launch -> first run start, first
  start -> last finish, last finish -> exit; `expand_s`, part of the startup, is launch ->
  sweep.json written (imports and Hydra composing every grid point, before Ray starts);
- `rollouts_per_s`: every rollout row of every run (`rollouts.parquet`, heldout included)
  over `runs_span_s`; `rollouts_per_s_end_to_end` divides by `wall_s` instead;
  `rollouts_per_s_vs_1_run`: the ratio to the N=1 point of the same invocation;
- `driver_peak_rss_mib`: VmHWM of the driver process itself (not Ray's), polled every 0.2 s;
  `driver_peak_rss_runs_mib`: its VmHWM when the last run finished (before the closing report);
  `ray_workers_peak_rss_mib`: the largest sum of RSS of its `ray::` worker processes seen
  (polled every 0.4 s; shared pages counted once per process);
- where the CPU goes over the runs span, by process below the driver (every 0.4 s from
  /proc): `cpu_s_driver`, `cpu_s_run_actors` (RunWorker), `cpu_s_harness_actors` (the sweep's
  board, limiter and node services actors), `cpu_s_container`, `cpu_s_gateway`, `cpu_s_model`
  (the scripted model server), `cpu_s_ray` (raylet, GCS, dashboard, idle workers);
  `harness_cpu_s` is the first three, the harness's own cost, and `rollouts_per_harness_cpu_s`
  divides the rollout rows by it: unlike `rollouts_per_s` it does not depend on how many
  cores the machine has or who else uses them. `harness_cpu_s_command` is the harness's CPU
  over the whole command (startup and the closing report included).

A failed run, or a sweep that exits non-zero, fails the benchmark. Results are printed and
written to benchmarks/perf/results/scale.parquet.

    python -m benchmarks.perf.scale [--runs 1,4,16,64] [--budget 40] [--quick] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.perf.common import SERVICE_ROLES, process_cpu_s, process_tree, write_results  # noqa: E402

NAME = "scale"
POOLS = ["pools.train.count=12", "pools.pareto.count=4", "pools.heldout.count=4"]
MIB = 1024  # /proc reports KiB


def _kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


# Where a sweep's CPU goes, by process: the first pattern found in a process's command line
# names its part; the harness's own cost is the driver's and its actors'.
PARTS = (("run_actors", b"ray::RunWorker"), ("harness_actors", b"ray::SweepBoard"),
         ("harness_actors", b"ray::EndpointLimiter"), ("harness_actors", b"ray::NodeServices"), *SERVICE_ROLES)
HARNESS_PARTS = ("driver", "run_actors", "harness_actors")


def _part(pid: int, root: int, cmdline: bytes) -> str:
    if pid == root:
        return "driver"
    return next((name for name, pattern in PARTS if pattern in cmdline), "ray")


class MemorySampler(threading.Thread):
    """Peak RSS of the driver (VmHWM, every 0.2 s) and of its Ray workers, and the CPU seconds
    of every process below the driver by part (every 0.4 s). A process's CPU counts up to its
    last sample, so one that exits loses at most a sampling interval."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.driver_kib, self.workers_kib = pid, 0, 0
        self.history: list[tuple[float, int]] = []  # (wall clock, VmHWM so far)
        self.cpu_history: list[tuple[float, dict[int, float]]] = []  # (wall clock, CPU s so far by pid)
        self.parts: dict[int, str] = {}  # pid -> its part, by its latest command line
        self._cpu: dict[int, float] = {}  # pid -> CPU s at its last sample
        self._stop_event = threading.Event()

    def _walk(self) -> None:
        workers = 0
        for pid in process_tree(self.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::"):
                workers += _kib(pid, "VmRSS") or 0
            cpu = process_cpu_s(pid)
            if cpu is None:
                continue
            self._cpu[pid] = cpu
            # A Ray worker takes its actor's name after it starts, so a named part wins over
            # "ray"; an exited, unreaped process reads an empty command line and keeps its part.
            part = _part(pid, self.pid, cmdline) if cmdline else "ray"
            if part != "ray" or pid not in self.parts:
                self.parts[pid] = part
        self.workers_kib = max(self.workers_kib, workers)
        self.cpu_history.append((time.time(), dict(self._cpu)))

    def run(self) -> None:
        tick = 0
        while not self._stop_event.is_set():
            hwm = _kib(self.pid, "VmHWM")  # gone once the process exits: the last reading stands
            if hwm is not None:
                self.driver_kib = max(self.driver_kib, hwm)
                self.history.append((time.time(), hwm))
            if tick % 2 == 0:
                self._walk()
            tick += 1
            self._stop_event.wait(0.2)

    def cpu_between(self, start: float, end: float = float("inf")) -> dict[str, float]:
        """CPU seconds by part spent from wall clock `start` to `end` (the samples just before
        each), each process under the part it ended as."""
        def at(when: float) -> dict[int, float]:
            return next((by_pid for t, by_pid in reversed(self.cpu_history) if t <= when), {})
        before, after = at(start), at(end)
        by_part: dict[str, float] = {}
        for pid, cpu in after.items():
            by_part[self.parts[pid]] = by_part.get(self.parts[pid], 0.0) + cpu - before.get(pid, 0.0)
        return by_part

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def write_configs(root: Path, sweep: str, runs: int, budget: int) -> Path:
    (root / "sweep").mkdir(parents=True, exist_ok=True)
    seeds = ", ".join(str(s) for s in range(runs))
    (root / "sweep" / f"{sweep}.yaml").write_text(
        f"# @package _global_\nsweep:\n  name: {sweep}\n  description: scale benchmark, {runs} runs\n"
        f"  containers: [banking77]\n  seeds: [{seeds}]\n"
        f"budget:\n  max_rollouts: {budget}\n  max_wall_s: null\n")
    return root


def _harness_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep-wide limits: per-run concurrency at its default (configs/config.yaml), the
    shared container and model limits raised from their local-model defaults (8 and 4),
    which would otherwise cap the whole sweep rather than measure it."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(REPO / "configs" / "config.yaml")
    return {"run_concurrency": config.concurrency, "ray_container_concurrency": args.container_concurrency,
            "ray_model_concurrency": args.model_concurrency}


def _fail(message: str, log: Path) -> None:
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise SystemExit(f"scale: {message}\n--- sweep output (tail) ---\n{tail}")


def measure(runs: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One sweep of `runs` runs as a subprocess; its row."""
    sweep, in_flight = f"{NAME}_{runs}", min(runs, args.max_in_flight)
    configs = write_configs(work / "configs", sweep, runs, args.budget)
    evidence, log = work / "evidence", work / "sweep.log"
    command = [sys.executable, "-m", "harness", f"+sweep={sweep}", "models=scripted", "algorithm=gepa",
               f"hydra.searchpath=[file://{configs}]", f"evidence_root={evidence}", *POOLS,
               f"ray.max_runs_in_flight={in_flight}", f"ray.cpus_per_run={args.cpus_per_run}",
               f"ray.container_concurrency={args.container_concurrency}", f"ray.model_concurrency={args.model_concurrency}"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # always a fresh local Ray
    env.update(HARNESS_DATA_DIR=str(args.data_dir), COLUMNS="200", PYTHONUNBUFFERED="1")
    load_before = os.getloadavg()[0]
    launched, t0 = time.time(), time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    sampler = MemorySampler(proc.pid)
    sampler.start()
    try:
        code = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the driver's Ctrl-C path stops Ray and the services
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        code = None
    finally:
        wall = time.monotonic() - t0
        sampler.stop()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of this sweep's own process group is left
        except (ProcessLookupError, PermissionError):
            pass
    if code is None:
        _fail(f"{runs} runs: the sweep did not finish within {args.timeout:.0f}s", log)
    index_path = evidence / sweep / "index.parquet"
    if not index_path.exists():
        _fail(f"{runs} runs: the sweep exited {code} without an index", log)
    index = pq.read_table(index_path).to_pylist()
    failed = {r["run_id"]: r["error"] for r in index if r["status"] != "done"}
    if code != 0 or failed or len(index) != runs:
        _fail(f"{runs} runs: exit code {code}, {len(index)} runs in the index, not done: {failed}", log)

    rows, per_run_rates, starts, ends = 0, [], [], []
    for r in index:
        run_dir = Path(r["evidence_dir"])
        n = pq.read_metadata(run_dir / "rollouts.parquet").num_rows
        timings = json.loads((run_dir / "manifest.json").read_text())["timings"]
        rows += n
        per_run_rates.append(n / timings["wall_s"])
        starts.append(datetime.fromisoformat(timings["started_at"]).timestamp())
        ends.append(datetime.fromisoformat(timings["finished_at"]).timestamp())
    span = max(ends) - min(starts)
    limits = _harness_limits(args)
    # the driver's high-water mark when the last run finished: before the closing report
    during = max((hwm for at, hwm in sampler.history if at <= max(ends)), default=0)
    cpu = sampler.cpu_between(min(starts), max(ends))
    harness_cpu = sum(cpu.get(part, 0.0) for part in HARNESS_PARTS)
    whole = sampler.cpu_between(float("-inf"))
    return {
        "runs": runs, "max_runs_in_flight": in_flight, "cpus_per_run": args.cpus_per_run,
        "budget_per_run": args.budget, "rollout_rows": rows,
        "optimization_rollouts": sum(r["rollouts"] or 0 for r in index),
        "wall_s": wall, "startup_s": min(starts) - launched,
        "expand_s": (evidence / sweep / "sweep.json").stat().st_mtime - launched, "runs_span_s": span,
        "teardown_s": launched + wall - max(ends),
        "rollouts_per_s": rows / span, "rollouts_per_s_end_to_end": rows / wall,
        "run_wall_s_median": statistics.median(r["wall_s"] for r in index),
        "per_run_rollouts_per_s_median": statistics.median(per_run_rates),
        "driver_peak_rss_mib": sampler.driver_kib / MIB, "driver_peak_rss_runs_mib": during / MIB,
        "ray_workers_peak_rss_mib": sampler.workers_kib / MIB,
        "runs_done": sum(r["status"] == "done" for r in index), "runs_failed": len(failed),
        "load_1m_before": load_before, **limits,
        **{f"cpu_s_{part}": cpu.get(part, 0.0) for part in (*HARNESS_PARTS, "container", "gateway", "model", "ray")},
        "harness_cpu_s": harness_cpu, "cpu_s_all": sum(cpu.values()),
        "rollouts_per_harness_cpu_s": rows / harness_cpu if harness_cpu else None,
        "rollouts_per_cpu_s": rows / sum(cpu.values()) if sum(cpu.values()) else None,
        "harness_cpu_s_command": sum(whole.get(part, 0.0) for part in HARNESS_PARTS),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1,4,16,64", help="comma-separated sweep sizes")
    parser.add_argument("--budget", type=int, default=40, help="budget.max_rollouts per run")
    parser.add_argument("--max-in-flight", type=int, default=8, help="ray.max_runs_in_flight is min(N, this)")
    parser.add_argument("--cpus-per-run", type=float, default=0.25, help="ray.cpus_per_run")
    parser.add_argument("--container-concurrency", type=int, default=64, help="ray.container_concurrency")
    parser.add_argument("--model-concurrency", type=int, default=64, help="ray.model_concurrency")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per sweep")
    parser.add_argument("--quick", action="store_true", help="runs 1,4 at a budget of 20 (smoke test)")
    parser.add_argument("--results-dir", type=Path, default=None, help="default: benchmarks/perf/results")
    parser.add_argument("--data-dir", type=Path,
                        default=Path(os.environ.get("HARNESS_DATA_DIR", REPO.parent / "shared" / "datasets")))
    parser.add_argument("--keep", action="store_true", help="keep each sweep's temp evidence and log")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.budget = "1,4", 20
    sizes = [int(n) for n in args.runs.split(",") if n.strip()]
    args.data_dir = args.data_dir.resolve()
    if not (args.data_dir / "banking77").is_dir():
        raise SystemExit(f"scale: no banking77 data under {args.data_dir} (set HARNESS_DATA_DIR or --data-dir)")

    results: list[dict[str, Any]] = []
    for runs in sizes:
        work = Path(tempfile.mkdtemp(prefix=f"scale-{runs}-"))
        try:
            row = measure(runs, args, work)
        finally:
            if args.keep:
                print(f"  kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
        results.append(row)
        print(f"{runs:>3} runs: {row['rollout_rows']} rollout rows, {row['rollouts_per_s']:.1f}/s over the runs "
              f"({row['runs_span_s']:.1f}s), command {row['wall_s']:.1f}s (startup {row['startup_s']:.1f}s, of which expand "
              f"{row['expand_s']:.1f}s), "
              f"driver peak RSS {row['driver_peak_rss_mib']:.0f} MiB", flush=True)
    one = next((r for r in results if r["runs"] == 1), None)
    for row in results:
        row["rollouts_per_s_vs_1_run"] = row["rollouts_per_s"] / one["rollouts_per_s"] if one else None
    where = write_results(NAME, results, args.results_dir)

    print(f"\nscale: GEPA on banking77, scripted models, {args.budget} rollouts per run, {os.cpu_count()} CPUs")
    print(f"{'runs':>5} {'in flight':>9} {'rows':>6} {'runs s':>7} {'rows/s':>7} {'vs 1':>5} "
          f"{'cmd s':>6} {'e2e/s':>6} {'startup':>7} {'driver MiB':>10} {'(in runs)':>9} {'workers MiB':>11}")
    for r in results:
        ratio = "" if r["rollouts_per_s_vs_1_run"] is None else f"{r['rollouts_per_s_vs_1_run']:.2f}"
        print(f"{r['runs']:>5} {r['max_runs_in_flight']:>9} {r['rollout_rows']:>6} {r['runs_span_s']:>7.1f} "
              f"{r['rollouts_per_s']:>7.1f} {ratio:>5} {r['wall_s']:>6.1f} {r['rollouts_per_s_end_to_end']:>6.1f} "
              f"{r['startup_s']:>7.1f} {r['driver_peak_rss_mib']:>10.0f} {r['driver_peak_rss_runs_mib']:>9.0f} "
              f"{r['ray_workers_peak_rss_mib']:>11.0f}")
    print("\nCPU seconds over the runs span by part (harness = driver + run actors + other harness actors; "
          "the machine may be shared: other processes are not counted)")
    print(f"{'runs':>5} {'driver':>7} {'runs':>6} {'actors':>6} {'contnr':>6} {'gatewy':>6} {'model':>6} {'ray':>6} "
          f"{'harness':>7} {'rows/harness CPU s':>18} {'rows/CPU s':>10}")
    for r in results:
        per_harness = r["rollouts_per_harness_cpu_s"]
        per_cpu = r["rollouts_per_cpu_s"]
        print(f"{r['runs']:>5} {r['cpu_s_driver']:>7.1f} {r['cpu_s_run_actors']:>6.1f} {r['cpu_s_harness_actors']:>6.1f} "
              f"{r['cpu_s_container']:>6.1f} {r['cpu_s_gateway']:>6.1f} {r['cpu_s_model']:>6.1f} {r['cpu_s_ray']:>6.1f} "
              f"{r['harness_cpu_s']:>7.1f} {'' if per_harness is None else f'{per_harness:.1f}':>18} "
              f"{'' if per_cpu is None else f'{per_cpu:.1f}':>10}")
    print(f"written to {where}")
    return where


if __name__ == "__main__":
    main()
