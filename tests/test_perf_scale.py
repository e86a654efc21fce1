"""Smoke test of the scale benchmark (benchmarks/perf/scale.py): its quick mode (sweeps of 1
and 4 runs on a fresh local Ray, scripted models) writes one row per sweep size, every run
done, with a throughput and the driver's peak memory."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.perf import scale

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
        # the runs ran in RunWorker actors beside the driver: both spent CPU while they ran
        assert row["cpu_s_run_actors"] > 0 and row["cpu_s_driver"] >= 0 and row["cpu_s_model"] >= 0
        assert row["harness_cpu_s"] <= row["cpu_s_all"] and row["rollouts_per_harness_cpu_s"] > 0
        assert 0 < row["startup_s"] < row["wall_s"] and row["runs_span_s"] < row["wall_s"]
        assert row["host"] and row["cpus"]  # the machine columns
    assert rows[0]["rollouts_per_s_vs_1_run"] == pytest.approx(1.0)
