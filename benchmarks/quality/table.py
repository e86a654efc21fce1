"""The quality table from the evidence alone: one row per run (the lift of its own pick on
heldout over the seed prompt, on the same rows), then per task and arm the per-seed lifts,
their mean and a 95% percentile bootstrap interval over seeds, wall time and rollouts.

A run that is not `done` is listed as such and left out of the means: missing evidence is
never a zero."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from harness.evidence.reader import pools_used

BOOTSTRAP_RESAMPLES = 10_000
RUN_COLUMNS = ("task", "arm", "seed", "status", "policy", "proposer", "seed_heldout", "pick_heldout", "lift",
               "heldout_rows", "failed_heldout_rows", "pick_id", "posthoc_id", "posthoc_lift", "rollouts", "proposals",
               "accepted", "wall_s", "optimize_s", "stop_reason", "run_id")


def _heldout_rows(run_dir: Path, candidate_id: str | None) -> pl.DataFrame | None:
    """A candidate's heldout rollouts, each marked `scored` (ok, with a reward) or not."""
    path = run_dir / "rollouts.parquet"
    if candidate_id is None or not path.exists():
        return None
    return pl.read_parquet(path, columns=["candidate_id", "stage", "status", "reward", "output"]).filter(
        (pl.col("candidate_id") == candidate_id) & (pl.col("stage") == "heldout")).with_columns(
        scored=(pl.col("status") == "ok") & pl.col("reward").is_not_null())


def _scored_rows(run_dir: Path, candidate_id: str | None) -> tuple[int, int]:
    """(heldout rows with a reward, heldout rows without one) of a candidate."""
    rows = _heldout_rows(run_dir, candidate_id)
    if rows is None:
        return 0, 0
    scored = rows["scored"].sum()
    return scored, rows.height - scored


def run_row(run_dir: Path) -> dict[str, Any]:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    spec, totals = manifest["spec"], manifest.get("totals", {})
    heldout = {h["candidate_id"]: h["heldout_score"] for h in manifest.get("heldout", [])}
    seed_id, pick_id = manifest.get("seed_candidate_id"), manifest.get("best_candidate_id")
    seed_score, pick_score = heldout.get(seed_id), heldout.get(pick_id)
    done = manifest["status"] == "done" and seed_score is not None and pick_score is not None
    scored, failed = _scored_rows(run_dir, pick_id)
    timings = manifest.get("timings", {})
    # a run that scored more candidates than its seed and pick on heldout (heldout_candidates):
    # the best of them all, which only a look at the test rows could choose (the pick where it ties)
    scored_on_heldout = {c: v for c, v in heldout.items() if v is not None}
    posthoc_id = max(scored_on_heldout, key=lambda c: (scored_on_heldout[c], c == pick_id)) \
        if done and set(scored_on_heldout) - {seed_id, pick_id} else None
    return {
        "task": spec["container"]["name"], "arm": spec["algorithm"]["name"], "seed": spec["seed"],
        "status": manifest["status"], "policy": spec["policy"]["model"], "proposer": spec["proposer"]["model"],
        "seed_heldout": seed_score, "pick_heldout": pick_score,
        "lift": (pick_score - seed_score) if done else None,
        "heldout_rows": scored, "failed_heldout_rows": failed, "pick_id": pick_id, "posthoc_id": posthoc_id,
        "posthoc_lift": scored_on_heldout[posthoc_id] - seed_score if posthoc_id is not None else None,
        "rollouts": totals.get("rollouts"), "proposals": totals.get("proposals"),
        "accepted": totals.get("proposals_accepted"), "wall_s": timings.get("wall_s"),
        "optimize_s": timings.get("optimize_s"), "stop_reason": manifest.get("stop_reason"),
        "run_id": manifest["run_id"],
    }


def top_answer(run_dir: Path, candidate_id: str | None) -> tuple[str, float] | None:
    """A candidate's most common answer on its scored heldout rows and its share of them: a
    lift that comes with one answer taking most rows moved the policy's base rate more than
    it taught it to tell cases apart."""
    rows = _heldout_rows(run_dir, candidate_id)
    answers = None if rows is None else rows.filter("scored")["output"].fill_null("").str.strip_chars()
    if answers is None or answers.is_empty():
        return None
    # a tie goes to the answer first in sort order, so a regenerated table is the same table
    counts = answers.value_counts(name="n").sort(["n", "output"], descending=[True, False])
    return counts[0, "output"], counts[0, "n"] / answers.len()


SHOWN_LINES = 12  # of a pick's changed lines, in the table's notes


def pick_changes(run_dir: Path, seed_id: str | None, pick_id: str | None) -> list[str]:
    """The lines the run's pick adds (+) or drops (-) against the seed prompt, per module."""
    path = run_dir / "candidates.parquet"
    if seed_id is None or pick_id is None or seed_id == pick_id or not path.exists():
        return []
    texts = {row["candidate_id"]: json.loads(row["modules_json"]) for row in
             pl.read_parquet(path, columns=["candidate_id", "modules_json"]).iter_rows(named=True)}
    seed, pick = texts.get(seed_id, {}), texts.get(pick_id, {})
    changed = []
    for module in sorted(set(seed) | set(pick)):
        diff = difflib.ndiff(seed.get(module, "").splitlines(), pick.get(module, "").splitlines())
        changed += [f"{module}: {line[:2]}{line[2:].strip()}" for line in diff
                    if line[:2] in ("+ ", "- ") and line[2:].strip()]
    return changed


