"""What every performance benchmark shares: where results go and which machine made them.

Each benchmark writes one Parquet file, `benchmarks/perf/results/<name>.parquet`, one row
per measured point, every row carrying the machine columns below so an absolute figure is
never read without the machine it ran on."""

from __future__ import annotations

import os
import platform
import resource
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.context import OPTIMIZATION_STAGES

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """Columns that say where and when a figure was measured."""
    try:
        load_1m = os.getloadavg()[0]
    except OSError:
        load_1m = None
    return {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "load_1m_when_written": load_1m}


def write_results(name: str, rows: list[dict[str, Any]], results_dir: Path | None = None) -> Path:
    """Write a benchmark's rows (each with the machine columns) to `<results_dir>/<name>.parquet`."""
    if not rows:
        raise ValueError(f"benchmark {name} measured nothing")
    where = (results_dir or RESULTS_DIR) / f"{name}.parquet"
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_suffix(".parquet.tmp")
    context = machine()
    pq.write_table(pa.Table.from_pylist([{**context, **row} for row in rows]), tmp)
    tmp.replace(where)  # a reader never sees half a file
    return where


def peak_rss_mib() -> float:
    """This process's peak resident set so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of `pid` so far (its own threads, not its children); None
    once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    except (OSError, ValueError, IndexError):
        return None


def process_tree(root: int) -> set[int]:
    """`root` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
            except (OSError, ValueError):
                continue
    below, frontier = {root}, [root]
    while frontier:
        found = [pid for pid in children.get(frontier.pop(), ()) if pid not in below]
        below.update(found)
        frontier.extend(found)
    return below


# the processes a harness starts beside its own, by a marker of their command line
SERVICE_ROLES = (("container", b"benchmarks.containers"), ("gateway", b"harness.gateway"),
                 ("model", b"harness.scripted_server"))


def service_role(cmdline: bytes) -> str | None:
    """`container`, `gateway` or `model` for a service process's command line, else None."""
    return next((role for role, marker in SERVICE_ROLES if marker in cmdline), None)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def default_data_dir(given: str | None = None) -> str:
    """The datasets directory: `given`, else $HARNESS_DATA_DIR, else ../shared/datasets."""
    return given or os.environ.get("HARNESS_DATA_DIR") or str((REPO / ".." / "shared" / "datasets").resolve())


def optimization_window(rollouts: Any) -> tuple[int, float]:
    """(optimization rollouts, seconds from the run's start to the last one's end) of a
    polars rollouts table: the optimizer's wall time without preflight, heldout or writing."""
    import polars as pl

    optimizing = rollouts.filter(pl.col("stage").is_in(list(OPTIMIZATION_STAGES)))
    return optimizing.height, float(optimizing["elapsed_s"].max() or 0.0)
