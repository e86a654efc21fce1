"""Charts from computed frames only (ReportFrames): plotting never touches evidence.

Every chart of a report takes its colours from one palette (style.palette over the report's
cell labels), draws each run against its own seed (lift = score - that run's seed), shows the
seed noise floor, and titles each panel with the sentence conclusions.py computed. A single
run gets its optimization trace (trace_chart.py) instead of sweep-shaped charts;
``build_charts`` returns the figures (tests inspect them), ``render_charts`` saves them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from benchmarks.report import style
from benchmarks.report.conclusions import SWEEP_CHARTS, proposer_column, sentence, task_noise
from benchmarks.report.trace_chart import trace_figure

if TYPE_CHECKING:
    from benchmarks.report.frames import ReportFrames

PICK_LIFT = "pick heldout - this run's seed heldout (lift)"
BEST_LIFT = "best heldout so far - this run's seed heldout\n(picked on heldout: test-set selection)"


def _rows(summary: pl.DataFrame, task: str) -> list[dict[str, Any]]:
    return summary.filter(pl.col("task") == task).sort("label").to_dicts()


def _band(ax: Axes, summary: pl.DataFrame, task: str) -> None:
    style.noise_band(ax, *task_noise([r for r in _rows(summary, task) if r["n_runs"] > 0]))


MARKED_RUNS = 12  # a panel with more runs draws lines without a marker per candidate


def _run_lines(ax: Axes, data: pl.DataFrame, colours: dict[str, str]) -> None:
    """One step line per run, coloured by its cell. A cell's runs are one artist (runs apart
    by a NaN break): with a hundred runs, drawing per artist, not per point, was the cost.
    Past MARKED_RUNS runs the candidate markers only blot the lines, and cost the most."""
    marker = "o" if data["run"].n_unique() <= MARKED_RUNS else None
    for (label,), cell in data.group_by("label", maintain_order=True):
        xs: list[float] = []
        ys: list[float] = []
        for _, points in cell.group_by("run", maintain_order=True):
            if xs:
                xs.append(float("nan"))
                ys.append(float("nan"))
            xs += points["x"].to_list()
            ys += points["y"].to_list()
        ax.step(xs, ys, where="post", color=colours[str(label)], alpha=0.85, linewidth=1.6, marker=marker,
                markersize=3.5, label=str(label))


def _curves(frames: ReportFrames, task: str, metric: str, x_name: str) -> pl.DataFrame:
    return (frames.curve_points.filter((pl.col("task") == task) & (pl.col("metric") == metric)
                                       & (pl.col("x_name") == x_name))
            .join(frames.runs.select(run="run_id", label="label"), on="run").sort("label", "run", "x", "y"))


def coverage_figure(frames: ReportFrames, colours: dict[str, str]) -> Figure:
    tasks = sorted(set(frames.summary["task"]))
    fig, axes = style.figure(2 * len(tasks), ncols=2)
    for i, task in enumerate(tasks):
        for j, split in enumerate(("heldout", "train")):
            ax = axes[2 * i + j]
            data = _curves(frames, task, f"{split}_coverage", "K")
            rows = frames.summary.filter(pl.col("task") == task)[f"{split}_rows_mean"].drop_nulls()
            most = float(rows.max()) if len(rows) else float(data["y"].max() or 1)  # type: ignore[arg-type]
            _run_lines(ax, data, colours)
            style.count_axis(ax, "x", 1, float(data["x"].max() or 1))  # type: ignore[arg-type]
            style.count_axis(ax, "y", 0, most)
            ax.set(xlabel="K: first K heldout-scored candidates, in creation order (count; K=1 is the seed)",
                   ylabel=f"{split} rows solved by any of them (count)")
            style.title(ax, sentence(frames.conclusions, task, "coverage") if split == "heldout"
                        else f"{task}: train rows solved (of {most:g} rows per run at most)")
    style.figure_legend(fig, axes, "lower right")
    style.suptitle(fig, "Rows solved by any of the first K candidates")
    return fig


def best_figure(frames: ReportFrames, colours: dict[str, str], x_name: str, xlabel: str) -> Figure:
    tasks = sorted(set(frames.summary["task"]))
    fig, axes = style.figure(len(tasks), ncols=min(len(tasks), 2) or 1)
    for ax, task in zip(axes, tasks):
        data = _curves(frames, task, "best_heldout_lift", x_name)
        _band(ax, frames.summary, task)
        _run_lines(ax, data, colours)
        style.lift_axis(ax, data["y"].to_list(), BEST_LIFT)
        if x_name == "rollouts":
            style.count_axis(ax, "x", 0, float(data["x"].max() or 0))  # type: ignore[arg-type]
        ax.set_xlabel(xlabel)
        style.title(ax, sentence(frames.conclusions, task, "best"))
    style.figure_legend(fig, axes)
    style.suptitle(fig, f"Best candidate on heldout so far, against its own seed, by {xlabel.split(' (')[0]}")
    return fig


def _cell_errors(row: dict[str, Any]) -> list[list[float]] | None:
    mean, lo, hi = row["pick_lift_mean"], row["pick_lift_lo"], row["pick_lift_hi"]
    if lo is None or hi is None:
        return None
    return [[max(mean - lo, 0.0)], [max(hi - mean, 0.0)]]


def _cell(ax: Axes, x: float, row: dict[str, Any], runs: pl.DataFrame, colour: str, bar: bool) -> list[float]:
    """A cell's mean pick lift (bar or point) with its CI, and each run as a dot; returns the
    values drawn (for the axis range)."""
    mean = row["pick_lift_mean"]
    mine = (runs.filter((pl.col("task") == row["task"]) & (pl.col("label") == row["label"]))
            .sort("seed", "run_id")["pick_lift"].drop_nulls().to_list())
    errors = _cell_errors(row)
    if bar:
        ax.bar([x], [mean], width=0.6, color=colour, alpha=0.85, zorder=2, label=row["label"],
               yerr=errors, capsize=5)
    else:
        ax.errorbar([x], [mean], yerr=errors, color=colour, marker="o", markersize=7, capsize=4, linewidth=1.6,
                    zorder=3, label=row["label"])
    ax.scatter([x + d for d in style.spread(len(mine))], mine, s=14, color="black", alpha=0.6, zorder=4,
               linewidths=0)
    note = f"{mean:+.3f}" + ("" if row["n_runs"] > 1 else " (n=1)")
    if bar:  # above a gain, below a loss, clear of the interval
        edge = (row["pick_lift_hi"] if mean >= 0 else row["pick_lift_lo"]) if errors else mean
        ax.annotate(note, (x, edge), xytext=(0, 4 if mean >= 0 else -4), textcoords="offset points", fontsize=8,
                    ha="center", va="bottom" if mean >= 0 else "top")
    else:  # right of the run dots
        ax.annotate(note, (x + 0.2, mean), xytext=(3, 0), textcoords="offset points", fontsize=8, va="center")
    return [mean, *mine, *[v for v in (row["pick_lift_lo"], row["pick_lift_hi"]) if v is not None]]


def _ci_note(summary: pl.DataFrame, what: str = "points") -> str:
    if int(summary["n_runs"].max() or 0) < 2:  # type: ignore[arg-type]
        return f"{what}: one run per cell, no CI"
    return f"{what}: mean over seeds, 95% bootstrap CI where n > 1"


def proposer_figure(frames: ReportFrames, colours: dict[str, str]) -> Figure:
    """Pick lift per proposer: one point per cell at its proposer, connected per series."""
    column = proposer_column(frames.axes)
    tasks = sorted(set(frames.summary["task"]))
    fig, axes = style.figure(len(tasks), ncols=min(len(tasks), 2) or 1)
    for ax, task in zip(axes, tasks):
        rows = [r for r in _rows(frames.summary, task) if r["n_runs"] > 0 and r["pick_lift_mean"] is not None]
        xs = sorted({str(r[column]) for r in rows})
        _band(ax, frames.summary, task)
        drawn: list[float] = []
        series: dict[str, list[tuple[int, float]]] = {}
        for row in rows:
            x = xs.index(str(row[column]))
            drawn += _cell(ax, x, row, frames.runs, colours[row["label"]], bar=False)
            key = "|".join([row["stack"], *[str(row[a]) for a in frames.axes if a not in ("proposer", "config")]])
            series.setdefault(key, []).append((x, row["pick_lift_mean"]))
        for points in series.values():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], color="0.6", linewidth=1.0, zorder=2)
        ax.set_xticks(range(len(xs)), xs, rotation=15 if len(xs) > 2 else 0)
        ax.set_xlim(-0.6, len(xs) - 0.4)
        style.lift_axis(ax, drawn, PICK_LIFT)
        ax.set_xlabel("proposer model (dots: single runs)")
        style.title(ax, sentence(frames.conclusions, task, "lift"))
    style.figure_legend(fig, axes)
    style.suptitle(fig, f"Proposer scaling: each run's pick against its own seed ({_ci_note(frames.summary)})")
    return fig


def same_container_figure(frames: ReportFrames, colours: dict[str, str]) -> Figure:
    """Pick lift per cell on the same container, runs as dots, the seed noise band around 0."""
    tasks = sorted(set(frames.summary["task"]))
    most = max([frames.summary.filter(pl.col("task") == t).height for t in tasks] or [1])
    fig, axes = style.figure(len(tasks), ncols=min(len(tasks), 2) or 1, width=max(6.4, 1.1 * most))
    standing = False
    for ax, task in zip(axes, tasks):
        rows = _rows(frames.summary, task)
        _band(ax, frames.summary, task)
        drawn: list[float] = []
        for x, row in enumerate(rows):
            if row["n_runs"] == 0 or row["pick_lift_mean"] is None:
                ax.annotate("missing", (x, 0.0), ha="center", va="bottom", fontsize=8, color=style.SEED_GREY)
                continue
            drawn += _cell(ax, x, row, frames.runs, colours[row["label"]], bar=True)
        ticks = [style.wrapped(r["label"], style.TICK_CHARS) for r in rows]
        upright = max((t.count("\n") for t in ticks), default=0) >= 2  # long labels stand, side by side
        standing = standing or upright
        ax.set_xticks(range(len(rows)), ticks, rotation=90 if upright else 20 if most > 2 else 0,
                      ha="right" if most > 2 and not upright else "center", fontsize=8)
        ax.set_xlim(-0.6, len(rows) - 0.4)
        style.lift_axis(ax, drawn, PICK_LIFT)
        style.title(ax, sentence(frames.conclusions, task, "lift"))
    if standing:  # room for the standing labels below the panels
        fig.set_figheight(fig.get_figheight() + style.TICK_CHARS * style.KEY_LINE_IN * 0.6)
    style.figure_legend(fig, axes)
    style.suptitle(fig, f"Same container: each run's pick against its own seed ({_ci_note(frames.summary, 'bars')}; "
                        "dots: runs)")
    return fig


def build_charts(frames: ReportFrames, names: Sequence[str] | None = None) -> dict[str, Figure]:
    """The figures the chart plan draws (or those of them in `names`), all coloured from one
    palette."""
    colours = style.palette(frames.summary["label"].drop_nulls().to_list())
    builders = {
        "trace": lambda: trace_figure(frames, colours),
        "coverage": lambda: coverage_figure(frames, colours),
        "best_vs_rollouts": lambda: best_figure(frames, colours, "rollouts", "rollouts at creation (count)"),
        "best_vs_cost_usd": lambda: best_figure(frames, colours, "cost_usd", "cumulative cost at creation (USD)"),
        "proposer_scaling": lambda: proposer_figure(frames, colours),
        "same_container": lambda: same_container_figure(frames, colours),
    }
    return {name: builders[name]() for name in frames.charts.drawn if names is None or name in names}


# Relative drawing time of each chart (build and save, 20 cells; median CPU of rounds 2 to 4
# of four in one process): what split_charts balances.
DRAW_COST = {"trace": 3.0, "coverage": 3.0, "best_vs_rollouts": 2.2, "best_vs_cost_usd": 2.2,
             "same_container": 1.9, "proposer_scaling": 1.0}


def split_charts(names: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Two shares of about equal drawing time (largest first, each to the lighter share); a
    single chart is all in the first."""
    shares: tuple[list[str], list[str]] = ([], [])
    cost = [0.0, 0.0]
    for name in sorted(names, key=lambda n: -DRAW_COST.get(n, 2.0)):
        lighter = 0 if cost[0] <= cost[1] else 1
        shares[lighter].append(name)
        cost[lighter] += DRAW_COST.get(name, 2.0)
    return tuple(shares[0]), tuple(shares[1])


def draw(frames: ReportFrames, out_dir: Path, names: Sequence[str]) -> list[Path]:
    """Save the charts named (each a PNG and an SVG); a report's charts may be drawn in two
    processes (chart_worker.py), each drawing its share."""
    return [path for name, fig in build_charts(frames, names).items() for path in style.save(fig, out_dir, name)]


def render_charts(frames: ReportFrames, out_dir: Path) -> list[Path]:
    remove_stale_charts(frames, out_dir)
    return draw(frames, out_dir, frames.charts.drawn)


def remove_stale_charts(frames: ReportFrames, out_dir: Path) -> None:
    style.remove_stale(out_dir, [n for n in ("trace", *SWEEP_CHARTS) if n not in frames.charts.drawn])