def arm_settings(params: dict[str, Any], pool_rows: dict[str, int], stratified_by: dict[str, str],
                 heldout_candidates: Any, *, max_rollouts: Any) -> dict[str, Any]:
    """A run's settings that can make it another arm: its algorithm's params, the sizes of
    its pools (a run on more train rows is not the same arm), which candidates it scores on
    heldout (a run with the same seed is a run of its own) and its budget. The models are
    not among them: the table names the pairs its runs used."""
    return {**params, **{f"{pool}_rows": n for pool, n in sorted(pool_rows.items())},
            **{f"{pool}_stratified_by": field for pool, field in sorted(stratified_by.items())},
            "heldout_candidates": heldout_candidates, "max_rollouts": max_rollouts}


def _settings(run_dir: Path) -> dict[str, Any]:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    spec, used = manifest["spec"], pools_used(manifest)
    stratify = (spec.get("pools") or {}).get("stratify") or {}
    return arm_settings(spec["algorithm"].get("params") or {},
                        {pool: len(used[pool]) for pool in ("train", "pareto", "heldout") if pool in used},
                        {pool: strata["field"] for pool, strata in stratify.items()},
                        spec.get("heldout_candidates", "best"), max_rollouts=(spec.get("budget") or {}).get("max_rollouts"))


Reference = dict[tuple[str, str], dict[str, Any]]  # (task, algorithm) -> the settings of its default arm


def label_variants(rows: list[dict[str, Any]], settings: list[dict[str, Any]], reference: Reference) -> None:
    """Runs of one algorithm with different settings are different arms. Where the benchmark's
    default command plans the task and algorithm (`reference`), its runs keep the algorithm's
    name and every other arm is named by the settings in which it differs from them; else by
    the settings that differ among the runs. A setting a run's version did not have shows as
    `absent`."""
    by_arm: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows):
        by_arm.setdefault((row["task"], row["arm"]), []).append(i)
    for cell, members in by_arm.items():
        default = reference.get(cell)
        among = sorted({k for i in members for k in settings[i]})
        among = [k for k in among if len({_setting(settings[i], k) for i in members}) > 1]
        for i in members:
            differ = among if default is None else [k for k in sorted(set(settings[i]) | set(default))
                                                    if _setting(settings[i], k) != _setting(default, k)]
            if differ:
                rows[i]["arm"] += " (" + ", ".join(f"{k}={_setting(settings[i], k)}" for k in differ) + ")"


def _setting(params: dict[str, Any], key: str) -> str:
    value = params.get(key, "absent")
    return value if isinstance(value, str) else json.dumps(value)


def runs(sweep_dir: Path, reference: Reference | None = None) -> pl.DataFrame:
    dirs = [p.parent for p in sorted(sweep_dir.glob("*/manifest.json"))]
    rows = [run_row(d) for d in dirs]
    label_variants(rows, [_settings(d) for d in dirs], reference or {})
    schema = {c: pl.Float64 for c in ("seed_heldout", "pick_heldout", "lift", "posthoc_lift", "wall_s", "optimize_s")} | {
        c: pl.Int64 for c in ("seed", "heldout_rows", "failed_heldout_rows", "rollouts", "proposals", "accepted")}
    frame = pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None) if rows else pl.DataFrame(
        schema={c: schema.get(c, pl.Utf8) for c in RUN_COLUMNS})
    return frame.select(RUN_COLUMNS).sort("task", "arm", "seed")


