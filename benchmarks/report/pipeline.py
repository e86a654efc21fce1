"""Evidence -> report: compute every frame (metrics.py) from lazy scans (io.py), then write
tables and charts. Computing and plotting are separate steps: ``compute_report`` returns
frames, ``write_report`` writes them and hands them to charts.py."""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from benchmarks.report import conclusions, io, metrics, trace
from benchmarks.report.chart_worker import ChartWorker
from benchmarks.report.frames import ReportFrames, ReportOptions
from benchmarks.report.markdown import render_markdown
from harness.evidence import remote
from harness.evidence.reader import recorded_thresholds
from harness.evidence.uri import is_uri, joined, shown

ENGINE = "streaming"


@dataclass(frozen=True)
class ReportPaths:
    report_dir: str
    summary_parquet: str
    summary_json: str
    summary_md: str
    curve_points: str
    runs: str
    pareto_points: str
    noise: str
    trace_points: str | None = None
    charts: tuple[str, ...] = ()


def compute_report(path: str, options: ReportOptions = ReportOptions()) -> ReportFrames:
    """The report of ``path``: a sweep, a folder of single runs (evidence/local), or one run."""
    if options.k is not None and options.k < 1:
        raise io.ReportError(f"--k must be at least 1, got {options.k}")
    target = io.locate(path)
    runs_df, axes = io.load_runs(target, options.threshold, options.task_thresholds)
    runs = metrics.with_labels(runs_df.lazy(), axes)
    done = runs_df.filter("done")["run_id"].to_list()
    tables = io.scan_tables(target.root, done)
    rollouts = tables.rollouts
    # The large scans: heldout scores first (small result), then both coverage curves in one pass.
    scored = metrics.scored_candidates(rollouts, tables.candidates).collect(engine=ENGINE).lazy()
    heldout_curve, train_curve, seed_rows = (c.lazy() for c in pl.collect_all(
        [metrics.coverage_curve(rollouts, scored, runs, "heldout"),
         metrics.coverage_curve(rollouts, scored, runs, "train"),
         metrics.seed_rows(rollouts, runs)], engine=ENGINE))
    best = metrics.run_best(scored, runs)
    per_run = metrics.run_metrics(runs, best, heldout_curve, train_curve, options.k).collect(engine=ENGINE)
    per_run = per_run.join(metrics.noise_floor(per_run.lazy(), seed_rows).collect(), on="run_id", how="left")
    cell = metrics.cell_columns(axes)
    plan = metrics.resample_plan(per_run.group_by(cell).len()["len"].to_list(), options.resamples, options.ci_seed)
    stats = metrics.seed_summary(per_run.lazy(), plan, axes, level=options.level)
    points = metrics.pareto_points(scored, runs)
    shares = metrics.pareto_shares(points, runs, axes)
    traced = trace.trace_points(rollouts, tables.proposals, runs) if len(done) == 1 else \
        pl.LazyFrame(schema=trace.TRACE_SCHEMA)
    summary, curves, points_df, noise, trace_df = pl.collect_all([
        metrics.summary(runs, stats, shares, axes, metrics.k_used(scored, options.k), per_run.lazy(),
                        level=options.level),
        metrics.curve_points(runs, scored, heldout_curve, train_curve, best),
        points.sort("task", "run_id", "candidate_id"),
        metrics.noise_groups(per_run.lazy()),
        traced,
    ], engine=ENGINE)
    per_run = per_run.select(*cell, "label", "seed", "run_id", "threshold", "n_candidates", "seed_candidate_id",
                             "pick_candidate_id", "best_candidate_id", *metrics.RUN_METRICS, "seed_rows",
                             "noise_runs", "noise_half_range", "noise_sd",
                             "policy_model", "proposer_model").sort(*cell, "seed", "run_id")
    summary, per_run, curves = io.rounded(summary), io.rounded(per_run), io.rounded(curves)
    trace_df = io.rounded(trace_df)
    return ReportFrames(axes=axes, runs=per_run, summary=summary, curve_points=curves,
                        pareto_points=io.rounded(points_df), options=options, noise=io.rounded(noise), trace=trace_df,
                        conclusions=conclusions.conclude(summary, per_run, trace_df),
                        charts=conclusions.plan_charts(summary, per_run, curves, axes))


