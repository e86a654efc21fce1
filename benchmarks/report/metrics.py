"""The comparison's metrics as pure ``LazyFrame -> LazyFrame`` functions (no I/O, no row loops).

Inputs are the evidence tables (``rollouts``, ``candidates``, harness.evidence.schema) and a
``runs`` frame built by ``io.load_runs``: one row per expected run with ``run_id, task, stack,
seed, done, seed_candidate_id, threshold`` and one column per extra sweep axis.

Definitions (the published table's, made exact):

- candidate: a (run, candidate) with heldout rows scored (stage ``heldout``). Only these count
  for coverage, best and the Pareto front: a candidate never judged on heldout has no score.
- K: a run's candidates ordered by their creation ``index``; "the first K candidates" are the
  first K heldout-scored ones in that order (= indexes 0..K-1 when every candidate was scored).
- heldout coverage through K: distinct heldout task ids with ``reward >= threshold(task)`` by
  any of the first K candidates; denominator: the run's distinct heldout task ids.
- train coverage through K: the same over those candidates' optimization rows (stages seed,
  pareto, minibatch, plus reflection and library, the reference arm's stage); denominator: the
  run's distinct task ids in optimization rows of any candidate.
- pick heldout: the heldout mean of the run's own pick (the candidate its optimizer chose,
  on its pareto pool, before any heldout row was seen); pick lift = pick - seed. The headline.
- best heldout: max over candidates of the heldout mean reward: selection on the test set,
  an upper bound that no run could have picked; reported beside the pick, never instead.
  seed heldout: the seed candidate's heldout mean. lift = best - seed.
- every mean is over rows with a reward: failed rollouts have none and are left out, never
  zeros; ``pick/best/seed_heldout_n`` say how many rows a score rests on.
- found at: ``rollouts/cost_usd/elapsed_s_at_creation`` of the best candidate (lowest index on
  ties): what the optimizer had spent when it created it.
- joint Pareto front: points are candidates with (heldout mean up, cost at creation down,
  elapsed at creation down); a point is on the front unless another point of the same task is
  >= on heldout and <= on cost and time, strictly better on one. Unknown cost/time count as +inf.
  Per cell: number of front points and their share of the task's front (pooled over seeds).
- cells: task x stack x the sweep's other axes (for a folder of single runs, also ``config``:
  what differs between their resolved specs, harness/evidence/configs.py); seeds are replicates. Per cell the
  mean over runs and a 95% percentile bootstrap CI over runs (fixed resample plan); a cell with
  one run has no interval (``lo``/``hi`` null, flagged ``n=1``).
- seed noise floor: the same seed prompt on the same rows scores differently from run to run
  (a local model is not bit-reproducible under load). Over the runs of one task with the same
  policy model and the same heldout rows for the seed: ``noise_runs`` runs, the seed's heldout
  min/max/sd and ``noise_half_range`` = (max - min) / 2, the band around zero lift that a lift
  must clear. Unknown (null) with fewer than two runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import polars as pl

HELDOUT = "heldout"
TRAIN_STAGES = ("seed", "pareto", "minibatch", "reflection", "library")
RUN_METRICS = (
    "pick_heldout", "pick_lift", "best_heldout", "seed_heldout", "lift", "heldout_coverage", "heldout_rows", "train_coverage", "train_rows",
    "found_rollouts", "found_cost_usd", "found_elapsed_s", "seed_heldout_coverage", "seed_train_coverage",
    "pick_heldout_n", "best_heldout_n", "seed_heldout_n",
)
AT_CREATION = {"rollouts": "rollouts_at_creation", "cost_usd": "cost_usd_at_creation",
               "elapsed_s": "elapsed_s_at_creation"}
INF = float("inf")


def cell_columns(axes: Sequence[str]) -> list[str]:
    return ["task", "stack", *axes]


def with_labels(runs: pl.LazyFrame, axes: Sequence[str]) -> pl.LazyFrame:
    """A readable cell name for legends: ``stack`` or ``stack (axis=value, ...)``; an axis a run
    does not have (``-``) is left out, and the ``config`` axis is its value (what differs)."""
    if not axes:
        return runs.with_columns(label=pl.col("stack"))
    named = [pl.when(pl.col(a).is_not_null() & (pl.col(a) != "-"))
             .then(pl.col(a) if a == "config" else pl.concat_str([pl.lit(f"{a}="), pl.col(a)])) for a in axes]
    parts = pl.concat_str(named, separator=", ", ignore_nulls=True)
    return runs.with_columns(label=pl.when(parts.fill_null("") != "")
                             .then(pl.concat_str([pl.col("stack"), pl.lit(" ("), parts, pl.lit(")")]))
                             .otherwise(pl.col("stack")))


def scored_candidates(rollouts: pl.LazyFrame, candidates: pl.LazyFrame) -> pl.LazyFrame:
    """One row per heldout-scored candidate: heldout mean, creation costs and its rank ``k``."""
    heldout = (rollouts.filter(pl.col("stage") == HELDOUT)
               .group_by("run_id", "candidate_id")
               .agg(heldout_mean=pl.col("reward").mean(), heldout_n=pl.col("reward").count().cast(pl.Int64),
                    heldout_failed=pl.col("reward").null_count().cast(pl.Int64)))
    created = candidates.select("run_id", "candidate_id", "index", *AT_CREATION.values())
    return (heldout.join(created, on=["run_id", "candidate_id"], how="left")
            .with_columns(k=(pl.int_range(pl.len(), dtype=pl.Int64) + 1)
                          .over("run_id", order_by=["index", "candidate_id"])))


def coverage_curve(rollouts: pl.LazyFrame, scored: pl.LazyFrame, runs: pl.LazyFrame,
                   split: Literal["heldout", "train"]) -> pl.LazyFrame:
    """Rows solved by any of the first k candidates, for every k of each run.

    Each row is credited to the smallest k that solved it; the curve is the running sum."""
    stages = [HELDOUT] if split == "heldout" else list(TRAIN_STAGES)
    rows = rollouts.filter(pl.col("stage").is_in(stages)).select("run_id", "candidate_id", "task_id", "reward")
    denominators = rows.group_by("run_id").agg(rows=pl.col("task_id").n_unique().cast(pl.Int64))
    first_solved = (rows.join(runs.select("run_id", "threshold"), on="run_id")
                    .filter(pl.col("reward") >= pl.col("threshold"))
                    .join(scored.select("run_id", "candidate_id", "k"), on=["run_id", "candidate_id"])
                    .group_by("run_id", "task_id").agg(pl.col("k").min())
                    .group_by("run_id", "k").agg(new=pl.len().cast(pl.Int64)))
    return (scored.select("run_id", "k")
            .join(first_solved, on=["run_id", "k"], how="left")
            .with_columns(covered=pl.col("new").fill_null(0).cum_sum().over("run_id", order_by="k"))
            .join(denominators, on="run_id", how="left")
            .select("run_id", pl.lit(split).alias("split"), "k", "covered", pl.col("rows").fill_null(0)))


def coverage_through(curve: pl.LazyFrame, k: int | None) -> pl.LazyFrame:
    """Coverage through K per run (a run with fewer candidates keeps its final value);
    ``k=None`` means all candidates."""
    kept = curve if k is None else curve.filter(pl.col("k") <= k)
    return kept.group_by("run_id").agg(pl.col("covered").max(), pl.col("rows").max())


def run_best(scored: pl.LazyFrame, runs: pl.LazyFrame) -> pl.LazyFrame:
    """Best heldout per run, the seed's score, the lift and where the best was found."""
    order = dict(by=["heldout_mean", "index", "candidate_id"], descending=[True, False, False], nulls_last=True)
    best = scored.group_by("run_id").agg(
        best_heldout=pl.col("heldout_mean").max(),
        best_candidate_id=pl.col("candidate_id").sort_by(**order).first(),
        best_heldout_n=pl.col("heldout_n").sort_by(**order).first().cast(pl.Float64),
        n_candidates=pl.len().cast(pl.Int64),
        **{f"found_{name}": pl.col(col).sort_by(**order).first() for name, col in AT_CREATION.items()},
    )
    seed = (scored.join(runs.select("run_id", candidate_id="seed_candidate_id"), on=["run_id", "candidate_id"])
            .select("run_id", seed_heldout="heldout_mean", seed_heldout_n=pl.col("heldout_n").cast(pl.Float64)))
    pick = (scored.join(runs.select("run_id", candidate_id="pick_candidate_id"), on=["run_id", "candidate_id"])
            .select("run_id", pick_heldout="heldout_mean", pick_heldout_n=pl.col("heldout_n").cast(pl.Float64)))
    return (best.join(seed, on="run_id", how="left").join(pick, on="run_id", how="left")
            .with_columns(lift=pl.col("best_heldout") - pl.col("seed_heldout"),
                          pick_lift=pl.col("pick_heldout") - pl.col("seed_heldout"),
                          found_rollouts=pl.col("found_rollouts").cast(pl.Float64)))


