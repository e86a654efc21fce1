"""A single run's optimization trace (frames.trace, trace.py): the pareto score of each
candidate against the rollouts spent when it was scored, the best-so-far line (its end is the
run's pick), minibatch judgements as faint marks (accepted, rejected, and the parent's score on
the same minibatch), and the seed's and the pick's heldout scores after the budget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from benchmarks.report import style
from benchmarks.report.conclusions import sentence

if TYPE_CHECKING:
    from benchmarks.report.frames import ReportFrames

REJECTED = "#d62728"


def trace_figure(frames: ReportFrames, colours: dict[str, str]) -> Figure:
    run = frames.runs.row(0, named=True)
    colour = colours.get(run["label"], "#1f77b4")
    trace = frames.trace.filter(pl.col("run_id") == run["run_id"])
    fig, (ax,) = style.figure(1, width=8.2, height=4.8)

    def kind(name: str) -> pl.DataFrame:
        return trace.filter(pl.col("kind") == name).sort("x", "candidate_id")

    pareto, judged, parents = kind("pareto"), kind("minibatch"), kind("parent_minibatch")
    spent = int(trace["spent_total"].max() or 0) if trace.height else 0  # type: ignore[arg-type]
    if parents.height:
        ax.scatter(parents["x"], parents["y"], marker="_", s=140, color=style.SEED_GREY, alpha=0.7, zorder=2,
                   label="parent, same minibatch")
    for accepted, marker, shade, text in ((True, "o", colour, "child on its minibatch: accepted"),
                                          (False, "x", REJECTED, "child on its minibatch: rejected")):
        part = judged.filter(pl.col("accepted") == accepted)
        if part.height:
            ax.scatter(part["x"], part["y"], marker=marker, s=30, color=shade, alpha=0.45, zorder=3, label=text)
    seeds, children = pareto.filter("is_seed"), pareto.filter(~pl.col("is_seed"))
    if seeds.height:
        ax.scatter(seeds["x"], seeds["y"], marker="s", s=46, color=style.SEED_GREY, zorder=5,
                   label="seed, pareto pool mean")
    if children.height:
        ax.scatter(children["x"], children["y"], marker="o", s=46, color=colour, zorder=5,
                   label="accepted candidate, pareto pool mean")
    best = pareto.filter(pl.col("best_so_far").is_not_null())
    if best.height:
        xs, ys = best["x"].to_list() + [spent], best["best_so_far"].to_list()
        ax.step(xs, ys + ys[-1:], where="post", color=colour, linewidth=1.8, zorder=4,
                label="best pareto mean so far (ends at the pick)")
    ax.axvline(spent, color=style.SEED_GREY, linestyle=":", linewidth=1.0, zorder=1)
    ax.text(spent, 1.0, " heldout", fontsize=8, color=style.SEED_GREY, va="top")
    _heldout(ax, run, spent, colour)
    style.count_axis(ax, "x", 0, max(spent, 1) * 1.12, pad=0.0)
    ax.set_ylim(-0.02, 1.02)
    ax.set(xlabel=f"optimization rollouts spent when scored (count; {spent} in all, heldout after)",
           ylabel=style.SCORE)
    style.title(ax, sentence(frames.conclusions, run["task"], "trace"), chars=95)
    style.legend(ax)
    style.suptitle(fig, f"Optimization trace of run {run['run_id']} ({run['label']}, seed {run['seed']})")
    return fig


def _heldout(ax: Axes, run: dict[str, Any], spent: int, colour: str) -> None:
    """The seed's and the pick's heldout scores, right of the budget line."""
    seed, pick, rows = run.get("seed_heldout"), run.get("pick_heldout"), run.get("pick_heldout_n")
    x = spent * 1.04 + 0.5
    on = f" ({rows:g} rows)" if rows is not None else ""
    if seed is not None:
        ax.scatter([x], [seed], marker="D", s=110, facecolors="none", edgecolors=style.SEED_GREY, linewidths=1.6,
                   zorder=6, label=f"seed on heldout: {seed:.3f}{on}")
    if pick is not None:
        same = run.get("pick_candidate_id") == run.get("seed_candidate_id")
        ax.scatter([x], [pick], marker="*", s=110, color=colour, zorder=7,
                   label=f"pick on heldout: {pick:.3f}" + (" (the pick is the seed)" if same else ""))
