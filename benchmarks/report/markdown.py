"""summary.md in the shape of the published comparison table, plus a second table for lift and
where the best was found, and footnotes that say how each number was computed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.report.frames import ReportFrames


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _with_ci(row: dict[str, Any], metric: str, fmt: Any, rows_metric: str | None = None) -> str:
    """The cell's mean with its CI (or `n=1, no CI`); with `rows_metric`, how many rows with a
    reward the score rests on (mean over runs)."""
    mean = row[f"{metric}_mean"]
    if mean is None:
        return "n/a"
    rows = row.get(f"{rows_metric}_mean") if rows_metric else None
    on = "" if rows is None else f"{_num(rows)} rows"
    if row["n_runs"] == 1:
        return f"{fmt(mean)} (n=1, no CI{', ' + on if on else ''})"
    return f"{fmt(mean)} [{fmt(row[f'{metric}_lo'])}, {fmt(row[f'{metric}_hi'])}]" + (f" ({on})" if on else "")


def _coverage(row: dict[str, Any], split: str) -> str:
    """``covered/rows`` as in the published table (means over runs), then the CI of covered."""
    mean, rows = row[f"{split}_coverage_mean"], row[f"{split}_rows_mean"]
    if mean is None or rows is None:
        return "n/a"
    text = f"{_num(mean)}/{_num(rows)}"
    if row["n_runs"] == 1:
        return f"{text} (n=1, no CI)"
    return f"{text} [{_num(row[f'{split}_coverage_lo'])}, {_num(row[f'{split}_coverage_hi'])}]"


def _noise(row: dict[str, Any]) -> str:
    half, runs = row.get("noise_half_range"), row.get("noise_runs") or 0
    return f"±{half:.3f} ({runs} runs)" if half is not None else f"unknown ({runs} run{'s' if runs != 1 else ''})"


def _title(frames: ReportFrames, title: str) -> str:
    if frames.runs.height == 1:
        run = frames.runs.row(0, named=True)
        return f"Run {run['run_id']}: {run['stack']} on {run['task']} (seed {run['seed']})"
    return title


def _charts(frames: ReportFrames) -> str:
    """The charts drawn, and those skipped grouped by why."""
    reasons: dict[str, list[str]] = {}
    for name, why in frames.charts.skipped:
        reasons.setdefault(why, []).append(f"`{name}`")
    drawn = ", ".join(f"`{name}.png`" for name in frames.charts.drawn) or "none"
    return f"Charts: {drawn}" + "".join(f"; skipped ({why}): {', '.join(names)}" for why, names in reasons.items())


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
            extra.append(name + ["missing"] * 7)
            continue
        main.append(name + [
            _with_ci(row, "pick_heldout", "{:.3f}".format, "pick_heldout_n"),
            _with_ci(row, "best_heldout", "{:.3f}".format, "best_heldout_n"),
            _coverage(row, "heldout"),
            _coverage(row, "train"),
            f"{row['pareto_points']} ({row['pareto_share']:.1%})",
        ])
        extra.append(name + [
            _with_ci(row, "seed_heldout", "{:.3f}".format, "seed_heldout_n"),
            _with_ci(row, "pick_lift", "{:+.3f}".format),
            _noise(row),
            _with_ci(row, "lift", "{:+.3f}".format),
            _with_ci(row, "found_rollouts", _num),
            _with_ci(row, "found_cost_usd", "${:.4f}".format),
            _with_ci(row, "found_elapsed_s", "{:.1f}".format),
        ])
    thresholds = ", ".join([f"default {options.threshold:g}"]
                           + [f"{t} {v:g}" for t, v in sorted(options.task_thresholds.items())])
    lines = [f"# {_title(frames, title)}", "", "## What to conclude", ""]
    lines += [f"- {text}" for text in frames.conclusions["text"]] or ["- no finished run"]
    lines += ["", _charts(frames), ""]
    lines += _table(keys + ["pick heldout", "best heldout (test-set selection)", f"heldout coverage K={k}", f"train coverage K={k}",
                            "joint Pareto points (share)"], main)
    lines += ["", "## Lift over the seed and where the best was found", ""]
    lines += _table(keys + ["seed heldout", "pick lift", "seed noise floor", "best lift (test-set selection)",
                            "found at rollouts", "found at cost", "found at time (s)"], extra)
    lines += [
        "",
        f"- Each cell: mean over its runs (seeds); brackets are a {options.level:.0%} percentile bootstrap CI over "
        f"runs ({options.resamples} resamples, RNG seed {options.ci_seed}); `(n=1, no CI)` marks a single run, "
        "which has no interval. Runs of a folder without sweep.json pool into a cell only when their resolved "
        "spec is identical apart from the seed; otherwise the cell is named by what differs.",
        "- Seed noise floor: the same seed prompt on the same heldout rows scores differently from run to run; "
        "± half the range (max - min) of the seed's heldout mean over the runs of the task with the same policy "
        "model and rows. A lift inside it is not a gain; with one run of the seed it is unknown.",
        "- Pick heldout: the heldout mean of the candidate the run itself chose (best pareto mean), the headline; "
        "pick lift = pick - the seed's heldout mean.",
        "- Best heldout (test-set selection): the highest heldout mean reward of any candidate re-scored on "
        "heldout, chosen by looking at heldout, so an upper bound no run could pick; lift = best - "
        "the seed candidate's heldout mean; found at = rollouts, cumulative cost (USD) and elapsed seconds "
        "when the best candidate was created. Failed rollouts have no reward and are left out of every mean "
        "(never counted as 0); `N rows`: how many heldout rows with a reward the score rests on.",
        f"- Coverage K={k}: distinct rows with reward >= threshold ({thresholds}) solved by any of the first K "
        "heldout-scored candidates in creation order, over the rows of the run's pool (train: rows of the "
        "optimization stages seed/pareto/minibatch/reflection/library).",
        "- Joint Pareto: candidates of all runs of a task on (heldout mean up, cumulative cost down, elapsed "
        "time down); points on the front per cell and their share of the task's front, pooled over seeds.",
        "- `missing`: a cell of sweep.json's grid with no finished run; `(m/n runs)`: some runs missing.",
    ]
    return "\n".join(lines) + "\n"
