"""What a report says, computed from its frames: one sentence per task (and per run for a
single run's trace) that chart titles and summary.md share, and which charts apply.

- lift: the cell with the highest mean pick lift (the run's own pick minus its own seed) is
  compared with the task's seed noise floor (metrics.noise_floor): it beats the noise when its
  mean lift is above the half range; with fewer than two runs of the seed the floor is unknown.
- coverage: the cell solving the most heldout rows through K, beside the seed alone.
- trace: for a single run, whether it kept its seed, its lift, proposals made and accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

CONCLUSION_SCHEMA = {"task": pl.String, "subject": pl.String, "run_id": pl.String, "text": pl.String}
SWEEP_CHARTS = ("coverage", "best_vs_rollouts", "best_vs_cost_usd", "proposer_scaling", "same_container")


def _ci(row: dict[str, Any], metric: str) -> str:
    n, lo, hi = row["n_runs"], row.get(f"{metric}_lo"), row.get(f"{metric}_hi")
    if n < 2 or lo is None or hi is None:
        return f"n={n}, no CI"
    return f"n={n} seeds, CI [{lo:+.3f}, {hi:+.3f}]"


def task_noise(rows: list[dict[str, Any]]) -> tuple[float | None, int]:
    halves = [r["noise_half_range"] for r in rows if r.get("noise_half_range") is not None]
    runs = max([r.get("noise_runs") or 0 for r in rows] or [0])
    return (max(halves) if halves else None), runs


def noise_text(half: float | None, runs: int) -> str:
    if half is None:
        return f"seed noise floor unknown ({runs} run{'s' if runs != 1 else ''} of the seed on these rows)"
    return f"seed noise ±{half:.3f} (half the range of the seed's heldout over {runs} runs)"


def _leader(rows: list[dict[str, Any]], column: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The cells that ran and have `column`, and the one with the highest (ties: the first)."""
    ran = [r for r in rows if r["n_runs"] > 0 and r.get(column) is not None]
    return ran, (max(ran, key=lambda r: (r[column], -ran.index(r))) if ran else None)


def lift_sentence(task: str, rows: list[dict[str, Any]]) -> str:
    ran, best = _leader(rows, "pick_lift_mean")
    if best is None:
        return f"{task}: no finished run with a heldout score"
    lift, label = best["pick_lift_mean"], best["label"]
    half, runs = task_noise(ran)
    ci = _ci(best, "pick_lift")
    if lift <= 0:
        return f"{task}: no stack lifts heldout over its own seed (best {label}: {lift:+.3f}, {ci}); " \
               + noise_text(half, runs)
    if half is None:
        return f"{task}: {label} lifts heldout by {lift:+.3f} ({ci}); {noise_text(half, runs)}"
    if lift <= half:
        return (f"{task}: no stack beats the seed's noise floor (±{half:.3f} over {runs} runs); "
                f"best {label}: {lift:+.3f} ({ci})")
    if best["n_runs"] < 2:
        return (f"{task}: {label} lifts heldout by {lift:+.3f} in its one run (no CI), past the seed noise "
                f"±{half:.3f} ({runs} runs)")
    lo = best.get("pick_lift_lo")
    caveat = ", though its CI reaches into the noise" if lo is not None and lo <= half else ""
    return f"{task}: {label} lifts heldout by {lift:+.3f} ({ci}), beyond the seed noise ±{half:.3f}{caveat}"


def best_sentence(task: str, rows: list[dict[str, Any]]) -> str:
    """The same comparison for the best candidate on heldout: test-set selection, an upper bound."""
    ran, best = _leader(rows, "lift_mean")
    if best is None:
        return f"{task}: no finished run with a heldout score"
    lift, label, ci = best["lift_mean"], best["label"], _ci(best, "lift")
    half, runs = task_noise(ran)
    if half is not None and lift <= half:
        return (f"{task}: no candidate gets beyond the seed noise ±{half:.3f} on heldout, even picked on heldout "
                f"(best {label}: {lift:+.3f}, {ci})")
    return (f"{task}: picked on heldout (an upper bound), the best candidate is {lift:+.3f} over its run's seed "
            f"({label}, {ci}); {noise_text(half, runs)}")


