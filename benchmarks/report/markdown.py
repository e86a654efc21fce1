"""summary.md in the shape of the published comparison table, plus a second table for lift and
where the best was found, and footnotes that say how each number was computed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.report.pipeline import ReportFrames


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _with_ci(row: dict[str, Any], metric: str, fmt: Any) -> str:
    mean = row[f"{metric}_mean"]
    if mean is None:
        return "n/a"
    if row["ci"] == "n=1":
        return f"{fmt(mean)} (n=1)"
    return f"{fmt(mean)} [{fmt(row[f'{metric}_lo'])}, {fmt(row[f'{metric}_hi'])}]"


def _coverage(row: dict[str, Any], split: str) -> str:
    """``covered/rows`` as in the published table (means over runs), then the CI of covered."""
    mean, rows = row[f"{split}_coverage_mean"], row[f"{split}_rows_mean"]
    if mean is None or rows is None:
        return "n/a"
    text = f"{_num(mean)}/{_num(rows)}"
    if row["ci"] == "n=1":
        return f"{text} (n=1)"
    return f"{text} [{_num(row[f'{split}_coverage_lo'])}, {_num(row[f'{split}_coverage_hi'])}]"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(cells) + " |" for cells in body]


def render_markdown(frames: ReportFrames, title: str = "Optimizer comparison") -> str:
    summary, axes, options = frames.summary, frames.axes, frames.options
    k = summary["k"].max() if summary.height else options.k
    keys = ["task", "stack", *axes]
    main, extra = [], []
    for row in summary.to_dicts():  # formatting only: one line per cell
        name = [row[c] for c in keys]
        if row["status"] == "partial":
            name[1] = f"{row['stack']} ({row['n_runs']}/{row['n_expected']} runs)"
        if row["status"] == "missing":
            failed = f", {row['n_failed']} failed" if row["n_failed"] else ""
            main.append(name + [f"missing (0/{row['n_expected']} runs{failed})"] + ["missing"] * 4)
            extra.append(name + ["missing"] * 6)
            continue
        main.append(name + [
            _with_ci(row, "pick_heldout", "{:.3f}".format),
            _with_ci(row, "best_heldout", "{:.3f}".format),
            _coverage(row, "heldout"),
            _coverage(row, "train"),
            f"{row['pareto_points']} ({row['pareto_share']:.1%})",
        ])
        extra.append(name + [
            _with_ci(row, "seed_heldout", "{:.3f}".format),
            _with_ci(row, "pick_lift", "{:+.3f}".format),
            _with_ci(row, "lift", "{:+.3f}".format),
            _with_ci(row, "found_rollouts", _num),
            _with_ci(row, "found_cost_usd", "${:.4f}".format),
            _with_ci(row, "found_elapsed_s", "{:.1f}".format),
        ])
    thresholds = ", ".join([f"default {options.threshold:g}"]
                           + [f"{t} {v:g}" for t, v in sorted(options.task_thresholds.items())])
    lines = [f"# {title}", ""]
    lines += _table(keys + ["pick heldout", "best heldout (test-set selection)", f"heldout coverage K={k}", f"train coverage K={k}",
                            "joint Pareto points (share)"], main)
    lines += ["", "## Lift over the seed and where the best was found", ""]
    lines += _table(keys + ["seed heldout", "pick lift", "best lift (test-set selection)", "found at rollouts", "found at cost", "found at time (s)"], extra)
    lines += [
        "",
        f"- Each cell: mean over its runs (seeds); brackets are a {options.level:.0%} percentile bootstrap CI over "
        f"runs ({options.resamples} resamples, RNG seed {options.ci_seed}); `(n=1)` marks a single run, whose CI "
        "is the value itself.",
        "- Pick heldout: the heldout mean of the candidate the run itself chose (best pareto mean), the headline; "
        "pick lift = pick - the seed's heldout mean.",
        "- Best heldout (test-set selection): the highest heldout mean reward of any candidate re-scored on "
        "heldout, chosen by looking at heldout, so an upper bound no run could pick; lift = best - "
        "the seed candidate's heldout mean; found at = rollouts, cumulative cost (USD) and elapsed seconds "
        "when the best candidate was created.",
        f"- Coverage K={k}: distinct rows with reward >= threshold ({thresholds}) solved by any of the first K "
        "heldout-scored candidates in creation order, over the rows of the run's pool (train: rows of the "
        "optimization stages seed/pareto/minibatch/reflection/library).",
        "- Joint Pareto: candidates of all runs of a task on (heldout mean up, cumulative cost down, elapsed "
        "time down); points on the front per cell and their share of the task's front, pooled over seeds.",
        "- `missing`: a cell of sweep.json's grid with no finished run; `(m/n runs)`: some runs missing.",
    ]
    return "\n".join(lines) + "\n"
