"""A run's optimization trace as a pure ``LazyFrame -> LazyFrame`` function: what each candidate
scored when it was scored, against the optimization rollouts spent by then.

Definitions:

- spent: optimization rollouts (every stage but ``heldout``; ``refused`` rows never ran) in
  the order they were recorded (``seq``): the n-th such row has spent = n.
- pareto point (``kind = pareto``): a candidate's mean reward on the pareto pool (stages
  ``seed`` and ``pareto``), at the spent of its last pareto row; ``best_so_far`` is the running
  max of those means in spent order (the run's pick is the best pareto mean). A candidate with
  pareto rows was accepted onto the frontier (the seed is scored there first).
- minibatch point (``kind = minibatch``): a proposed candidate's mean reward on the minibatch it
  was judged on (its minibatch rows before its first pareto row), at the spent of the last of
  them; ``accepted`` when it went on to the pareto pool, else it was rejected on the minibatch.
- parent point (``kind = parent_minibatch``): the parent's score on that same minibatch (from
  proposals.parquet), at the child's spent: what the child had to beat.
- ``spent_total``: the run's optimization rollouts; heldout re-scoring comes after it.

Means are over rows with a reward (a failed rollout has none; ``n`` counts those with one).
"""

from __future__ import annotations

import polars as pl

HELDOUT = "heldout"
PARETO_STAGES = ("seed", "pareto")
TRACE_SCHEMA = {"run_id": pl.String, "kind": pl.String, "candidate_id": pl.String, "x": pl.Int64,
                "y": pl.Float64, "n": pl.Int64, "accepted": pl.Boolean, "is_seed": pl.Boolean,
                "is_pick": pl.Boolean, "best_so_far": pl.Float64, "spent_total": pl.Int64}


def optimization_rows(rollouts: pl.LazyFrame) -> pl.LazyFrame:
    return (rollouts.filter((pl.col("stage") != HELDOUT) & (pl.col("status") != "refused"))
            .with_columns(spent=(pl.int_range(pl.len(), dtype=pl.Int64) + 1).over("run_id", order_by="seq")))


def trace_points(rollouts: pl.LazyFrame, proposals: pl.LazyFrame, runs: pl.LazyFrame) -> pl.LazyFrame:
    rows = optimization_rows(rollouts)
    scored = dict(x=pl.col("spent").max(), y=pl.col("reward").mean(), n=pl.col("reward").count().cast(pl.Int64))
    pareto = (rows.filter(pl.col("stage").is_in(PARETO_STAGES))
              .group_by("run_id", "candidate_id").agg(first_seq=pl.col("seq").min(), **scored))
    judged = (rows.filter(~pl.col("stage").is_in(PARETO_STAGES))
              .join(pareto.select("run_id", "candidate_id", "first_seq"), on=["run_id", "candidate_id"], how="left")
              .filter(pl.col("first_seq").is_null() | (pl.col("seq") < pl.col("first_seq")))
              .join(runs.select("run_id", candidate_id="seed_candidate_id"), on=["run_id", "candidate_id"],
                    how="anti")
              .group_by("run_id", "candidate_id").agg(**scored)
              .join(pareto.select("run_id", "candidate_id", accepted=pl.lit(True)), on=["run_id", "candidate_id"],
                    how="left")
              .with_columns(pl.col("accepted").fill_null(False)))
    parents = (proposals.filter(pl.col("child_id").is_not_null())
               .select("run_id", candidate_id="child_id", y="parent_minibatch_score")
               .unique(["run_id", "candidate_id"], keep="first")
               .join(judged.select("run_id", "candidate_id", "x", "accepted"), on=["run_id", "candidate_id"]))
    points = pl.concat([
        pareto.select("run_id", pl.lit("pareto").alias("kind"), "candidate_id", "x", "y", "n",
                      accepted=pl.lit(True)),
        judged.select("run_id", pl.lit("minibatch").alias("kind"), "candidate_id", "x", "y", "n", "accepted"),
        parents.select("run_id", pl.lit("parent_minibatch").alias("kind"), "candidate_id", "x", "y",
                       n=pl.lit(None, pl.Int64), accepted="accepted"),
    ], how="vertical_relaxed")
    best = (pareto.select("run_id", "candidate_id", "x", "y")
            .with_columns(best_so_far=pl.col("y").fill_null(float("-inf")).cum_max()
                          .over("run_id", order_by=["x", "candidate_id"]))
            .select("run_id", "candidate_id", pl.lit("pareto").alias("kind"),
                    pl.when(pl.col("best_so_far").is_finite()).then(pl.col("best_so_far")).alias("best_so_far")))
    totals = rows.group_by("run_id").agg(spent_total=pl.col("spent").max())
    ids = runs.select("run_id", "seed_candidate_id", "pick_candidate_id")
    return (points.join(best, on=["run_id", "candidate_id", "kind"], how="left")
            .join(totals, on="run_id", how="left")
            .join(ids, on="run_id", how="left")
            .with_columns(is_seed=(pl.col("candidate_id") == pl.col("seed_candidate_id")).fill_null(False),
                          is_pick=(pl.col("candidate_id") == pl.col("pick_candidate_id")).fill_null(False))
            .select([pl.col(name).cast(dtype) for name, dtype in TRACE_SCHEMA.items()])
            .sort("run_id", "kind", "x", "candidate_id"))