def coverage_sentence(task: str, rows: list[dict[str, Any]]) -> str:
    _, best = _leader(rows, "heldout_coverage_mean")
    if best is None:
        return f"{task}: no finished run"
    seed = best.get("seed_heldout_coverage_mean")
    alone = f"; the seed alone solves {seed:g}" if seed is not None else ""
    return (f"{task}: {best['label']} solves the most heldout rows, {best['heldout_coverage_mean']:g} of "
            f"{best['heldout_rows_mean']:g} through K={best['k']}{alone}")


def trace_sentence(run: dict[str, Any], trace: pl.DataFrame) -> str:
    mine = trace.filter((pl.col("run_id") == run["run_id"]) & (pl.col("kind") == "minibatch"))
    made, accepted = mine.height, int(mine["accepted"].sum() or 0)
    proposals = f"{made} proposal{'s' if made != 1 else ''} judged, {accepted} accepted"
    seed, pick, rows = run.get("seed_heldout"), run.get("pick_heldout"), run.get("pick_heldout_n")
    on = f"{rows:g} rows" if rows is not None else "no rows"
    if seed is None or pick is None:
        return f"{run['task']}: no heldout score for the seed or the pick; {proposals}"
    unknown = noise_text(None, 1)
    if run.get("pick_candidate_id") == run.get("seed_candidate_id"):
        return f"{run['task']}: the run kept its seed (heldout {seed:.3f}, {on}); {proposals}; {unknown}"
    return (f"{run['task']}: the run's pick lifts heldout {seed:.3f} -> {pick:.3f} ({pick - seed:+.3f}, {on}); "
            f"{proposals}; {unknown}")


def conclude(summary: pl.DataFrame, runs: pl.DataFrame, trace: pl.DataFrame) -> pl.DataFrame:
    """Per task: lift (the headline), best (test-set selection), coverage; a single run: its trace."""
    out: list[dict[str, Any]] = []
    if runs.height == 1:
        run = runs.row(0, named=True)
        out.append({"task": run["task"], "subject": "trace", "run_id": run["run_id"],
                    "text": trace_sentence(run, trace)})
        return pl.DataFrame(out, schema=CONCLUSION_SCHEMA)
    for task in sorted(set(summary["task"].drop_nulls())):
        rows = summary.filter(pl.col("task") == task).sort("label").to_dicts()
        for subject, write in (("lift", lift_sentence), ("best", best_sentence), ("coverage", coverage_sentence)):
            out.append({"task": task, "subject": subject, "run_id": None, "text": write(task, rows)})
    return pl.DataFrame(out, schema=CONCLUSION_SCHEMA)


def sentence(conclusions: pl.DataFrame, task: str, subject: str) -> str:
    found = conclusions.filter((pl.col("task") == task) & (pl.col("subject") == subject))["text"]
    return str(found[0]) if len(found) else task


@dataclass(frozen=True)
class ChartPlan:
    drawn: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (chart, why)


def proposer_column(axes: list[str]) -> str:
    return "proposer" if "proposer" in axes else "proposer_model"


def plan_charts(summary: pl.DataFrame, runs: pl.DataFrame, curves: pl.DataFrame, axes: list[str]) -> ChartPlan:
    """A single run gets its trace; sweep-shaped charts need what they compare."""
    if runs.height == 0:
        return ChartPlan((), tuple((name, "no finished run") for name in ("trace", *SWEEP_CHARTS)))
    if runs.height == 1:
        return ChartPlan(("trace",), tuple((name, "one run: its trace shows it") for name in SWEEP_CHARTS))
    drawn, skipped = ["coverage", "best_vs_rollouts"], []
    costs = curves.filter((pl.col("x_name") == "cost_usd") & (pl.col("x") > 0))
    (drawn.append("best_vs_cost_usd") if costs.height else skipped.append(("best_vs_cost_usd", "no run recorded a cost")))
    ran = summary.filter(pl.col("n_runs") > 0)
    per_task = ran.group_by("task").agg(cells=pl.len(), proposers=pl.col(proposer_column(axes)).n_unique())
    if per_task.filter(pl.col("proposers") > 1).height:
        drawn.append("proposer_scaling")
    else:
        skipped.append(("proposer_scaling", "one proposer per task"))
    if per_task.filter(pl.col("cells") > 1).height:
        drawn.append("same_container")
    else:
        skipped.append(("same_container", "one cell per task"))
    return ChartPlan(tuple(drawn), tuple(skipped))