def write_report(sweep_dir: str, *, k: int | None = None, threshold: float = 1.0,
                 task_thresholds: Mapping[str, float] | None = None, out: str | None = None,
                 charts: bool = True, resamples: int = 1000, ci_seed: int = 0,
                 chart_worker: bool | None = None) -> ReportPaths:
    """Regenerate ``<sweep_dir>/report/`` (or ``out``) from the evidence alone; ``sweep_dir`` may
    also be one run's directory (a report of that run). Per-task thresholds the sweep recorded
    (a container's `solved_threshold`) apply unless `task_thresholds` names the task.
    `chart_worker`: draw about half of a sweep's charts in a second process (default: when a
    core is to spare); the files are the same either way. Evidence on an object store
    (`s3://...`) is read from a local mirror, and its report (unless `out`) goes beside it."""
    if is_uri(sweep_dir):
        local = remote.mirror(sweep_dir)
        paths = write_report(str(local), k=k, threshold=threshold, task_thresholds=task_thresholds,
                             out=out or str(local / "report"), charts=charts, resamples=resamples, ci_seed=ci_seed,
                             chart_worker=chart_worker)
        if out is not None:
            return paths
        report_uri = joined(sweep_dir, "report")
        remote.upload(local / "report", report_uri)
        return dataclasses.replace(paths, report_dir=shown(report_uri))
    target = io.locate(sweep_dir)
    per_task = {**recorded_thresholds(target.root), **(task_thresholds or {})}
    options = ReportOptions(k=k, threshold=threshold, task_thresholds=dict(sorted(per_task.items())),
                            resamples=resamples, ci_seed=ci_seed)
    # matplotlib's import (half a second to a second) overlaps the compute, which releases the GIL, in
    # this process and in a second one that draws about half of a sweep's charts meanwhile
    worker = ChartWorker.start(chart_worker) if charts and target.run_ids is None else None
    if charts:
        loader = threading.Thread(target=importlib.import_module, args=("benchmarks.report.charts",), daemon=True)
        loader.start()
    try:
        frames = compute_report(sweep_dir, options)
        out_dir = Path(out) if out else Path(sweep_dir) / "report"
        if charts:
            loader.join()
            mine = _send_share(frames, out_dir, worker)  # the worker draws while the tables are written
        written = _write_tables(frames, out_dir, {
            "k": k, "threshold": threshold, "task_thresholds": dict(options.task_thresholds),
            "ci": f"percentile bootstrap over runs, {options.level:.0%}, {resamples} resamples, seed {ci_seed}",
            "axes": frames.axes})
        chart_paths = _draw_charts(frames, out_dir, mine, worker) if charts else []
    finally:
        if worker is not None:
            worker.close()
    return ReportPaths(report_dir=str(out_dir), **{name: str(path) for name, path in written.items()},
                       charts=tuple(str(p) for p in chart_paths))


def _write_tables(frames: ReportFrames, out_dir: Path, params: dict[str, object]) -> dict[str, Path]:
    written = {
        "summary_parquet": io.write_parquet(frames.summary, out_dir / "summary.parquet"),
        "summary_json": io.write_json(frames.summary, out_dir / "summary.json", parameters=params,
                                      conclusions=frames.conclusions["text"].to_list()),
        "summary_md": io.write_text(render_markdown(frames), out_dir / "summary.md"),
        "curve_points": io.write_parquet(frames.curve_points, out_dir / "curve_points.parquet"),
        "runs": io.write_parquet(frames.runs, out_dir / "runs.parquet"),
        "pareto_points": io.write_parquet(frames.pareto_points, out_dir / "pareto_points.parquet"),
        "noise": io.write_parquet(frames.noise, out_dir / "noise_floor.parquet"),
    }
    if frames.trace.height:
        written["trace_points"] = io.write_parquet(frames.trace, out_dir / "trace_points.parquet")
    return written


def _send_share(frames: ReportFrames, out_dir: Path, worker: ChartWorker | None) -> tuple[str, ...]:
    """Hand the worker its share of the plan's charts (none without a worker); the rest, this
    process's share, is returned."""
    from benchmarks.report.charts import remove_stale_charts, split_charts

    remove_stale_charts(frames, out_dir)
    drawn = frames.charts.drawn
    mine, theirs = split_charts(drawn) if worker is not None else (tuple(drawn), ())
    if theirs:
        worker.send(frames, out_dir, theirs)  # type: ignore[union-attr]
    return mine


def _draw_charts(frames: ReportFrames, out_dir: Path, mine: tuple[str, ...], worker: ChartWorker | None) -> list[Path]:
    """This process's share of the charts, then the worker's paths; in the plan's order."""
    from benchmarks.report.charts import draw

    drawn = frames.charts.drawn
    paths = draw(frames, out_dir, mine) + (worker.paths() if worker is not None else [])
    order = {name: i for i, name in enumerate(drawn)}
    return sorted(paths, key=lambda p: (order[p.stem], p.suffix != ".png"))
