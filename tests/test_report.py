"""The sweep report (benchmarks.report): a golden sweep generated through the evidence writer,
one test per metric on hand-computable frames, missing cells, schema-version refusal and
byte-identical regeneration. Offline and fast; no Ray, no model."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from benchmarks.report import ReportOptions, SchemaVersionError, compute_report, write_report
from benchmarks.report import metrics
from benchmarks.report.markdown import render_markdown
from harness.evidence.schema import ROLLOUTS, SCHEMA_METADATA_KEY, SCHEMA_VERSION
from harness.evidence.writer import EvidenceLocation
from harness.sweep.store import SweepStore

SWEEP = "golden"

# candidate_id -> (index, rollouts_at_creation, cost_usd_at_creation, elapsed_s_at_creation)
Candidates = dict[str, tuple[int, int, float, float]]
# (candidate_id, task_id, stage, reward); reward None: an error row (status error)
Rollouts = list[tuple[str, str, str, float | None]]


def heldout(candidate: str, rewards: list[float | None]) -> Rollouts:
    return [(candidate, f"test:{i}", "heldout", r) for i, r in enumerate(rewards)]


def write_run(root: Path, run_id: str, *, task: str, stack: str, seed: int, candidates: Candidates,
              rollouts: Rollouts, status: str = "done", totals: dict[str, float] | None = None,
              timings: dict[str, float] | None = None) -> EvidenceLocation:
    """One run's evidence through the harness's own writer (schema and version metadata)."""
    location = EvidenceLocation(str(root), SWEEP, run_id)
    location.write_table("rollouts", [{
        "run_id": run_id, "seq": seq, "rollout_id": f"{run_id}-{cid}-{tid}", "candidate_id": cid, "task_id": tid,
        "split": tid.split(":")[0], "stage": stage, "reward": reward,
        "status": "ok" if reward is not None else "error", "error": None if reward is not None else "status failed",
        "error_kind": None, "prompt_tokens": 10, "completion_tokens": 1, "cost_usd": 0.001, "latency_s": 0.1,
        "elapsed_s": float(seq), "output": "", "feedback": ""} for seq, (cid, tid, stage, reward) in enumerate(rollouts)])
    location.write_table("candidates", [{
        "run_id": run_id, "candidate_id": cid, "index": index, "parent_ids": [], "generation": min(index, 1),
        "origin": "seed" if index == 0 else "proposal", "digest": cid, "modules_json": "{}",
        "rollouts_at_creation": n, "cost_usd_at_creation": cost, "elapsed_s_at_creation": elapsed}
        for cid, (index, n, cost, elapsed) in candidates.items()])
    for table in ("proposals", "events"):
        location.write_table(table, [])
    location.write_manifest({
        "run_id": run_id, "sweep": SWEEP, "status": status, "axes": {"container": task, "algorithm": stack,
                                                                    "seed": str(seed)},
        "spec": {"container": {"name": task}, "algorithm": {"name": stack}, "seed": seed,
                 "policy": {"model": "policy-m"}, "proposer": {"model": "proposer-m"}},
        "seed_candidate_id": "c0", "best_candidate_id": "c0", "heldout": [], "totals": totals or {},
        "timings": timings or {}})
    return location


def write_golden(root: Path) -> Path:
    """task toy; stacks gepa (2 seeds), seed_only (seed 1 never ran), gepa_ai (seed 0 failed)."""
    write_run(root, "g0", task="toy", stack="gepa", seed=0,
              candidates={"c0": (0, 0, 0.0, 0.0), "c1": (1, 10, 0.1, 5.0), "c2": (2, 20, 0.2, 10.0),
                          "c3": (3, 30, 0.3, 15.0)},
              rollouts=[("c0", "train:0", "seed", 0.0), ("c0", "train:1", "seed", 1.0),
                        ("c1", "train:0", "minibatch", 1.0), ("c1", "train:2", "minibatch", 0.0),
                        ("c2", "train:2", "minibatch", 1.0), ("c3", "train:2", "pareto", 0.0)]
              + heldout("c0", [1, 0, 0, 0]) + heldout("c1", [0, 1, 1, 0]) + heldout("c3", [1, 0, 0, 1]))
    write_run(root, "g1", task="toy", stack="gepa", seed=1,
              candidates={"c0": (0, 0, 0.0, 0.0), "c1": (1, 8, 0.05, 2.0)},
              rollouts=[("c0", "train:0", "seed", 1.0), ("c0", "train:1", "seed", 0.0),
                        ("c1", "train:1", "minibatch", 1.0)]
              + heldout("c0", [1, 0, 0, 0]) + heldout("c1", [1, 1, 1, 1]))
    write_run(root, "s0", task="toy", stack="seed_only", seed=0, candidates={"c0": (0, 0, 0.0, 0.0)},
              rollouts=[("c0", "train:0", "seed", 0.0), ("c0", "train:1", "seed", 0.0)]
              + heldout("c0", [1, 1, 0, 0]))
    write_run(root, "a0", task="toy", stack="gepa_ai", seed=0, candidates={"c0": (0, 0, 0.0, 0.0)},
              rollouts=heldout("c0", [1, 1, 1, 1]), status="failed")
    grid = [{"run_id": rid, "container": "toy", "algorithm": stack, "seed": str(seed)}
            for rid, stack, seed in [("g0", "gepa", 0), ("g1", "gepa", 1), ("s0", "seed_only", 0),
                                     ("s1", "seed_only", 1), ("a0", "gepa_ai", 0), ("a1", "gepa_ai", 1)]]
    SweepStore(str(root), SWEEP).write_sweep({"grid": grid})
    return root / SWEEP


@pytest.fixture()
def sweep_dir(tmp_path: Path) -> Path:
    return write_golden(tmp_path)


GOLDEN_COLUMNS: dict[str, Any] = {
    "task": pl.String, "stack": pl.String, "status": pl.String, "n_expected": pl.Int64, "n_runs": pl.Int64,
    "n_failed": pl.Int64, "ci": pl.String, "k": pl.Int64, "best_heldout_mean": pl.Float64,
    "best_heldout_lo": pl.Float64, "best_heldout_hi": pl.Float64, "seed_heldout_mean": pl.Float64,
    "lift_mean": pl.Float64, "heldout_coverage_mean": pl.Float64, "heldout_coverage_lo": pl.Float64,
    "heldout_coverage_hi": pl.Float64, "heldout_rows_mean": pl.Float64, "train_coverage_mean": pl.Float64,
    "train_rows_mean": pl.Float64, "found_rollouts_mean": pl.Float64, "found_cost_usd_mean": pl.Float64,
    "found_elapsed_s_mean": pl.Float64, "pareto_points": pl.Int64, "pareto_share": pl.Float64,
}


def test_golden_summary(sweep_dir: Path) -> None:
    summary = compute_report(str(sweep_dir), ReportOptions(k=2)).summary
    # gepa: best [0.5, 1.0], seeds 0.25, coverage through K=2 [3, 4]/4, train [2, 2]/[3, 2],
    # best found at (10, 0.1, 5) and (8, 0.05, 2); joint front: g1/c1 and s0/c0.
    expected = pl.DataFrame([
        ("toy", "gepa", "ok", 2, 2, 0, "bootstrap95", 2, 0.75, 0.5, 1.0, 0.25, 0.5, 3.5, 3.0, 4.0, 4.0, 2.0, 2.5,
         9.0, 0.075, 3.5, 1, 0.5),
        ("toy", "gepa_ai", "missing", 2, 0, 1, "none", 2, *[None] * 16),
        # one run: no interval (lo/hi null), never the value itself dressed as one
        ("toy", "seed_only", "partial", 2, 1, 0, "n=1, no CI", 2, 0.5, None, None, 0.5, 0.0, 2.0, None, None, 4.0,
         0.0, 2.0, 0.0, 0.0, 0.0, 1, 0.5),
    ], schema=GOLDEN_COLUMNS, orient="row")
    assert_frame_equal(summary.select(list(GOLDEN_COLUMNS)), expected)


def test_golden_all_candidates_and_markdown(sweep_dir: Path, tmp_path: Path) -> None:
    paths = write_report(str(sweep_dir), out=str(tmp_path / "out"), charts=False)
    summary = pl.read_parquet(paths.summary_parquet)
    gepa = summary.filter(pl.col("stack") == "gepa")
    assert gepa["k"].item() == 3 and gepa["heldout_coverage_mean"].item() == 4.0
    markdown = Path(paths.summary_md).read_text()
    assert "| toy | gepa_ai | missing (0/2 runs, 1 failed) | missing | missing | missing | missing |" in markdown
    assert ("| toy | seed_only (1/2 runs) | 0.500 (n=1, no CI, 4 rows) | 0.500 (n=1, no CI, 4 rows) "
            "| 2/4 (n=1, no CI) | 0/2 (n=1, no CI) | 1 (50.0%) |") in markdown
    # the runs' own pick (the seed, c0, in these manifests) heads the table; the best on heldout
    # is beside it, labelled as test-set selection
    assert "| pick heldout | best heldout (test-set selection) |" in markdown
    assert ("| toy | gepa | 0.250 [0.250, 0.250] (4 rows) | 0.750 [0.500, 1.000] (4 rows) | 4/4 [4, 4] "
            "| 2/2.5 [2, 2] | 1 (50.0%) |") in markdown
    rows = json.loads(Path(paths.summary_json).read_text())["rows"]
    assert [(r["stack"], r["status"]) for r in rows] == [("gepa", "ok"), ("gepa_ai", "missing"),
                                                          ("seed_only", "partial")]
    curves = pl.read_parquet(paths.curve_points)
    assert curves.columns == ["stack", "task", "run", "metric", "x_name", "x", "y"]
    g0 = curves.filter((pl.col("run") == "g0") & (pl.col("metric") == "heldout_coverage"))
    assert g0["y"].to_list() == [1.0, 3.0, 4.0]


def test_a_best_so_far_line_goes_on_to_where_its_run_ended(tmp_path: Path) -> None:
    """A run that scored only its seed and one child on heldout (the quality sweep's runs) has
    a best-so-far line to the end of its search, at the level it reached, on every axis; a
    run without recorded totals ends at its last heldout-scored candidate, as before."""
    write_run(tmp_path, "r0", task="toy", stack="gepa", seed=0,
              candidates={"c0": (0, 0, 0.0, 0.0), "c1": (1, 10, 0.1, 5.0), "c2": (2, 20, 0.2, 10.0)},
              rollouts=heldout("c0", [1, 0, 0, 0]) + heldout("c1", [1, 1, 1, 0]),
              totals={"rollouts": 40, "cost_usd": 0.4}, timings={"optimize_s": 30.0})
    write_run(tmp_path, "r1", task="toy", stack="gepa", seed=1,
              candidates={"c0": (0, 0, 0.0, 0.0), "c1": (1, 10, 0.1, 5.0)},
              rollouts=heldout("c0", [1, 0, 0, 0]) + heldout("c1", [1, 1, 0, 0]))
    SweepStore(str(tmp_path), SWEEP).write_sweep({"grid": [
        {"run_id": f"r{seed}", "container": "toy", "algorithm": "gepa", "seed": str(seed)} for seed in (0, 1)]})
    curves = compute_report(str(tmp_path / SWEEP), ReportOptions()).curve_points
    ended = {"rollouts": 40.0, "cost_usd": 0.4, "elapsed_s": 30.0}
    for x_name, end in ended.items():
        for run, points in ((r, curves.filter((pl.col("run") == r) & (pl.col("x_name") == x_name)
                                              & (pl.col("metric") == "best_heldout_lift"))) for r in ("r0", "r1")):
            last = points.sort("x").row(-1, named=True)
            expected_x = end if run == "r0" else {"rollouts": 10.0, "cost_usd": 0.1, "elapsed_s": 5.0}[x_name]
            assert (last["x"], last["y"]) == (pytest.approx(expected_x), pytest.approx(0.5 if run == "r0" else 0.25))


def test_error_rows_are_left_out_of_scores_and_counted(tmp_path: Path) -> None:
    """A failed rollout has no reward: a score is the mean of the other rows and says how many."""
    write_run(tmp_path, "e0", task="toy", stack="gepa", seed=0,
              candidates={"c0": (0, 0, 0.0, 0.0), "c1": (1, 4, 0.0, 1.0), "c2": (2, 8, 0.0, 2.0)},
              rollouts=heldout("c0", [1, None, 0, None]) + heldout("c1", [None] * 4) + heldout("c2", [0, 0, 1, 0]))
    SweepStore(str(tmp_path), SWEEP).write_sweep({"grid": [
        {"run_id": "e0", "container": "toy", "algorithm": "gepa", "seed": "0"}]})
    frames = compute_report(str(tmp_path / SWEEP), ReportOptions())
    run = frames.runs.row(0, named=True)
    # seed 0.5 on 2 rows (not 0.25 on 4); c1 has no score at all and is never the best
    assert (run["seed_heldout"], run["seed_heldout_n"]) == (0.5, 2.0)
    assert (run["best_heldout"], run["best_candidate_id"], run["best_heldout_n"]) == (0.5, "c0", 2.0)
    assert "| toy | gepa | 0.500 (n=1, no CI, 2 rows) |" in render_markdown(frames)


def test_thresholds_recorded_by_the_sweep_apply_unless_overridden(sweep_dir: Path, tmp_path: Path) -> None:
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    SweepStore(str(sweep_dir.parent), SWEEP).write_sweep({**sweep, "solved_thresholds": {"toy": 0.5}})
    recorded = pl.read_parquet(write_report(str(sweep_dir), out=str(tmp_path / "a"), charts=False).summary_parquet)
    assert set(recorded["threshold"].drop_nulls()) == {0.5}
    given = pl.read_parquet(write_report(str(sweep_dir), out=str(tmp_path / "b"), charts=False,
                                         task_thresholds={"toy": 1.0}).summary_parquet)
    assert set(given["threshold"].drop_nulls()) == {1.0}


# ---- one test per metric on tiny frames ------------------------------------------------------

def _rollouts(rows: Rollouts, run_id: str = "r") -> pl.LazyFrame:
    return pl.LazyFrame([(run_id, c, t, s, float(r)) for c, t, s, r in rows], orient="row",
                        schema={"run_id": pl.String, "candidate_id": pl.String, "task_id": pl.String,
                                "stage": pl.String, "reward": pl.Float64})


def _candidates(rows: Candidates, run_id: str = "r") -> pl.LazyFrame:
    return pl.LazyFrame([(run_id, c, i, n, cost, t) for c, (i, n, cost, t) in rows.items()], orient="row",
                        schema={"run_id": pl.String, "candidate_id": pl.String, "index": pl.Int64,
                                "rollouts_at_creation": pl.Int64, "cost_usd_at_creation": pl.Float64,
                                "elapsed_s_at_creation": pl.Float64})


def _runs(threshold: float = 1.0, run_ids: tuple[str, ...] = ("r",)) -> pl.LazyFrame:
    return pl.LazyFrame({"run_id": list(run_ids), "task": ["t"] * len(run_ids), "stack": ["s"] * len(run_ids),
                         "seed_candidate_id": ["a"] * len(run_ids), "pick_candidate_id": ["c"] * len(run_ids),
                         "threshold": [threshold] * len(run_ids)})


def test_coverage_through_k_uses_heldout_scored_candidates_in_index_order() -> None:
    # index order a(0), b(1, never scored on heldout), c(2), d(3): K counts a, c, d.
    candidates = _candidates({"d": (3, 0, 0, 0), "a": (0, 0, 0, 0), "b": (1, 0, 0, 0), "c": (2, 0, 0, 0)})
    rollouts = _rollouts(heldout("a", [1, 0, 0]) + heldout("c", [0.5, 0.8, 0]) + heldout("d", [1, 1, 0])
                         + [("b", "train:0", "minibatch", 1.0), ("c", "train:1", "pareto", 1.0)])
    scored = metrics.scored_candidates(rollouts, candidates)
    assert scored.sort("k").select("candidate_id", "k").collect().rows() == [("a", 1), ("c", 2), ("d", 3)]
    strict = metrics.coverage_curve(rollouts, scored, _runs(1.0), "heldout").sort("k").collect()
    assert strict["covered"].to_list() == [1, 1, 2] and strict["rows"].to_list() == [3, 3, 3]
    loose = metrics.coverage_curve(rollouts, scored, _runs(0.5), "heldout").sort("k").collect()
    assert loose["covered"].to_list() == [1, 2, 2]
    assert metrics.coverage_through(loose.lazy(), 1).collect()["covered"].item() == 1
    train = metrics.coverage_curve(rollouts, scored, _runs(1.0), "train").sort("k").collect()
    assert train["covered"].to_list() == [0, 1, 1] and train["rows"].to_list() == [2, 2, 2]


def test_joint_pareto_membership() -> None:
    scored = pl.LazyFrame({
        "run_id": ["r"] * 6, "candidate_id": ["a", "b", "c", "d", "e", "f"],
        "heldout_mean": [0.5, 0.5, 0.9, 0.5, 0.4, 0.9],
        "cost_usd_at_creation": [1.0, 1.0, 3.0, 2.0, 0.5, None],
        "elapsed_s_at_creation": [1.0, 1.0, 3.0, 1.0, 9.0, 0.0]})
    points = metrics.pareto_points(scored, _runs()).sort("candidate_id").collect()
    # a, b: identical, neither dominates; c: best score; d: a is cheaper; e: cheapest;
    # f: unknown cost counts as +inf, c is as good and cheaper but slower, so f stays.
    assert points["on_front"].to_list() == [True, True, True, False, True, True]


def test_lift_and_found_at() -> None:
    scored = metrics.scored_candidates(
        _rollouts(heldout("a", [0, 1]) + heldout("b", [1, 1]) + heldout("c", [1, 1])),
        _candidates({"a": (0, 0, 0.0, 0.0), "b": (1, 7, 0.2, 3.0), "c": (2, 9, 0.3, 4.0)}))
    best = metrics.run_best(scored, _runs()).collect()
    assert best.select("best_heldout", "seed_heldout", "lift", "best_candidate_id", "found_rollouts",
                       "found_cost_usd", "found_elapsed_s").row(0) == (1.0, 0.5, 0.5, "b", 7.0, 0.2, 3.0)
    # the run's own pick (c) is reported on its own, whatever scored best on heldout
    assert best.select("pick_heldout", "pick_lift").row(0) == (1.0, 0.5)


def test_bootstrap_ci_is_deterministic_and_flags_single_runs() -> None:
    per_run = pl.LazyFrame({"task": ["t"] * 6, "stack": ["x"] + ["y"] * 5, "seed": [0, 0, 1, 2, 3, 4],
                            "run_id": [f"r{i}" for i in range(6)], "v": [0.3, 0.1, 0.3, 0.5, 0.7, 0.9]})

    def ci(seed: int) -> pl.DataFrame:
        plan = metrics.resample_plan([1, 5], resamples=1000, seed=seed)
        return metrics.seed_summary(per_run, plan, [], metrics=["v"]).sort("stack").collect()

    first = ci(0)
    assert_frame_equal(first, ci(0))
    single, five = first.row(0, named=True), first.row(1, named=True)
    assert (single["n_runs"], single["v_mean"], single["v_lo"], single["v_hi"]) == (1, 0.3, None, None)
    assert 0.1 < five["v_lo"] < five["v_mean"] < five["v_hi"] < 0.9
    assert five["v_mean"] == pytest.approx(0.5)
    # the plan depends on the RNG seed (so the report states it), not on other cells' sizes
    plan = metrics.resample_plan([5], seed=0).collect()
    assert not plan.equals(metrics.resample_plan([5], seed=1).collect())
    assert_frame_equal(plan, metrics.resample_plan([1, 5, 7], seed=0).filter(pl.col("n") == 5).collect())


# ---- refusal and determinism -----------------------------------------------------------------

def test_other_manifest_schema_version_fails_with_one_line(sweep_dir: Path) -> None:
    manifest = sweep_dir / "g1" / "manifest.json"
    body = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**body, "schema_version": "0"}))
    with pytest.raises(SchemaVersionError) as error:
        compute_report(str(sweep_dir))
    message = str(error.value)
    assert "\n" not in message and str(manifest) in message
    assert "'0'" in message and f"'{SCHEMA_VERSION}'" in message


def test_other_parquet_schema_version_fails(sweep_dir: Path) -> None:
    path = sweep_dir / "s0" / "rollouts.parquet"
    table = pq.read_table(path)
    pq.write_table(table.cast(ROLLOUTS.with_metadata({SCHEMA_METADATA_KEY: b"99"})), path)
    pattern = rf"{re.escape(str(path))}: evidence schema version '99', .*'{SCHEMA_VERSION}'"
    with pytest.raises(SchemaVersionError, match=pattern):
        write_report(str(sweep_dir), charts=False)


def test_regenerating_twice_is_byte_identical(sweep_dir: Path) -> None:
    """Also whether a second process drew half of the charts or not."""
    first = write_report(str(sweep_dir), chart_worker=True)
    snapshot = {p.name: p.read_bytes() for p in Path(first.report_dir).iterdir()}
    second = write_report(str(sweep_dir), chart_worker=False)
    # one proposer in the golden sweep: no proposer-scaling chart
    assert second == first and sorted(Path(p).name for p in first.charts) == sorted(
        f"{name}.{ext}" for name in ("coverage", "best_vs_rollouts", "best_vs_cost_usd", "same_container")
        for ext in ("png", "svg"))
    assert {p.name: p.read_bytes() for p in Path(second.report_dir).iterdir()} == snapshot


def test_no_finished_runs_reports_every_cell_missing(tmp_path: Path) -> None:
    SweepStore(str(tmp_path), SWEEP).write_sweep({"grid": [{"run_id": "x", "container": "toy", "algorithm": "gepa"}]})
    summary = compute_report(str(tmp_path / SWEEP)).summary
    assert summary.select("task", "stack", "status").rows() == [("toy", "gepa", "missing")]
