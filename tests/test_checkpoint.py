"""A run killed (SIGKILL) while it re-scores candidates on heldout, started again with the
same command, resumes from its checkpoint: no optimization again, and no (candidate,
heldout row) pair the checkpoint held is rolled out again; the same run started while it
runs stops at once. Scripted models, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import read_evidence
from harness.evidence.writer import EvidenceLocation

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def harness_cmd(evidence: Path, data_dir: Path) -> list[str]:
    # 0.2 s per policy call: heldout re-scoring of every candidate takes long enough to interrupt
    return [sys.executable, "-m", "harness", "models=scripted", "policy.source='rules?latency_s=0.2'",
            "heldout_candidates=all", "budget.max_rollouts=40", "checkpoint_every_s=1", f"evidence_root={evidence}",
            f"data_dir={data_dir}"]


def checkpoint_rows(path: Path) -> list[dict]:
    try:
        state = json.loads(path.read_text())["state"]
    except (OSError, ValueError, KeyError):
        return []  # not written yet
    return [r for r in state.get("evidence", {}).get("rollouts", []) if r["stage"] == "heldout"]


def test_a_run_killed_during_heldout_resumes_from_its_checkpoint(tmp_path, data_dir) -> None:
    evidence = tmp_path / "evidence"
    env = {**os.environ, "COLUMNS": "200"}
    first = subprocess.Popen(harness_cmd(evidence, data_dir), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    checkpoints = evidence / "local" / ".checkpoints"
    deadline = time.monotonic() + 180
    try:
        while True:
            files = list(checkpoints.glob("*.json"))
            if files and len(checkpoint_rows(files[0])) >= 20:
                break
            assert first.poll() is None, "the run ended before it could be interrupted during heldout"
            assert time.monotonic() < deadline, "no heldout progress was checkpointed"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the run and every service it started
        first.wait(timeout=30)
    saved = json.loads(files[0].read_text())
    run_id = saved["run_id"]
    carried = {r["rollout_id"]: r for r in saved["state"]["evidence"]["rollouts"]}
    assert not (evidence / "local" / run_id / "manifest.json").exists()

    second = subprocess.run(harness_cmd(evidence, data_dir), cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=240)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    ev = read_evidence(evidence / "local" / run_id)
    assert ev["manifest"]["status"] == "done"
    events = ev["events"]
    assert "resumed" in events["kind"].to_list()
    rollouts = ev["rollouts"]
    assert rollouts["rollout_id"].n_unique() == rollouts.height  # every pair once
    # what the checkpoint held came over as it was (same timings), not rolled out again
    kept = rollouts.filter(pl.col("rollout_id").is_in(list(carried)))
    assert kept.height == len(carried)
    for row in kept.iter_rows(named=True):
        assert row["latency_s"] == carried[row["rollout_id"]]["latency_s"]
        assert row["answer_examples_json"] == carried[row["rollout_id"]]["answer_examples_json"]
    assert kept["answer_examples_json"].null_count() == 0  # Banking77 cites each row's message
    # optimization happened once: its rollouts are all from the checkpoint
    optimization = rollouts.filter(pl.col("stage") != "heldout")
    assert set(optimization["rollout_id"]) <= set(carried)
    # the policy was called once per rollout across both processes
    calls = pl.read_parquet(evidence / "local" / run_id / "model_calls.parquet").filter(pl.col("role") == "policy")
    assert sorted(calls["rollout_id"].to_list()) == sorted(rollouts["rollout_id"].to_list())
    # every candidate is re-scored on every heldout row, and the checkpoint is gone
    heldout = rollouts.filter(pl.col("stage") == "heldout")
    assert heldout.height == ev["candidates"].height * len(set(heldout["task_id"]))
    assert {h["candidate_id"] for h in ev["manifest"]["heldout"]} == set(ev["candidates"]["candidate_id"])
    assert not list(checkpoints.glob("*.json"))


def test_a_checkpoint_restores_what_it_saved(tmp_path) -> None:
    """Saved and loaded, the state is the same, a NaN reward and a value JSON has no type for
    (written as its text) included; the file is JSON a reader of the checkpoint can parse."""
    from harness.checkpoint import CheckpointStore, RunCheckpoint
    from harness.evidence.writer import EvidenceLocation

    store = CheckpointStore(EvidenceLocation(str(tmp_path), "local", "run1"), "run1")
    rows = [{"rollout_id": "r1", "reward": float("nan"), "latency_s": float("inf"), "tags": ["a"]},
            {"rollout_id": "r2", "reward": 1.0, "latency_s": 0.5, "tags": []}]
    saved = RunCheckpoint(run_id="run1", started_at="2026-12-03T10:00:00+00:00", stop_reason="max_rollouts",
                          best_candidate_id="c0001", timings={"preflight_s": 1.5, "optimize_s": 2.0},
                          state={"evidence": {"rollouts": rows}, "when": Path("/x/y")})
    store.save(saved)
    loaded = store.load()
    assert loaded is not None
    got = loaded.state["evidence"]["rollouts"]
    assert got[0]["reward"] != got[0]["reward"] and got[0]["latency_s"] == float("inf")  # NaN stays NaN
    assert got[1] == rows[1] and loaded.state["when"] == "/x/y"
    assert loaded.model_dump(exclude={"state"}) == saved.model_dump(exclude={"state"})
    assert json.loads(Path(store.path).read_text())["best_candidate_id"] == "c0001"



def test_the_same_run_started_while_it_runs_stops_with_one_line(tmp_path, data_dir) -> None:
    """While a run is held (as `python -m harness` holds the run it runs), the same run
    started again stops before it starts anything, with one line naming the run, and its
    evidence stays as it was (without the lock, both ran on one checkpoint, and each start
    deleted the other's staged attempt); once let go, the run can be redone."""
    evidence = tmp_path / "evidence"
    env = {**os.environ, "COLUMNS": "200"}
    command = [sys.executable, "-m", "harness", "models=scripted", "budget.max_rollouts=20",
               f"evidence_root={evidence}", f"data_dir={data_dir}"]
    first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    [run_dir] = [p for p in (evidence / "local").iterdir() if p.is_dir() and p.name != "logs"
                 and not p.name.startswith(".")]
    manifest = (run_dir / "manifest.json").read_bytes()
    with EvidenceLocation(str(evidence), "local", run_dir.name).held():
        second = subprocess.run([*command, "force=true"], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=240)
    assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
    errors = [line for line in second.stdout.splitlines() if line.startswith("error:")]
    assert errors == [f"error: run {run_dir.name} is running in another process (its evidence: {run_dir}); wait "
                      "for it to end, or change the run's settings or seed"], second.stdout[-3000:]
    assert "starting container" not in second.stdout
    assert (run_dir / "manifest.json").read_bytes() == manifest
    third = subprocess.run([*command, "force=true"], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert read_evidence(run_dir)["manifest"]["status"] == "done"