def seed_rows(rollouts: pl.LazyFrame, runs: pl.LazyFrame) -> pl.LazyFrame:
    """Per run, which heldout rows the seed was scored on (a key) and how many."""
    return (rollouts.filter(pl.col("stage") == HELDOUT)
            .join(runs.select("run_id", candidate_id="seed_candidate_id"), on=["run_id", "candidate_id"])
            .group_by("run_id").agg(seed_rows_key=pl.col("task_id").unique().sort().str.join(","),
                                    seed_rows=pl.col("task_id").n_unique().cast(pl.Int64)))


NOISE_GROUP = ("task", "policy_model", "seed_rows_key")


def noise_floor(per_run: pl.LazyFrame, rows: pl.LazyFrame) -> pl.LazyFrame:
    """The seed's run-to-run spread per (task, policy model, seed heldout rows), one row per
    run with its group's figures; null where fewer than two runs share the group."""
    keyed = per_run.select("run_id", "task", "policy_model", "seed_heldout").join(rows, on="run_id", how="left")
    known = keyed.filter(pl.col("seed_heldout").is_not_null())
    two = pl.col("noise_runs") >= 2
    stats = (known.group_by(NOISE_GROUP).agg(
        noise_runs=pl.len().cast(pl.Int64), noise_min=pl.col("seed_heldout").min(),
        noise_max=pl.col("seed_heldout").max(), noise_sd=pl.col("seed_heldout").std())
        .with_columns(noise_half_range=pl.when(two).then((pl.col("noise_max") - pl.col("noise_min")) / 2),
                      noise_sd=pl.when(two).then(pl.col("noise_sd"))))
    return (keyed.join(stats, on=list(NOISE_GROUP), how="left", nulls_equal=True)
            .select("run_id", "seed_rows_key", "seed_rows", "noise_runs", "noise_min", "noise_max",
                    "noise_half_range", "noise_sd"))


