"""The benchmark suite's runner on its smoke-sized variants: each benchmark writes its
Parquet (one row per measured point, machine columns included) and the summary table has
a line for each. Figures are not judged here: speed goals live in the benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_suite_writes_results_and_summary(tmp_path: Path, data_dir: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.perf", "--quick", "--results-dir", str(tmp_path),
                          "--only", "overhead,overlap,gateway_overhead,report_scale"],
                         cwd=REPO, capture_output=True, text=True, timeout=840,
                         env={**__import__("os").environ, "HARNESS_DATA_DIR": str(data_dir)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    overhead = pl.read_parquet(tmp_path / "overhead.parquet")
    assert sorted(overhead["arm"].to_list()) == ["harness_eval", "harness_gepa", "raw", "raw_aiohttp"]
    assert (overhead["rollouts_per_s"] > 0).all() and {"cpus", "measured_at", "host"} <= set(overhead.columns)
    # every arm's CPU is read by process; the run process always spends some
    assert (overhead["cpu_ms_per_rollout_this_process"] > 0).all()
    assert (overhead["ceiling_vs_raw_aiohttp"] > 0).all() and "cpu_ms_per_rollout_container" in overhead.columns

    overlap = pl.read_parquet(tmp_path / "overlap.parquet")
    assert set(overlap["concurrency"].to_list()) == {1, 16}
    assert set(overlap["arm"].to_list()) == {"gepa", "gepa_sequential", "gepa_ai"}
    assert (overlap["rollouts"] <= overlap["budget"]).all() and (overlap["rollouts"] > 0).all()
    # every model call waits 200 ms: no arm can beat the perfectly packed limit
    assert (overlap["ratio_to_limit"] >= 0.99).all()

    report_scale = pl.read_parquet(tmp_path / "report_scale.parquet")
    assert report_scale["rollout_rows"][0] == 100_000 and (report_scale["repeats"] == 2).all()
    # each ratio is a median of per-round ratios, so it lies within their range
    assert ((report_scale["ratio_vs_compute_min"] <= report_scale["ratio_vs_compute"])
            & (report_scale["ratio_vs_compute"] <= report_scale["ratio_vs_compute_max"])).all()
    gateway = pl.read_parquet(tmp_path / "gateway_overhead.parquet").row(0, named=True)
    assert gateway["gateway_per_s"] > 0
    # each process's CPU per call is read from /proc: the gateway's own cost, apart from the load's
    assert gateway["gateway_cpu_ms_per_call_gateway"] > 0 and gateway["direct_cpu_ms_per_call_upstream"] > 0
    assert "direct_cpu_ms_per_call_gateway" not in gateway  # the direct arm passes no gateway
    # the bare proxy's arm: the hop alone, its own process measured, no gateway in its path
    assert gateway["bare_proxy_per_s"] > 0 and gateway["bare_proxy_cpu_ms_per_call_proxy"] > 0
    assert "bare_proxy_cpu_ms_per_call_gateway" not in gateway
    # with an upstream as slow as a hosted model, every call still takes at least that long
    assert gateway["slow_gateway_per_s"] > 0 and gateway["slow_gateway_p50_ms"] >= 1000 * gateway["slow_latency_s"]

    summary = (tmp_path / "summary.md").read_text()
    for needle in ("overhead: harness vs bare loop", "overlap: our GEPA", "overlap: gepa library",
                   "report over 100,000 rollout rows", "over 2 rounds", "gateway vs direct", "gateway CPU", "a bare proxy on the same stack",
                   "upstream answering in 200 ms",
                   "CPU ms per rollout: run ", "Machines: "):
        assert needle in summary, needle
