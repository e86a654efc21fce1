"""Smoke test of the local model benchmark (benchmarks/perf/local_model.py): `--quick` on the
real llama-server with the 0.5B built-in model (slow): one row per configuration, every one
answered, and the prefix cache spares prompt evaluation."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest


MODEL = "qwen2.5-coder-0.5b"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_local_model_benchmark(local_model_ready, data_dir: Path, tmp_path: Path) -> None:
    from benchmarks.perf import local_model

    assert local_model.QUICK["model"] == MODEL
    local_model.main(["--quick", "--data-dir", str(data_dir), "--results-dir", str(tmp_path)])

    rows = pq.read_table(tmp_path / "local_model.parquet").to_pylist()
    configs = [(r["benchmark_part"], r["slots"], r["cache_prompt"]) for r in rows]
    expected = [("slots", s, True) for s in local_model.QUICK["slots"]]
    expected += [("prefix_cache", 1, True), ("prefix_cache", 1, False)]
    assert sorted(configs) == sorted(expected)  # one row per configuration
    for r in rows:
        assert r["model"] == MODEL and r["rows"] == local_model.QUICK["rows"]
        assert r["rows_per_s"] > 0 and r["completion_tokens_per_s"] > 0
        assert r["host"] and r["cpus"]  # machine columns
    slot_one = next(r for r in rows if r["benchmark_part"] == "slots" and r["slots"] == 1)
    assert slot_one["ratio_vs_1_slot"] == pytest.approx(1.0)
    cache = {r["cache_prompt"]: r for r in rows if r["benchmark_part"] == "prefix_cache"}
    # with the cache only the suffix after the shared system prompt + label list is evaluated
    assert cache[True]["prompt_tokens_evaluated_per_row"] < cache[False]["prompt_tokens_evaluated_per_row"]
    assert cache[False]["prompt_tokens_evaluated_per_row"] == pytest.approx(cache[False]["prompt_tokens_per_row"])
    assert 0 < cache[True]["prompt_tokens_saved_fraction"] < 1
