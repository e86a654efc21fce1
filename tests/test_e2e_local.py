"""End to end on the real local model (llama.cpp, Qwen2.5-Coder 0.5B as policy and proposer):
`python -m harness` with a tiny budget, then the evidence is checked without the harness.
Checks that the run completes and its evidence is consistent, not that the score improved."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from conftest import run_cli
from harness.evidence.schema import SCHEMA_METADATA_KEY, SCHEMA_VERSION, TABLES

MODEL = "qwen2.5-coder-0.5b"
BUDGET = 12


@pytest.mark.slow
def test_tiny_run_on_the_local_model(local_model_ready, tmp_path: Path, data_dir: Path) -> None:
    evidence = tmp_path / "evidence"
    result = run_cli(
        f"evidence_root={evidence}", f"data_dir={data_dir}", "policy=local_0_5b", "proposer=local_0_5b",
        f"budget.max_rollouts={BUDGET}", "pools.train.count=8", "pools.pareto.count=4", "pools.heldout.count=4",
        "local_server.slots=1", timeout=1800,
    )
    assert result.returncode == 0, result.stdout
    (manifest_path,) = evidence.rglob("manifest.json")
    run_dir = manifest_path.parent
    manifest = json.loads(manifest_path.read_text())
    assert manifest["status"] == "done" and manifest["error"] is None
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["spec"]["policy"]["provider"] == "local" and manifest["spec"]["policy"]["model"] == MODEL

    tables = {}
    for name, schema in TABLES.items():
        path = run_dir / f"{name}.parquet"
        arrow = pq.read_table(path)  # readable by pyarrow ...
        assert arrow.schema.metadata[SCHEMA_METADATA_KEY] == SCHEMA_VERSION.encode()
        assert arrow.schema.names == schema.names
        tables[name] = pl.read_parquet(path)  # ... and by polars
        assert tables[name].height == arrow.num_rows

    totals, rollouts = manifest["totals"], tables["rollouts"]
    heldout = rollouts.filter(pl.col("stage") == "heldout")
    assert rollouts.height - heldout.height == totals["rollouts"] <= BUDGET
    assert heldout.height == totals["heldout_rollouts"] and heldout.height % 4 == 0 and heldout.height > 0
    assert tables["candidates"].height == totals["candidates"] >= 1
    assert tables["proposals"].height == totals["proposals"]
    assert rollouts["rollout_id"].is_unique().all()
    assert rollouts["reward"].is_between(0.0, 1.0).all()
    assert rollouts.filter(pl.col("status") == "ok").height > 0  # the model really answered
    assert totals["policy_prompt_tokens"] == rollouts["prompt_tokens"].sum() > 0
    assert manifest["best_candidate_id"] in tables["candidates"]["candidate_id"].to_list()
    assert {h["candidate_id"] for h in manifest["heldout"]} <= set(tables["candidates"]["candidate_id"])
    assert (tables["events"]["kind"] == "start").any() and (tables["events"]["kind"] == "stop").any()
