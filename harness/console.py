"""What a person sees: a live progress bar for one run and a short result."""

from __future__ import annotations

import difflib

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.context import Progress as RunProgress
from harness.gateway.session import live_usage_text
from harness.run import RunOutcome


class RunProgressBar:
    """Rollouts done / budget, best pareto score so far, tokens."""

    def __init__(self, console: Console, label: str, budget: int, *, live_usage: bool = False):
        # live usage: the gateway's running cost and tokens, policy vs proposer
        usage = [TextColumn("{task.fields[usage]}", markup=False)] if live_usage else []
        self._bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rollouts"),
            TextColumn("best {task.fields[best]}"), TextColumn("{task.fields[tokens]} tokens"),
            TextColumn("[dim]{task.fields[stage]}"), TimeElapsedColumn(), *usage, console=console, transient=False,
        )
        self._task = self._bar.add_task(label, total=budget, best="-", tokens=0, stage="preflight", usage="")

    def __enter__(self) -> "RunProgressBar":
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def __call__(self, progress: RunProgress) -> None:
        best = "-" if progress.best_score is None else f"{progress.best_score:.3f}"
        self._bar.update(self._task, completed=progress.rollouts, best=best, tokens=progress.tokens,
                         stage=progress.stage, usage=live_usage_text(progress.spend))


def prompt_diff(before: dict[str, str], after: dict[str, str]) -> str:
    lines: list[str] = []
    for field in sorted(set(before) | set(after)):
        old, new = before.get(field, ""), after.get(field, "")
        if old == new:
            continue
        lines += difflib.unified_diff(old.splitlines(), new.splitlines(), f"seed/{field}", f"best/{field}", lineterm="")
    return "\n".join(lines) or "(the run picked the seed: no change)"


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _share(part: int, whole: int) -> str:
    return f"{part} ({part / whole:.0%})"


def print_outcome(console: Console, outcome: RunOutcome, heldout_rows: int) -> None:
    console.rule(f"run {outcome.run_id}: {outcome.status}")
    if outcome.error:
        # the error text comes from services and models: data, never markup
        console.print(f"[red]error:[/red] {escape(outcome.error)}", markup=True, highlight=False)
    console.print(f"heldout ({heldout_rows} rows): seed {_score(outcome.seed_heldout)} -> run's pick "
                  f"{_score(outcome.best_heldout)} ({outcome.best_candidate_id})", highlight=False)
    cost = "unknown" if outcome.cost_usd is None else f"${outcome.cost_usd:.4f}"
    console.print(f"rollouts: {outcome.rollouts} optimization + {outcome.heldout_rollouts} heldout; "
                  f"tokens: {outcome.tokens}; cost: {cost}; wall: {outcome.wall_s:.1f}s; stop: {outcome.stop_reason}",
                  highlight=False)
    if outcome.proposals:
        console.print(f"proposals: {outcome.proposals}, {_share(outcome.proposals_changed, outcome.proposals)} differ "
                      f"from their parent, {_share(outcome.proposals_accepted, outcome.proposals)} accepted",
                      highlight=False)
    console.print(f"evidence: {outcome.evidence_dir}", highlight=False)
    if outcome.seed_texts is not None and outcome.best_texts is not None:
        console.print(prompt_diff(outcome.seed_texts, outcome.best_texts), highlight=False, markup=False)
