"""Scale benchmark for the sweep report (not a test): synthetic evidence of 10 million rollout
rows (100 runs x 100k rows by default, written with pyarrow in chunks through the harness's
schema), then the report computed from it, timed and with peak RSS measured: the compute alone, the
report's files without charts (``write_tables``), and the whole ``write_report``, its charts
drawn in two processes (``write_report``) and in one (``write_report_one_process``).

Each measurement runs in a fresh subprocess so that ``ru_maxrss`` (the process's peak resident
set) covers the report alone, not the data generation. The phases run in rounds (``--repeats``,
each round all four phases in turn) and each ratio to the compute is taken within its round:
on a shared 2-core machine one round's ratio moves by a third from run to run, so the figure is
the median over rounds with its range beside it. Figures are printed and written to
``benchmarks/perf/results/report_scale.parquet``.

    python -m benchmarks.perf.report_scale [--runs 100] [--rows-per-run 100000] [--repeats 3] [--dir DIR] [--keep] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.perf.common import write_results  # noqa: E402
from harness.evidence.schema import CANDIDATES, ROLLOUTS, with_version  # noqa: E402
from harness.evidence.writer import EvidenceLocation  # noqa: E402
from harness.sweep.store import SweepStore  # noqa: E402

SWEEP = "scale"
TASKS = ("task_a", "task_b")
STACKS = ("gepa", "gepa_ai")
PROPOSERS = ("p_small", "p_mid", "p_large", "p_xl", "p_xxl")
CANDIDATES_PER_RUN = 50
HELDOUT_ROWS = 400
TRAIN_ROWS = 2000
CHUNK = 25_000


def grid(n_runs: int) -> list[dict[str, str]]:
    """task x stack x proposer x seed, in that order, cut to n_runs (plus one never-run point)."""
    points = [{"container": t, "algorithm": a, "proposer": p, "seed": str(s)}
              for s in range(-(-(n_runs + 1) // (len(TASKS) * len(STACKS) * len(PROPOSERS))))
              for t in TASKS for a in STACKS for p in PROPOSERS]
    return [{"run_id": f"run{i:04d}", **point} for i, point in enumerate(points[:n_runs + 1])]


def _rollout_chunk(run_id: str, rng: np.random.Generator, start: int, size: int, n_rows: int,
                   skill: float) -> pa.Table:
    """Heldout rows first (scored candidates: every other index), then optimization rows."""
    seq = np.arange(start, start + size)
    n_heldout = (CANDIDATES_PER_RUN // 2) * HELDOUT_ROWS
    is_heldout = seq < n_heldout
    cand = np.where(is_heldout, 2 * (seq // HELDOUT_ROWS), rng.integers(0, CANDIDATES_PER_RUN, size))
    task_index = np.where(is_heldout, seq % HELDOUT_ROWS, rng.integers(0, TRAIN_ROWS, size))
    stage = np.where(is_heldout, "heldout", rng.choice(["seed", "pareto", "minibatch"], size, p=[0.05, 0.35, 0.6]))
    reward = (rng.random(size) < skill + 0.004 * cand).astype(np.float64)
    split = np.where(is_heldout, "test", "train")
    cand_ids = np.char.add("c", np.char.zfill(cand.astype(str), 4))
    task_ids = np.char.add(np.char.add(split, ":"), task_index.astype(str))
    columns = {
        "run_id": pa.array(np.full(size, run_id)), "seq": pa.array(seq),
        "rollout_id": pa.array(np.char.add(f"{run_id}-", seq.astype(str))), "candidate_id": pa.array(cand_ids),
        "task_id": pa.array(task_ids), "split": pa.array(split), "stage": pa.array(stage), "reward": pa.array(reward),
        "status": pa.array(np.full(size, "ok")), "error": pa.nulls(size, pa.string()),
        "error_kind": pa.nulls(size, pa.string()), "prompt_tokens": pa.array(rng.integers(80, 400, size)),
        "completion_tokens": pa.array(rng.integers(1, 30, size)), "cost_usd": pa.array(rng.random(size) * 1e-4),
        "latency_s": pa.array(rng.random(size)), "elapsed_s": pa.array(seq / n_rows * 600.0),
        "output": pa.array(np.full(size, "label")), "feedback": pa.array(np.full(size, "")),
    }
    for name in ROLLOUTS.names:  # columns this benchmark does not vary (inputs, feedback source, ...)
        columns.setdefault(name, pa.nulls(size, ROLLOUTS.field(name).type))
    return pa.Table.from_pydict(columns, schema=with_version(ROLLOUTS))


def generate(root: Path, n_runs: int, rows_per_run: int) -> None:
    points = grid(n_runs)
    for i, point in enumerate(points[:n_runs]):
        run_id, rng = point["run_id"], np.random.default_rng(i)
        location = EvidenceLocation(str(root), SWEEP, run_id)
        Path(location.run_dir).mkdir(parents=True, exist_ok=True)
        skill = 0.3 + 0.05 * PROPOSERS.index(point["proposer"])
        with pq.ParquetWriter(f"{location.run_dir}/rollouts.parquet", with_version(ROLLOUTS)) as writer:
            for start in range(0, rows_per_run, CHUNK):
                writer.write_table(_rollout_chunk(run_id, rng, start, min(CHUNK, rows_per_run - start),
                                                  rows_per_run, skill))
        index = np.arange(CANDIDATES_PER_RUN)
        candidates = pa.Table.from_pydict({
            "run_id": [run_id] * CANDIDATES_PER_RUN, "candidate_id": [f"c{j:04d}" for j in index],
            "index": index, "parent_ids": [[] for _ in index], "generation": index, "origin": ["proposal"] * len(index),
            "digest": [f"d{j}" for j in index], "modules_json": ["{}"] * len(index),
            "rollouts_at_creation": index * (rows_per_run // CANDIDATES_PER_RUN),
            "cost_usd_at_creation": index * 0.01 * (1 + rng.random(len(index))),
            "elapsed_s_at_creation": index * 10.0 * (1 + rng.random(len(index))),
        }, schema=with_version(CANDIDATES))
        pq.write_table(candidates, f"{location.run_dir}/candidates.parquet")
        for table in ("proposals", "events"):
            location.write_table(table, [])
        location.write_manifest({
            "run_id": run_id, "sweep": SWEEP, "status": "done", "axes": {k: v for k, v in point.items() if k != "run_id"},
            "spec": {"container": {"name": point["container"]}, "algorithm": {"name": point["algorithm"]},
                     "seed": int(point["seed"]), "policy": {"model": "policy"}, "proposer": {"model": point["proposer"]}},
            "seed_candidate_id": "c0000"})
    SweepStore(str(root), SWEEP).write_sweep({"grid": points})


# write_tables: write_report without charts; write_report draws half the charts in a second
# process (the default when a core is to spare), write_report_one_process all in its own
PHASES = ("compute", "write_tables", "write_report", "write_report_one_process")


def _cpu_seconds() -> float:
    """This process's CPU and its ended children's (the chart worker's)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))


def measure(sweep_dir: str, phase: str) -> dict[str, float]:
    """Runs in a fresh process: time one phase (wall and CPU: the machine may be shared), report
    its peak RSS."""
    import polars as pl

    from benchmarks.report import compute_report, write_report

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    if phase == "compute":
        frames = compute_report(sweep_dir)
        cells = frames.summary.height
    else:
        out = Path(sweep_dir) / f"report_{phase}"
        write_report(sweep_dir, out=str(out), charts=phase != "write_tables",
                     chart_worker=phase == "write_report")
        cells = pl.read_parquet(out / "summary.parquet").height
    seconds, cpu_seconds = time.perf_counter() - started, _cpu_seconds() - cpu_started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the chart worker's, if any
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_mib": peak, "baseline_rss_mib": baseline,
            "worker_peak_rss_mib": worker_peak, "cells": float(cells)}


