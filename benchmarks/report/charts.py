"""Charts from computed frames only (summary, per-run metrics, curve points): plotting never
touches evidence. Every chart is written as PNG and SVG with metadata that would change between
runs (dates, software string, random SVG ids) pinned, so regenerated files are stable."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib as mpl  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

SCORE = "best heldout score (mean reward, 0-1)"
STABLE_RC = {"svg.hashsalt": "gepa-harness-report", "svg.fonttype": "path", "path.simplify": True}


def _colors(labels: Sequence[str]) -> dict[str, Any]:
    cycle = mpl.colormaps["tab10"]
    return {label: cycle(i % 10) for i, label in enumerate(sorted(set(labels)))}


def _figure(n_panels: int, ncols: int = 1, width: float = 6.4) -> tuple[Figure, list[Axes]]:
    n_panels = max(n_panels, 1)
    nrows = (n_panels + ncols - 1) // ncols
    fig = Figure(figsize=(width * ncols, 4.2 * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for extra in axes[n_panels:]:
        extra.set_visible(False)
    return fig, axes


def _save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    with mpl.rc_context(STABLE_RC):
        fig.savefig(png, dpi=110, metadata={"Software": None})
        fig.savefig(svg, metadata={"Date": None, "Creator": None})
    return [png, svg]


def _no_data(ax: Axes, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)


def _seed_line(ax: Axes, level: float | None, text: str = "seed") -> None:
    if level is not None:
        ax.axhline(level, color="0.35", linestyle="--", linewidth=1.2, label=text, zorder=1)


def _legend(ax: Axes, loc: str = "lower right") -> None:
    """Inside the axes for a few entries, to the right of it for more (so lines stay visible)."""
    entries = len(ax.get_legend_handles_labels()[1])
    if entries > 4:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=8, loc=loc)


def _task_mean(summary: pl.DataFrame, task: str, column: str) -> float | None:
    values = summary.filter(pl.col("task") == task)[column].drop_nulls()
    return float(values.mean()) if len(values) else None  # type: ignore[arg-type]


def _run_lines(ax: Axes, curves: pl.DataFrame, colors: dict[str, Any]) -> None:
    """One step line per run, coloured by cell; each cell is named once in the legend."""
    seen: set[str] = set()
    for (run, label), points in curves.group_by("run", "label", maintain_order=True):
        ax.step(points["x"].to_list(), points["y"].to_list(), where="post", color=colors[str(label)],
                alpha=0.85, linewidth=1.6, marker="o", markersize=3,
                label=None if label in seen else str(label))
        seen.add(str(label))


def _curves_for(curves: pl.DataFrame, runs: pl.DataFrame, metric: str, x_name: str) -> pl.DataFrame:
    return (curves.filter((pl.col("metric") == metric) & (pl.col("x_name") == x_name))
            .join(runs.select(run="run_id", label="label"), on="run")
            .sort("label", "run", "x", "y"))


def coverage_chart(summary: pl.DataFrame, runs: pl.DataFrame, curves: pl.DataFrame, out_dir: Path) -> list[Path]:
    tasks = sorted(set(summary["task"]))
    colors = _colors(summary["label"].to_list())
    fig, axes = _figure(2 * len(tasks), ncols=2)
    for i, task in enumerate(tasks):
        for j, split in enumerate(("heldout", "train")):
            ax = axes[2 * i + j]
            data = _curves_for(curves.filter(pl.col("task") == task), runs, f"{split}_coverage", "K")
            sizes = summary.filter(pl.col("task") == task)[f"{split}_rows_mean"].drop_nulls()
            title = f"{task}: {split} coverage"
            if len(sizes):
                lo, hi = sizes.min(), sizes.max()
                title += f" (of {hi:g} rows)" if lo == hi else f" (of {lo:g}-{hi:g} rows per run)"
            if data.is_empty():
                _no_data(ax, title)
                continue
            _run_lines(ax, data, colors)
            _seed_line(ax, _task_mean(summary, task, f"seed_{split}_coverage_mean"), "seed candidate alone")
            ax.set(title=title, xlabel="K: first K heldout-scored candidates (count)",
                   ylabel="rows solved by any of them (count)")
            ax.set_xlim(0.5, float(data["x"].max()) + 0.5)  # type: ignore[arg-type]
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.yaxis.get_major_locator().set_params(integer=True)
            _legend(ax)
    if not tasks:
        _no_data(axes[0], "coverage")
    fig.suptitle("Cumulative coverage against candidate index K")
    return _save(fig, out_dir, "coverage")


def best_chart(summary: pl.DataFrame, runs: pl.DataFrame, curves: pl.DataFrame, out_dir: Path,
               x_name: str, xlabel: str) -> list[Path]:
    tasks = sorted(set(summary["task"]))
    colors = _colors(summary["label"].to_list())
    fig, axes = _figure(len(tasks), ncols=min(len(tasks), 2) or 1)
    for ax, task in zip(axes, tasks):
        data = _curves_for(curves.filter(pl.col("task") == task), runs, "best_heldout", x_name)
        if data.is_empty():
            _no_data(ax, task)
            continue
        _run_lines(ax, data, colors)
        _seed_line(ax, _task_mean(summary, task, "seed_heldout_mean"))
        ax.set(title=f"{task}: best heldout so far", xlabel=xlabel, ylabel=SCORE)
        _legend(ax)
    if not tasks:
        _no_data(axes[0], "best heldout")
    fig.suptitle(f"Best heldout score against {xlabel.split(' (')[0]}")
    return _save(fig, out_dir, f"best_vs_{x_name}")


def _errors(frame: pl.DataFrame, metric: str) -> list[list[float]]:
    mean, lo, hi = (frame[f"{metric}_{s}"].fill_null(float("nan")).to_list() for s in ("mean", "lo", "hi"))
    return [[max(m - low, 0.0) for m, low in zip(mean, lo)], [max(high - m, 0.0) for m, high in zip(mean, hi)]]


def proposer_scaling_chart(summary: pl.DataFrame, axes_names: Sequence[str], out_dir: Path) -> list[Path]:
    """Best heldout per proposer model, per task: the proposer axis if the sweep has one,
    else each run's proposer model name."""
    x_column = "proposer" if "proposer" in axes_names else "proposer_model"
    other = [a for a in axes_names if a != "proposer"]
    frame = summary.with_columns(pl.col(x_column).fill_null("?").alias("_x"), series=pl.concat_str(
        [pl.col("stack"), *[pl.concat_str([pl.lit(f" {a}="), pl.col(a)]) for a in other]]))
    tasks = sorted(set(frame["task"]))
    colors = _colors(frame["series"].to_list())
    fig, axes = _figure(len(tasks), ncols=min(len(tasks), 2) or 1)
    for ax, task in zip(axes, tasks):
        data = frame.filter(pl.col("task") == task)
        xs = sorted(set(data["_x"]))
        for (series,), part in data.group_by("series", maintain_order=True):
            part = part.filter(pl.col("best_heldout_mean").is_not_null()).sort("_x")
            ax.errorbar([xs.index(x) for x in part["_x"]], part["best_heldout_mean"].to_list(),
                        yerr=_errors(part, "best_heldout"), color=colors[str(series)], marker="o", capsize=4,
                        linewidth=1.6, label=str(series))
        _seed_line(ax, _task_mean(summary, task, "seed_heldout_mean"))
        ax.set_xticks(range(len(xs)), xs, rotation=15)
        ax.set(title=f"{task}: optimization reward per proposer", xlabel="proposer model", ylabel=SCORE)
        _legend(ax, "best")
    if not tasks:
        _no_data(axes[0], "proposer scaling")
    fig.suptitle("Proposer scaling (mean over seeds, 95% bootstrap CI)")
    return _save(fig, out_dir, "proposer_scaling")


