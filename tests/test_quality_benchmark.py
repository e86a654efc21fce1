"""`python -m benchmarks.quality` end to end with the scripted models (the real sweep, real
containers, real Parquet), then the table's handling of runs that are not done."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from benchmarks.quality.__main__ import default_arms, main
from benchmarks.quality.table import (
    bootstrap_ci, label_variants, markdown, pick_changes, runs, summary, top_answer,
)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("quality")
    code = main(["--quick", "--out", str(out), "--", "models=scripted", "sweep.containers=[heart_disease]",
                 "sweep.algorithms=[gepa,seed_only]", f"data_dir={data_dir}"])
    assert code == 0
    return out


def copy_of_the_gepa_run(quick: Path, tmp_path: Path, run_id: str) -> tuple[Path, Path, dict]:
    """(the quick sweep copied, a copy of its GEPA run in it under `run_id`, that copy's manifest
    to edit and write back)."""
    sweep = tmp_path / "quality"
    shutil.copytree(quick / "evidence" / "quality", sweep)
    gepa_dir = next(p.parent for p in sweep.glob("*/manifest.json")
                    if json.loads(p.read_text())["spec"]["algorithm"]["name"] == "gepa")
    copy = sweep / run_id
    shutil.copytree(gepa_dir, copy)
    return sweep, copy, {**json.loads((copy / "manifest.json").read_text()), "run_id": run_id}


def test_quick_benchmark_writes_the_table_from_the_evidence(quick: Path) -> None:
    per_run = pl.read_parquet(quick / "runs.parquet")
    assert sorted(per_run.select("arm", "seed", "status").rows()) == [("gepa", 0, "done"), ("seed_only", 0, "done")]
    assert (per_run["heldout_rows"] == 20).all()
    seed_only = per_run.filter(pl.col("arm") == "seed_only")
    assert seed_only["lift"].to_list() == [0.0]  # the control arm's pick is its seed
    gepa = per_run.filter(pl.col("arm") == "gepa").row(0, named=True)
    assert gepa["lift"] == pytest.approx(gepa["pick_heldout"] - gepa["seed_heldout"])
    assert 0 < gepa["rollouts"] <= 60
    table = (quick / "summary.md").read_text()
    assert "| heart_disease | gepa | 1 | s0: " in table and "scripted-rules" in table
    assert "An arm named by its algorithm alone runs what the default command runs" in table
    # what the pick changed, per optimizing run (the control arm has none to show)
    assert "## What each run's pick changed" in table
    note = next(line for line in table.splitlines() if line.startswith("- heart_disease / gepa / seed 0: pick "))
    assert f"`{gepa['pick_id']}`, lift {gepa['lift']:+.3f}" in note and "seed_only / seed" not in table
    # regenerating from the evidence alone gives the same table
    assert main(["--report-only", "--quick", "--out", str(quick)]) == 0
    assert (quick / "summary.md").read_text() == table


def test_a_run_that_is_not_done_is_counted_apart_never_as_zero(quick: Path, tmp_path: Path) -> None:
    sweep, failed, manifest = copy_of_the_gepa_run(quick, tmp_path, "failed-run")
    manifest.update(status="failed", heldout=[], spec={**manifest["spec"], "seed": 1})
    (failed / "manifest.json").write_text(json.dumps(manifest))
    cells = summary(runs(sweep)).filter(pl.col("arm") == "gepa").row(0, named=True)
    assert cells["seeds_done"] == 1 and cells["runs_not_done"] == 1
    done = runs(sweep).filter((pl.col("arm") == "gepa") & (pl.col("status") == "done"))
    assert cells["lift_mean"] == pytest.approx(done["lift"][0])


def test_bootstrap_interval_over_seeds() -> None:
    assert bootstrap_ci([0.2]) == (0.2, 0.2)
    lo, hi = bootstrap_ci([0.1, 0.2, 0.3])
    assert 0.1 <= lo < 0.2 < hi <= 0.3
    assert bootstrap_ci([0.1, 0.2, 0.3]) == (lo, hi)  # a fixed resample plan


def test_pick_changes_are_the_lines_added_and_dropped_per_module(tmp_path: Path) -> None:
    seed = {"system": "Classify the message.\nReply with the label only.", "user": "{query}"}
    pick = {"system": "Classify the message.\n\nRules learned from mistakes:\n- If it is about a card, answer `card`.",
            "user": "{query}"}
    pl.DataFrame({"candidate_id": ["c0000", "c0003"],
                  "modules_json": [json.dumps(seed), json.dumps(pick)]}).write_parquet(tmp_path / "candidates.parquet")
    assert pick_changes(tmp_path, "c0000", "c0003") == [
        "system: - Reply with the label only.", "system: + Rules learned from mistakes:",
        "system: + - If it is about a card, answer `card`."]
    assert pick_changes(tmp_path, "c0000", "c0000") == []  # a run that kept its seed


def test_runs_of_one_algorithm_with_other_settings_are_other_arms() -> None:
    rows = [{"task": "t", "arm": "gepa"}, {"task": "t", "arm": "gepa"}, {"task": "t", "arm": "gepa"},
            {"task": "t", "arm": "seed_only"}]
    params = [{"samples": 2, "screen": True}, {"samples": 2, "screen": True}, {"samples": 2}, {}]
    label_variants(rows, params, {})
    assert [r["arm"] for r in rows] == ["gepa (screen=true)", "gepa (screen=true)", "gepa (screen=absent)", "seed_only"]


def test_arms_are_named_by_how_they_differ_from_the_default_command() -> None:
    """The runs the default command makes keep the algorithm's name; any other names only
    what it changes, a setting the default has that the run lacks as `absent`."""
    tasks = ["t", "t", "t", "t", "u"]
    rows = [{"task": task, "arm": "gepa"} for task in tasks]
    params = [{"samples": 2, "screen": True}, {"samples": 4, "screen": True}, {"samples": 2},
              {"samples": 2, "screen": True, "memory": 64}, {"samples": 2}]
    label_variants(rows, params, {("t", "gepa"): {"samples": 2, "screen": True}})
    assert [r["arm"] for r in rows] == ["gepa", "gepa (samples=4)", "gepa (screen=absent)", "gepa (memory=64)",
                                        "gepa"]  # task u: the default plans none, and its one run differs from none


def test_runs_on_other_pool_sizes_are_other_arms(quick: Path, tmp_path: Path) -> None:
    sweep, wider, manifest = copy_of_the_gepa_run(quick, tmp_path, "wider-run")
    train = [f"train:{i}" for i in range(100, 200)]
    manifest.update(spec={**manifest["spec"], "pools": {**manifest["spec"]["pools"], "train": train}},
                    pools_used={**manifest["pools_used"], "train": train})
    (wider / "manifest.json").write_text(json.dumps(manifest))
    arms = runs(sweep).select("arm", "run_id").rows()
    assert ("gepa (train_rows=100)", "wider-run") in arms
    assert sorted(arm for arm, _ in arms) == ["gepa (train_rows=100)", "gepa (train_rows=20)", "seed_only"]
    # against what `--quick` plans (composed from the configs): its own runs are the default arms
    arms = runs(sweep, default_arms(quick=True)).select("arm", "run_id").rows()
    assert sorted(arm for arm, _ in arms) == ["gepa", "gepa (train_rows=100)", "seed_only"]


def test_runs_on_another_budget_are_another_arm(quick: Path, tmp_path: Path) -> None:
    """Not pooled into the default's mean: the budget names an arm too."""
    sweep, richer, manifest = copy_of_the_gepa_run(quick, tmp_path, "richer")
    spec = manifest["spec"]
    (richer / "manifest.json").write_text(json.dumps({**manifest, "spec": {
        **spec, "budget": {**spec["budget"], "max_rollouts": 90}}}))
    arms = dict(runs(sweep, default_arms(quick=True)).select("run_id", "arm").rows())
    assert arms["richer"] == "gepa (max_rollouts=90)"
    assert sorted(arms.values()) == ["gepa", "gepa (max_rollouts=90)", "seed_only"]


