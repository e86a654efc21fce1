"""What a report computes, as values: the options it was computed with and its frames.
Apart from pipeline.py so that the writers (markdown.py, charts.py) read frames without
importing the pipeline that calls them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import polars as pl

from benchmarks.report.conclusions import ChartPlan


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
    noise: pl.DataFrame  # the seed's run-to-run spread per (task, policy, seed rows)
    trace: pl.DataFrame  # a single run's optimization trace (empty for several runs)
    conclusions: pl.DataFrame  # one sentence per task and subject: chart titles and summary.md
    charts: ChartPlan