def same_container_chart(summary: pl.DataFrame, out_dir: Path) -> list[Path]:
    """Each cell's best heldout on the same container, the seed as a dashed line, the lift over
    the seed above each bar and the gap between the two best cells in the title."""
    tasks = sorted(set(summary["task"]))
    colors = _colors(summary["label"].to_list())
    most = max([summary.filter(pl.col("task") == t).height for t in tasks] or [1])
    fig, axes = _figure(len(tasks), ncols=min(len(tasks), 2) or 1, width=max(6.4, 0.75 * most))
    small = 8 if most > 5 else 9
    for ax, task in zip(axes, tasks):
        data = summary.filter(pl.col("task") == task).sort("label")
        labels = data["label"].to_list()
        heights = data["best_heldout_mean"].fill_null(0.0).to_list()
        ax.bar(range(len(labels)), heights, yerr=_errors(data, "best_heldout"), capsize=5,
               color=[colors[label] for label in labels], zorder=2)
        tops = data["best_heldout_hi"].fill_null(0.0).to_list()
        for x, (top, lift, status) in enumerate(zip(tops, data["lift_mean"], data["status"])):
            text = "missing" if status == "missing" else (f"Δ {lift:+.3f}" if lift is not None else "Δ n/a")
            ax.annotate(text, (x, top), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=small)
        _seed_line(ax, _task_mean(summary, task, "seed_heldout_mean"))
        ranked = sorted(data["best_heldout_mean"].drop_nulls().to_list(), reverse=True)
        gap = f" (best - runner-up: Δ {ranked[0] - ranked[1]:+.3f})" if len(ranked) > 1 else ""
        ax.set_xticks(range(len(labels)), labels, rotation=30 if most > 3 else 0, ha="right" if most > 3 else "center",
                      fontsize=small)
        ax.set(title=f"{task}{gap}", xlabel="stack", ylabel=SCORE, ylim=(0, max([1.0, *heights]) * 1.1))
        _legend(ax, "upper right")
    if not tasks:
        _no_data(axes[0], "same container")
    fig.suptitle("Same container: best heldout per stack (Δ = lift over the seed)")
    return _save(fig, out_dir, "same_container")


def render_charts(summary: pl.DataFrame, runs: pl.DataFrame, curves: pl.DataFrame, axes: Sequence[str],
                  out_dir: Path) -> list[Path]:
    return [
        *coverage_chart(summary, runs, curves, out_dir),
        *best_chart(summary, runs, curves, out_dir, "rollouts", "rollouts at creation (count)"),
        *best_chart(summary, runs, curves, out_dir, "cost_usd", "cumulative cost at creation (USD)"),
        *proposer_scaling_chart(summary, axes, out_dir),
        *same_container_chart(summary, out_dir),
    ]