def test_a_run_that_scored_more_candidates_shows_the_best_of_them_as_test_set_selection(quick: Path,
                                                                                       tmp_path: Path) -> None:
    """Beside the pick, never in its place: the best heldout score among the candidates a run
    scored there, in a column and note of its own; runs that scored only their pick show none."""
    sweep, top_k_dir, manifest = copy_of_the_gepa_run(quick, tmp_path, "top-k")
    seed_id, pick_id = manifest["seed_candidate_id"], manifest["best_candidate_id"]
    scores = {h["candidate_id"]: h["heldout_score"] for h in manifest["heldout"]}
    better = dict(manifest["heldout"][-1], candidate_id="c9999", heldout_score=scores[pick_id] + 0.25)
    # a run whose other candidate has no heldout score (its rollouts failed): nothing to select among
    unscored_dir = sweep / "unscored"
    shutil.copytree(top_k_dir, unscored_dir)
    (unscored_dir / "manifest.json").write_text(json.dumps(
        {**manifest, "run_id": "unscored", "heldout": [*manifest["heldout"], dict(better, heldout_score=None)],
         "spec": {**manifest["spec"], "heldout_candidates": 3}}))
    manifest.update(heldout=[*manifest["heldout"], better], spec={**manifest["spec"], "heldout_candidates": 2})
    (top_k_dir / "manifest.json").write_text(json.dumps(manifest))
    per_run = runs(sweep, default_arms(quick=True))
    unscored = per_run.filter(pl.col("run_id") == "unscored").row(0, named=True)
    assert unscored["posthoc_id"] is None and unscored["posthoc_lift"] is None
    top_k = per_run.filter(pl.col("run_id") == "top-k").row(0, named=True)
    assert top_k["arm"] == "gepa (heldout_candidates=2)"
    assert top_k["lift"] == pytest.approx(scores[pick_id] - scores[seed_id])  # the headline stays the pick's
    assert top_k["posthoc_id"] == "c9999" and top_k["posthoc_lift"] == pytest.approx(top_k["lift"] + 0.25)
    default = per_run.filter(pl.col("arm") == "gepa").row(0, named=True)
    assert default["posthoc_id"] is None and default["posthoc_lift"] is None
    table = markdown(per_run, summary(per_run), "t")
    row = next(line for line in table.splitlines() if line.startswith("| heart_disease | gepa (heldout_candidates=2) |"))
    assert f"| {top_k['posthoc_lift']:+.3f} |" in row
    assert next(line for line in table.splitlines() if line.startswith("| heart_disease | gepa |")).count("| - |") == 1