def bootstrap_ci(values: list[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over `values` (fixed resample plan)."""
    data = np.asarray(values, dtype=float)
    if len(data) == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(BOOTSTRAP_RESAMPLES, len(data)))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def summary(per_run: pl.DataFrame) -> pl.DataFrame:
    out = []
    for (task, arm), cell in per_run.group_by("task", "arm", maintain_order=True):
        done = cell.filter(pl.col("lift").is_not_null()).sort("seed")
        lifts = done["lift"].to_list()
        lo, hi = bootstrap_ci(lifts) if lifts else (None, None)
        out.append({
            "task": task, "arm": arm, "seeds_done": len(lifts), "runs_not_done": cell.height - len(lifts),
            "lifts": ", ".join(f"s{s}: {v:+.3f}" for s, v in zip(done["seed"], lifts)),
            "seed_heldout_mean": done["seed_heldout"].mean(), "pick_heldout_mean": done["pick_heldout"].mean(),
            "lift_mean": float(np.mean(lifts)) if lifts else None, "lift_lo": lo, "lift_hi": hi,
            "posthoc_runs": done["posthoc_lift"].drop_nulls().len(), "posthoc_lift_mean": done["posthoc_lift"].mean(),
            "heldout_rows": done["heldout_rows"].min(), "rollouts_mean": done["rollouts"].mean(),
            "wall_s_mean": done["wall_s"].mean(),
        })
    return pl.DataFrame(out, infer_schema_length=None).sort("task", "arm") if out else pl.DataFrame()


def pick_notes(sweep_dir: Path, per_run: pl.DataFrame) -> list[str]:
    """Per finished optimizing run: what its pick changed in the seed prompt."""
    notes = []
    for row in per_run.filter((pl.col("arm") != "seed_only") & pl.col("lift").is_not_null()).iter_rows(named=True):
        run_dir = sweep_dir / row["run_id"]
        manifest = json.loads((run_dir / "manifest.json").read_text())
        changes = pick_changes(run_dir, manifest.get("seed_candidate_id"), row["pick_id"])
        head = f"- {row['task']} / {row['arm']} / seed {row['seed']}: pick `{row['pick_id']}`, lift {row['lift']:+.3f}"
        if row["posthoc_id"] is not None:
            head += f" (test-set selection: `{row['posthoc_id']}`, {row['posthoc_lift']:+.3f})"
        if not changes:
            notes.append(head + ": the seed prompt itself")
            continue
        spread = [top_answer(run_dir, manifest.get("seed_candidate_id")), top_answer(run_dir, row["pick_id"])]
        if None not in spread:
            head += "; most common heldout answer, seed -> pick: " + " -> ".join(
                f"`{answer[:40]}` {share:.0%}" for answer, share in spread)
        more = f" ({len(changes) - SHOWN_LINES} more lines changed)" if len(changes) > SHOWN_LINES else ""
        notes += [head + more] + [f"  - `` {line[:160]} ``" for line in changes[:SHOWN_LINES]]  # lines hold backticks
    return notes


def markdown(per_run: pl.DataFrame, cells: pl.DataFrame, title: str, notes: list[str] | None = None,
             named_from_default: bool = False) -> str:
    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    def posthoc(row: dict[str, Any]) -> str:
        if not row["posthoc_runs"]:
            return "-"
        of = f" ({row['posthoc_runs']} of {row['seeds_done']} runs)" if row["posthoc_runs"] < row["seeds_done"] else ""
        return f"{row['posthoc_lift_mean']:+.3f}{of}"

    models = per_run.select("policy", "proposer").unique().rows()
    lines = [f"# {title}", "",
             "Lift = heldout score of the run's own pick (chosen before any heldout row is seen) minus the seed "
             "prompt's, on the same heldout rows. Mean over seeds with a 95% percentile bootstrap interval over "
             "seeds; runs not `done` are counted apart, never as zero.", "",
             "Models (policy, proposer): " + "; ".join(f"{p}, {q}" for p, q in models), "",
             *(["An arm named by its algorithm alone runs what the default command runs (its algorithm settings, "
                "pool sizes, heldout candidates and budget); any other names the settings in which it differs from "
                "that (`absent`: a setting the run's version did not have).", ""]
               if named_from_default else []),
             "Test-set selection: where runs scored more candidates than their pick on heldout "
             "(`heldout_candidates`), the mean lift of the best of them on heldout, which only a look at the test "
             "rows could have chosen: not a result of the optimizer, but how far its pick fell short of the best "
             "candidate it had.", "",
             "| task | arm | seeds | per-seed lift | mean lift [95% CI] | seed -> pick (mean) | test-set selection | "
             "heldout rows | rollouts | wall (min) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in cells.iter_rows(named=True):
        ci = f"{num(row['lift_mean'], '+.3f')} [{num(row['lift_lo'], '+.3f')}, {num(row['lift_hi'], '+.3f')}]"
        note = f" (+{row['runs_not_done']} not done)" if row["runs_not_done"] else ""
        wall = None if row["wall_s_mean"] is None else row["wall_s_mean"] / 60
        lines.append(f"| {row['task']} | {row['arm']} | {row['seeds_done']}{note} | {row['lifts'] or '-'} | {ci} | "
                     f"{num(row['seed_heldout_mean'], '.3f')} -> {num(row['pick_heldout_mean'], '.3f')} | "
                     f"{posthoc(row)} | "
                     f"{num(row['heldout_rows'], 'd')} | {num(row['rollouts_mean'], '.0f')} | {num(wall, '.1f')} |")
    if notes:
        lines += ["", "## What each run's pick changed", "",
                  "Lines the pick adds (`+`) to the seed prompt or drops (`-`) from it, and the most common "
                  "answer on the heldout rows of seed and pick with its share: one answer on most rows is a "
                  "shift of the policy's base rate more than a lesson in telling cases apart.", "", *notes]
    return "\n".join(lines) + "\n"


def write(sweep_dir: Path, out_dir: Path, title: str, reference: Reference | None = None) -> pl.DataFrame:
    per_run = runs(sweep_dir, reference)
    cells = summary(per_run)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_run.write_parquet(out_dir / "runs.parquet")
    if cells.height:
        cells.write_parquet(out_dir / "summary.parquet")
    text = markdown(per_run, cells, title, pick_notes(sweep_dir, per_run), named_from_default=bool(reference)) \
        if cells.height else f"# {title}\n\nno runs yet\n"
    (out_dir / "summary.md").write_text(text)
    return cells
