"""Evidence -> report: compute every frame (metrics.py) from lazy scans (io.py), then write
tables and charts. Computing and plotting are separate steps: ``compute_report`` returns
frames, ``write_report`` writes them and hands them to charts.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from benchmarks.report import io, metrics
from benchmarks.report.markdown import render_markdown

ENGINE = "streaming"


@dataclass(frozen=True)
class ReportOptions:
    k: int | None = None  # coverage through K; None: all candidates
    threshold: float = 1.0  # a row is solved when reward >= threshold
    task_thresholds: Mapping[str, float] = field(default_factory=dict)
    resamples: int = 1000
    ci_seed: int = 0
    level: float = 0.95


@dataclass(frozen=True)
class ReportFrames:
    axes: list[str]
    runs: pl.DataFrame  # one row per finished run with its metrics
    summary: pl.DataFrame  # one row per expected cell (task x stack x axes)
    curve_points: pl.DataFrame
    pareto_points: pl.DataFrame
    options: ReportOptions


@dataclass(frozen=True)
class ReportPaths:
    report_dir: str
    summary_parquet: str
    summary_json: str
    summary_md: str
    curve_points: str
    runs: str
    pareto_points: str
    charts: tuple[str, ...] = ()


def compute_report(sweep_dir: str, options: ReportOptions = ReportOptions()) -> ReportFrames:
    if options.k is not None and options.k < 1:
        raise io.ReportError(f"--k must be at least 1, got {options.k}")
    runs_df, axes = io.load_runs(sweep_dir, options.threshold, options.task_thresholds)
    runs = metrics.with_labels(runs_df.lazy(), axes)
    rollouts, candidates = io.scan_tables(sweep_dir, runs_df.filter("done")["run_id"].to_list())
    # The large scans: heldout scores first (small result), then both coverage curves in one pass.
    scored = metrics.scored_candidates(rollouts, candidates).collect(engine=ENGINE).lazy()
    heldout_curve, train_curve = (c.lazy() for c in pl.collect_all(
        [metrics.coverage_curve(rollouts, scored, runs, "heldout"),
         metrics.coverage_curve(rollouts, scored, runs, "train")], engine=ENGINE))
    best = metrics.run_best(scored, runs)
    per_run = metrics.run_metrics(runs, best, heldout_curve, train_curve, options.k).collect(engine=ENGINE)
    cell = metrics.cell_columns(axes)
    plan = metrics.resample_plan(per_run.group_by(cell).len()["len"].to_list(), options.resamples, options.ci_seed)
    stats = metrics.seed_summary(per_run.lazy(), plan, axes, level=options.level)
    points = metrics.pareto_points(scored, runs)
    shares = metrics.pareto_shares(points, runs, axes)
    summary, curves, points_df = pl.collect_all([
        metrics.summary(runs, stats, shares, axes, metrics.k_used(scored, options.k), level=options.level),
        metrics.curve_points(runs, scored, heldout_curve, train_curve),
        points.sort("task", "run_id", "candidate_id"),
    ], engine=ENGINE)
    per_run = per_run.select(*cell, "label", "seed", "run_id", "threshold", "n_candidates", "best_candidate_id",
                             *metrics.RUN_METRICS,
                             "policy_model", "proposer_model").sort(*cell, "seed", "run_id")
    return ReportFrames(axes=axes, runs=io.rounded(per_run), summary=io.rounded(summary),
                        curve_points=io.rounded(curves), pareto_points=io.rounded(points_df), options=options)


def write_report(sweep_dir: str, *, k: int | None = None, threshold: float = 1.0,
                 task_thresholds: Mapping[str, float] | None = None, out: str | None = None,
                 charts: bool = True, resamples: int = 1000, ci_seed: int = 0) -> ReportPaths:
    """Regenerate ``<sweep_dir>/report/`` (or ``out``) from the sweep's evidence alone. Per-task
    thresholds the sweep recorded (a container's `solved_threshold`) apply unless
    `task_thresholds` names the task."""
    per_task = {**io.recorded_thresholds(sweep_dir), **(task_thresholds or {})}
    options = ReportOptions(k=k, threshold=threshold, task_thresholds=dict(sorted(per_task.items())),
                            resamples=resamples, ci_seed=ci_seed)
    frames = compute_report(sweep_dir, options)
    out_dir = Path(out) if out else Path(sweep_dir) / "report"
    params = {"k": k, "threshold": threshold, "task_thresholds": dict(options.task_thresholds),
              "ci": f"percentile bootstrap over runs, {options.level:.0%}, {resamples} resamples, seed {ci_seed}",
              "axes": frames.axes}
    written = {
        "summary_parquet": io.write_parquet(frames.summary, out_dir / "summary.parquet"),
        "summary_json": io.write_json(frames.summary, out_dir / "summary.json", parameters=params),
        "summary_md": io.write_text(render_markdown(frames), out_dir / "summary.md"),
        "curve_points": io.write_parquet(frames.curve_points, out_dir / "curve_points.parquet"),
        "runs": io.write_parquet(frames.runs, out_dir / "runs.parquet"),
        "pareto_points": io.write_parquet(frames.pareto_points, out_dir / "pareto_points.parquet"),
    }
    chart_paths: list[Path] = []
    if charts:
        from benchmarks.report.charts import render_charts

        chart_paths = render_charts(frames.summary, frames.runs, frames.curve_points, frames.axes, out_dir)
    return ReportPaths(report_dir=str(out_dir), **{name: str(path) for name, path in written.items()},
                       charts=tuple(str(p) for p in chart_paths))