def noise_groups(per_run: pl.LazyFrame) -> pl.LazyFrame:
    """One row per noise group (task, policy, seed rows), for tables and chart bands."""
    return (per_run.filter(pl.col("noise_runs").is_not_null())
            .group_by(NOISE_GROUP)
            .agg(pl.col("seed_rows", "noise_runs", "noise_min", "noise_max", "noise_half_range", "noise_sd").first(),
                 run_ids=pl.col("run_id").sort())
            .drop("seed_rows_key")
            .sort("task", "policy_model", "seed_rows", pl.col("run_ids").list.first(), nulls_last=True))


def pareto_points(scored: pl.LazyFrame, runs: pl.LazyFrame) -> pl.LazyFrame:
    """Every candidate as a point of its task's joint front, with ``on_front``."""
    points = scored.join(runs.select("run_id", "task"), on="run_id").select(
        "task", "run_id", "candidate_id", heldout="heldout_mean",
        cost=pl.col("cost_usd_at_creation").fill_null(INF), time=pl.col("elapsed_s_at_creation").fill_null(INF))
    other = points.select(pl.all().name.suffix("_o"))
    # pairs within a task only (an equi-join, not a cross join), then the dominance test
    dominated = (points.join(other, left_on="task", right_on="task_o")
        .filter(pl.col("heldout_o") >= pl.col("heldout"), pl.col("cost_o") <= pl.col("cost"),
                pl.col("time_o") <= pl.col("time"),
                (pl.col("heldout_o") > pl.col("heldout")) | (pl.col("cost_o") < pl.col("cost"))
                | (pl.col("time_o") < pl.col("time")))
        .select("run_id", "candidate_id").unique().with_columns(dominated=pl.lit(True)))
    return (points.join(dominated, on=["run_id", "candidate_id"], how="left")
            .with_columns(on_front=pl.col("dominated").is_null()).drop("dominated"))


def pareto_shares(points: pl.LazyFrame, runs: pl.LazyFrame, axes: Sequence[str]) -> pl.LazyFrame:
    """Front points per cell and their share of the task's front."""
    cell = cell_columns(axes)
    front = points.filter("on_front").join(runs.select("run_id", *cell[1:]), on="run_id")
    return (front.group_by(cell).agg(pareto_points=pl.len().cast(pl.Int64))
            .with_columns(pareto_share=pl.col("pareto_points") / pl.col("pareto_points").sum().over("task")))


