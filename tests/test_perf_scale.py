"""Smoke test of the scale benchmark (benchmarks/perf/scale.py): its quick mode (sweeps of 1
and 4 runs on a fresh local Ray, scripted models) writes one row per sweep size, every run
done, with a throughput and the driver's peak memory."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.perf import scale, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]


def test_scale_quick_writes_one_row_per_sweep_size(tmp_path: Path, data_dir: Path) -> None:
    where = scale.main(["--quick", "--results-dir", str(tmp_path), "--data-dir", str(data_dir), "--timeout", "240"])
    assert where == tmp_path / "scale.parquet"
    rows = pq.read_table(where).to_pylist()
    assert [r["runs"] for r in rows] == [1, 4]
    for row in rows:
        assert row["runs_done"] == row["runs"] and row["runs_failed"] == 0
        assert row["rollout_rows"] >= row["runs"] * row["budget_per_run"] * 0.5
        assert row["rollouts_per_s"] > 0 and row["rollouts_per_s_end_to_end"] > 0
        assert row["driver_peak_rss_mib"] > 0
        assert row["cpu_s_run_actors"] >= 0 and row["cpu_s_driver"] >= 0 and row["cpu_s_model"] >= 0
        assert row["harness_cpu_s"] <= row["cpu_s_all"] and row["rollouts_per_harness_cpu_s"] > 0
        assert 0 < row["startup_s"] < row["wall_s"] and row["runs_span_s"] < row["wall_s"]
        assert row["host"] and row["cpus"]  # the machine columns
    assert rows[0]["rollouts_per_s_vs_1_run"] == pytest.approx(1.0)
    # the runs ran in RunWorker actors beside the driver, sampled every 0.4 s over seconds of work
    assert sum(row["cpu_s_run_actors"] for row in rows) > 0
    # the summary line carries the figure that isolates the harness's own cost
    lines = [line for line in summary.summary_table(tmp_path).splitlines() if line.startswith("| scale:")]
    assert len(lines) == 2 and all("rollouts per harness CPU-second" in line for line in lines)



@pytest.mark.timeout(60)
def test_sampler_keeps_an_exited_actors_part() -> None:
    """An exited, unreaped worker reads an empty command line: its CPU stays with the actor it
    ran, not with "ray" (a 1-run sweep once showed all its run's CPU under "ray")."""
    worker = subprocess.Popen(["bash", "-c", 'exec -a "ray::RunWorker" cat'], stdin=subprocess.PIPE)
    sampler = scale.MemorySampler(os.getpid())
    deadline = time.monotonic() + 30
    while sampler.parts.get(worker.pid) != "run_actors" and time.monotonic() < deadline:
        sampler._walk()
    assert sampler.parts.get(worker.pid) == "run_actors"
    worker.stdin.close()  # cat exits; nobody reaps it until wait() below
    stat = Path(f"/proc/{worker.pid}/stat")
    while stat.read_text().split(") ")[1][0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"/proc/{worker.pid}/cmdline").read_bytes() == b""  # what a zombie shows
    sampler._walk()
    assert sampler.parts[worker.pid] == "run_actors"
    assert worker.wait() == 0