def summarize_rounds(rounds: list[dict[str, dict[str, float]]], phase: str) -> dict[str, float]:
    """One phase over the rounds: medians of its figures, and its ratio to the compute taken
    within each round (each phase includes the compute: the ratio is what writing adds to it)."""
    ratios = [r[phase]["seconds"] / r["compute"]["seconds"] for r in rounds]
    cpu_ratios = [r[phase]["cpu_seconds"] / r["compute"]["cpu_seconds"] for r in rounds]
    medians = {key: statistics.median(r[phase][key] for r in rounds) for key in rounds[0][phase]}
    return {**medians, "repeats": len(rounds), "ratio_vs_compute": statistics.median(ratios),
            "ratio_vs_compute_min": min(ratios), "ratio_vs_compute_max": max(ratios),
            "cpu_ratio_vs_compute": statistics.median(cpu_ratios)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rows-per-run", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="evidence root to (re)use; default: a temp dir, deleted after")
    parser.add_argument("--keep", action="store_true", help="keep the generated evidence")
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the four phases; figures are medians")
    parser.add_argument("--quick", action="store_true", help="10 runs x 10,000 rows, 2 rounds: a smoke run")
    parser.add_argument("--measure", nargs=2, metavar=("SWEEP_DIR", "PHASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rows_per_run, args.repeats = 10, 10_000, 2
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="report_scale_"))
    sweep_dir = root / SWEEP
    try:
        if not (sweep_dir / "sweep.json").is_file():
            started = time.perf_counter()
            generate(root, args.runs, args.rows_per_run)
            print(f"generated {args.runs} runs x {args.rows_per_run:,} rollouts in {time.perf_counter() - started:.1f}s"
                  f" at {sweep_dir}")
        size = sum(f.stat().st_size for f in sweep_dir.rglob("rollouts.parquet"))
        rows = sum(pq.read_metadata(f).num_rows for f in sweep_dir.rglob("rollouts.parquet"))
        rounds: list[dict[str, dict[str, float]]] = []
        for round_index in range(args.repeats):
            figures_by_phase = {}
            for phase in PHASES:
                out = subprocess.run([sys.executable, __file__, "--measure", str(sweep_dir), phase], check=True,
                                     capture_output=True, text=True, cwd=REPO)
                figures = figures_by_phase[phase] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"round {round_index + 1}/{args.repeats} {phase:>24}: {figures['seconds']:.2f}s "
                      f"({figures['cpu_seconds']:.2f} CPU s), peak RSS {figures['peak_rss_mib']:.0f} MiB "
                      f"(after imports {figures['baseline_rss_mib']:.0f} MiB; chart worker "
                      f"{figures['worker_peak_rss_mib']:.0f} MiB), {int(figures['cells'])} cells", flush=True)
            rounds.append(figures_by_phase)
        print(f"{rows:,} rollout rows, {size / 2**20:.0f} MiB Parquet")
        results = [{"phase": phase, "rollout_rows": rows, "runs": args.runs, "parquet_mib": size / 2**20,
                    "polars": __import__("polars").__version__, **summarize_rounds(rounds, phase)}
                   for phase in PHASES]
        print("vs compute, median over rounds [range]: " + ", ".join(
            f"{r['phase']} {r['ratio_vs_compute']:.2f}x wall [{r['ratio_vs_compute_min']:.2f}, "
            f"{r['ratio_vs_compute_max']:.2f}], {r['cpu_ratio_vs_compute']:.2f}x CPU" for r in results[1:]))
        print(f"results: {write_results('report_scale', results, args.results_dir)}")
    finally:
        if not args.dir and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