def run_metrics(runs: pl.LazyFrame, best: pl.LazyFrame, heldout_curve: pl.LazyFrame,
                train_curve: pl.LazyFrame, k: int | None) -> pl.LazyFrame:
    """One row per finished run with every per-run metric (the input to the seed summary)."""
    def through(curve: pl.LazyFrame, name: str) -> pl.LazyFrame:
        first = curve.filter(pl.col("k") == 1).select("run_id", pl.col("covered").alias(f"seed_{name}_coverage"))
        return (coverage_through(curve, k).rename({"covered": f"{name}_coverage", "rows": f"{name}_rows"})
                .join(first, on="run_id", how="left"))

    return (runs.filter("done")
            .join(best, on="run_id", how="left")
            .join(through(heldout_curve, "heldout"), on="run_id", how="left")
            .join(through(train_curve, "train"), on="run_id", how="left")
            .with_columns(pl.col(c).cast(pl.Float64) for c in (
                "heldout_coverage", "heldout_rows", "train_coverage", "train_rows",
                "seed_heldout_coverage", "seed_train_coverage")))


def resample_plan(sizes: Iterable[int], resamples: int = 1000, seed: int = 0) -> pl.LazyFrame:
    """Bootstrap draws (n, b, slot -> pos): resample b of a cell with n runs takes, in each
    slot, the run at position pos. Seeded per n, so a cell's CI does not depend on others."""
    parts = []
    for n in sorted(set(sizes)):
        draws = np.random.default_rng([seed, n]).integers(0, n, size=(resamples, n))
        parts.append(pl.DataFrame({
            "n": np.full(resamples * n, n, dtype=np.int64),
            "b": np.repeat(np.arange(resamples, dtype=np.int64), n),
            "pos": draws.ravel().astype(np.int64),
        }))
    empty = pl.DataFrame(schema={"n": pl.Int64, "b": pl.Int64, "pos": pl.Int64})
    return pl.concat([empty, *parts]).lazy()


def seed_summary(per_run: pl.LazyFrame, plan: pl.LazyFrame, axes: Sequence[str],
                 metrics: Sequence[str] = RUN_METRICS, level: float = 0.95) -> pl.LazyFrame:
    """Mean and percentile bootstrap CI over a cell's runs for each metric."""
    cell = cell_columns(axes)
    ranked = per_run.with_columns(
        n=pl.len().over(cell).cast(pl.Int64),
        pos=pl.int_range(pl.len(), dtype=pl.Int64).over(cell, order_by=["seed", "run_id"]))
    means = ranked.group_by(cell).agg(pl.len().cast(pl.Int64).alias("n_runs"),
                                      *[pl.col(m).mean().alias(f"{m}_mean") for m in metrics])
    tail = (1.0 - level) / 2
    resampled = (ranked.join(plan, on=["n", "pos"])
                 .group_by(*cell, "b").agg(pl.col(m).mean() for m in metrics)
                 .group_by(cell).agg(
                     *[pl.col(m).quantile(tail, interpolation="linear").alias(f"{m}_lo") for m in metrics],
                     *[pl.col(m).quantile(1 - tail, interpolation="linear").alias(f"{m}_hi") for m in metrics]))
    single = pl.col("n_runs") == 1  # one run: no interval, never the value itself dressed as one
    bounds = [pl.when(~single).then(pl.col(f"{m}_{s}")).alias(f"{m}_{s}") for m in metrics for s in ("lo", "hi")]
    return means.join(resampled, on=cell, how="left", nulls_equal=True).with_columns(bounds)


