"""What a person sees: a live progress bar for one run, a sweep's status line, and a short result."""

from __future__ import annotations

import difflib
import threading
import time
from typing import Callable

from rich.console import Console
from rich.live import Live
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
        stage = f"heldout {progress.heldout_rollouts}" if progress.heldout_rollouts else progress.stage
        self._bar.update(self._task, completed=progress.rollouts, best=best, tokens=progress.tokens,
                         stage=stage, usage=live_usage_text(progress.spend))


class ProgressLines:
    """The progress bar's content as plain lines, for output that is not a terminal (a log
    file, CI, `nohup`): one line when the run starts optimizing and when it starts heldout
    re-scoring, then one every `every_s` seconds while anything changed, and one at the end."""

    def __init__(self, console: Console, label: str, budget: int, *, every_s: float = 30.0,
                 live_usage: bool = False, clock: Callable[[], float] = time.monotonic):
        self.console, self.label, self.budget, self.every_s = console, label, budget, every_s
        self.live_usage, self.clock = live_usage, clock
        self._started = clock()
        self._latest: RunProgress | None = None
        self._printed: RunProgress | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._every, name="progress-lines", daemon=True)

    def __enter__(self) -> "ProgressLines":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.tick()

    def __call__(self, progress: RunProgress) -> None:
        with self._lock:
            before, self._latest = self._latest, progress
            new_phase = before is None or (progress.heldout_rollouts > 0) != (before.heldout_rollouts > 0)
        if new_phase:
            self.tick()

    def _every(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def tick(self) -> None:
        """Print the latest progress if it changed since the last line."""
        with self._lock:
            latest = self._latest
            if latest is None or latest == self._printed:
                return
            self._printed = latest
        self.console.print(self.line(latest), highlight=False, markup=False, soft_wrap=True)

    def line(self, progress: RunProgress) -> str:
        best = "-" if progress.best_score is None else f"{progress.best_score:.3f}"
        heldout = f", heldout {progress.heldout_rollouts} rollouts" if progress.heldout_rollouts else ""
        usage = f", {live_usage_text(progress.spend)}" if self.live_usage and progress.spend is not None else ""
        elapsed = int(self.clock() - self._started)
        return (f"[progress] {self.label}: {progress.rollouts}/{self.budget} rollouts{heldout}, best {best}, "
                f"{progress.tokens} tokens, {progress.stage}, {elapsed // 60}m{elapsed % 60:02d}s{usage}")


def run_progress(console: Console, label: str, budget: int, *, every_s: float,
                 live_usage: bool) -> RunProgressBar | ProgressLines:
    """A live bar on a terminal, periodic lines anywhere else."""
    if console.is_terminal:
        return RunProgressBar(console, label, budget, live_usage=live_usage)
    return ProgressLines(console, label, budget, every_s=every_s, live_usage=live_usage)


class SweepStatus:
    """A sweep's status line (runs done, running, failed; rollouts/s; tokens; elapsed): kept
    live in place on a terminal. Anywhere else (a log file, CI, `nohup`) rich would show it
    only once the sweep ends, so it comes as plain lines: at once when the runs' counts
    change, else every `every_s` seconds, and the last at the end."""

    def __init__(self, console: Console, text: str, counts: str, *, every_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.console, self.every_s, self.clock = console, every_s, clock
        self._live = Live(text, console=console, refresh_per_second=2, transient=False) \
            if console.is_terminal else None
        self._text, self._counts = text, counts
        self._printed_at: float | None = None
        self._printed_text: str | None = None

    def __enter__(self) -> "SweepStatus":
        if self._live is not None:
            self._live.__enter__()
        else:
            self._print()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
        elif self._text != self._printed_text:
            self._print()

    def update(self, text: str, counts: str) -> None:
        """`counts`: the part of the status whose change is news (the runs by status)."""
        news = counts != self._counts
        self._text, self._counts = text, counts
        if self._live is not None:
            self._live.update(text)
        elif news or (self._printed_at is not None and self.clock() - self._printed_at >= self.every_s):
            self._print()

    def _print(self) -> None:
        self._printed_at, self._printed_text = self.clock(), self._text
        self.console.print(self._text, highlight=False, markup=False, soft_wrap=True)


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


def _n(rows: int | None) -> str:
    return "" if rows is None else f" (n={rows})"


def _share(part: int, whole: int) -> str:
    return f"{part} ({part / whole:.0%})"


def print_outcome(console: Console, outcome: RunOutcome, heldout_rows: int) -> None:
    console.rule(f"run {outcome.run_id}: {outcome.status}")
    if outcome.error:
        # the error text comes from services and models: data, never markup
        console.print(f"[red]error:[/red] {escape(outcome.error)}", markup=True, highlight=False)
    console.print(f"heldout ({heldout_rows} rows): seed {_score(outcome.seed_heldout)}{_n(outcome.seed_heldout_n)} -> run's "
                  f"pick {_score(outcome.best_heldout)}{_n(outcome.best_heldout_n)} ({outcome.best_candidate_id})",
                  highlight=False)
    cost = "unknown" if outcome.cost_usd is None else f"${outcome.cost_usd:.4f}"
    total = outcome.rollouts + outcome.heldout_rollouts
    failed = f"{outcome.failed_rollouts} of {total} failed (no reward, left out of every score); " if outcome.failed_rollouts else ""
    console.print(f"rollouts: {outcome.rollouts} optimization + {outcome.heldout_rollouts} heldout; {failed}"
                  f"tokens: {outcome.tokens}; cost: {cost}; wall: {outcome.wall_s:.1f}s; stop: {outcome.stop_reason}",
                  highlight=False)
    if outcome.proposals:
        console.print(f"proposals: {outcome.proposals}, {_share(outcome.proposals_changed, outcome.proposals)} differ "
                      f"from their parent, {_share(outcome.proposals_accepted, outcome.proposals)} accepted",
                      highlight=False)
    console.print(f"evidence: {outcome.evidence_dir}", highlight=False)
    if outcome.logs:
        console.print(f"logs: {', '.join(outcome.logs)}", highlight=False, soft_wrap=True)
    if outcome.seed_texts is not None and outcome.best_texts is not None:
        console.print(prompt_diff(outcome.seed_texts, outcome.best_texts), highlight=False, markup=False)