def test_the_most_common_answer_counts_only_scored_heldout_rows_of_the_candidate(tmp_path: Path) -> None:
    rows = [("c1", "heldout", "ok", 1.0, "no"), ("c1", "heldout", "ok", 0.0, " no\n"), ("c1", "heldout", "ok", 1.0, "yes"),
            ("c1", "heldout", "error", None, "yes"),  # failed: not an answer the table counts
            ("c1", "heldout", "ok", None, "yes"),     # no reward: left out as well
            ("c1", "pareto", "ok", 1.0, "yes"), ("c2", "heldout", "ok", 1.0, "yes")]
    pl.DataFrame(rows, schema=["candidate_id", "stage", "status", "reward", "output"], orient="row").write_parquet(
        tmp_path / "rollouts.parquet")
    answer, share = top_answer(tmp_path, "c1")
    assert answer == "no" and share == pytest.approx(2 / 3)
    assert top_answer(tmp_path, "c3") is None and top_answer(tmp_path, None) is None
    assert top_answer(tmp_path, "c2") == ("yes", 1.0)


def test_a_tie_between_answers_goes_to_the_first_in_sort_order(tmp_path: Path) -> None:
    rows = [("c1", "heldout", "ok", 1.0, answer) for answer in ("no", "yes", "yes", "no", "maybe")]
    pl.DataFrame(rows, schema=["candidate_id", "stage", "status", "reward", "output"], orient="row").write_parquet(
        tmp_path / "rollouts.parquet")
    assert top_answer(tmp_path, "c1") == ("no", pytest.approx(2 / 5))