def summary(runs: pl.LazyFrame, stats: pl.LazyFrame, shares: pl.LazyFrame, axes: Sequence[str],
            k_used: pl.LazyFrame, per_run: pl.LazyFrame, metrics: Sequence[str] = RUN_METRICS,
            level: float = 0.95) -> pl.LazyFrame:
    """One row per expected cell; cells without a finished run are kept with status ``missing``.
    The seed noise floor of a cell is the widest of its runs' groups (the same one, normally)."""
    cell = cell_columns(axes)
    noise = per_run.group_by(cell).agg(pl.col("noise_runs", "noise_half_range", "noise_sd").max())
    cells = runs.group_by(cell).agg(
        pl.col("label").first(), pl.col("threshold").first(),
        n_expected=pl.len().cast(pl.Int64), n_failed=(pl.col("status") == "failed").sum().cast(pl.Int64),
        policy_model=pl.col("policy_model").drop_nulls().sort().first(),
        proposer_model=pl.col("proposer_model").drop_nulls().sort().first())
    stat_columns = [f"{m}_{s}" for m in metrics for s in ("mean", "lo", "hi")]
    out = (cells.join(stats, on=cell, how="left", nulls_equal=True)
           .join(shares, on=cell, how="left", nulls_equal=True)
           .join(noise, on=cell, how="left", nulls_equal=True)
           .join(k_used, how="cross")
           .with_columns(n_runs=pl.col("n_runs").fill_null(0)))
    has_runs = pl.col("n_runs") > 0
    return out.with_columns(
        status=pl.when(~has_runs).then(pl.lit("missing"))
        .when(pl.col("n_runs") < pl.col("n_expected")).then(pl.lit("partial")).otherwise(pl.lit("ok")),
        ci=pl.when(~has_runs).then(pl.lit("none")).when(pl.col("n_runs") == 1).then(pl.lit("n=1, no CI"))
        .otherwise(pl.lit(f"bootstrap{round(level * 100)}")),
        pareto_points=pl.when(has_runs).then(pl.col("pareto_points").fill_null(0)),
        pareto_share=pl.when(has_runs).then(pl.col("pareto_share").fill_null(0.0)),
    ).select(*cell, "label", "status", "n_expected", "n_runs", "n_failed", "ci", "k", "threshold",
             *stat_columns, "noise_runs", "noise_half_range", "noise_sd", "pareto_points", "pareto_share",
             "policy_model", "proposer_model").sort(cell, nulls_last=True)


def k_used(scored: pl.LazyFrame, k: int | None) -> pl.LazyFrame:
    """The K reported in the table: the requested one, else the most candidates of any run."""
    if k is not None:
        return pl.LazyFrame({"k": [k]}, schema={"k": pl.Int64})
    return scored.select(pl.col("k").max().fill_null(0).cast(pl.Int64))


def curve_points(runs: pl.LazyFrame, scored: pl.LazyFrame, heldout_curve: pl.LazyFrame,
                 train_curve: pl.LazyFrame, best: pl.LazyFrame) -> pl.LazyFrame:
    """Long-format points for every chart curve: coverage against K, and best-so-far heldout
    (and its lift over the run's own seed) against rollouts, cost and elapsed time at creation."""
    coverage = [c.select("run_id", metric=pl.concat_str([pl.col("split"), pl.lit("_coverage")]),
                         x_name=pl.lit("K"), x=pl.col("k").cast(pl.Float64), y=pl.col("covered").cast(pl.Float64))
                for c in (heldout_curve, train_curve)]
    # each run's line goes on to where its search ended: a run that scored only its seed and
    # its pick on heldout would otherwise end at the pick's creation, a spike
    ends = scored.group_by("run_id").agg(pl.col("heldout_mean").max().alias("y"),
                                         *(pl.col(col).max().alias(name) for name, col in AT_CREATION.items()))
    ends = ends.join(runs.select("run_id", *(f"end_{name}" for name in AT_CREATION)), on="run_id")
    best_points = [pl.concat([
        scored.select("run_id", metric=pl.lit("best_heldout"), x_name=pl.lit(name), x=pl.col(col).cast(pl.Float64),
                      y=pl.col("heldout_mean").cum_max().over("run_id", order_by=[col, "index", "candidate_id"])),
        ends.select("run_id", metric=pl.lit("best_heldout"), x_name=pl.lit(name),
                    x=pl.max_horizontal(pl.col(name).cast(pl.Float64), f"end_{name}"), y="y"),
    ]) for name, col in AT_CREATION.items()]
    seeds = best.select("run_id", "seed_heldout")
    lift = [frame.join(seeds, on="run_id").select(
        "run_id", metric=pl.lit("best_heldout_lift"), x_name="x_name", x="x", y=pl.col("y") - pl.col("seed_heldout"))
        for frame in best_points]
    return (pl.concat([*coverage, *best_points, *lift])
            .join(runs.select("run_id", "stack", "task"), on="run_id")
            .select("stack", "task", run="run_id", metric="metric", x_name="x_name", x="x", y="y")
            .sort("stack", "task", "run", "metric", "x_name", "x", "y"))
