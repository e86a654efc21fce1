"""What a person watching a run sees: the bar advances per rollout, and output that is not
a terminal gets progress lines instead of nothing until the end."""

from __future__ import annotations

import io
import re

from rich.console import Console

from conftest import run_cli
from harness.console import ProgressLines, RunProgressBar, SweepStatus, run_progress
from harness.context import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines_printer(every_s: float = 30.0) -> tuple[ProgressLines, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=False, width=200)
    return ProgressLines(console, "banking77", 120, every_s=every_s, clock=clock), out, clock


def test_lines_come_at_the_start_of_each_phase_and_then_only_on_ticks_with_news() -> None:
    printer, out, clock = lines_printer()
    printer(Progress(1, 120, None, 30, "seed"))
    printer(Progress(2, 120, None, 60, "seed"))  # same phase: waits for the next tick
    assert out.getvalue().splitlines() == ["[progress] banking77: 1/120 rollouts, best -, 30 tokens, seed, 0m00s"]
    clock.now = 95.0
    printer.tick()
    printer.tick()  # nothing new: no second line
    printer(Progress(120, 120, 0.4, 900, "heldout", heldout_rollouts=1))  # a new phase: at once
    assert out.getvalue().splitlines()[1:] == [
        "[progress] banking77: 2/120 rollouts, best -, 60 tokens, seed, 1m35s",
        "[progress] banking77: 120/120 rollouts, heldout 1 rollouts, best 0.400, 900 tokens, heldout, 1m35s",
    ]


def test_a_terminal_gets_the_bar_and_anything_else_the_lines() -> None:
    tty = Console(file=io.StringIO(), force_terminal=True)
    log = Console(file=io.StringIO(), force_terminal=False)
    assert isinstance(run_progress(tty, "x", 10, every_s=30, live_usage=False), RunProgressBar)
    assert isinstance(run_progress(log, "x", 10, every_s=30, live_usage=False), ProgressLines)


def test_a_run_whose_output_is_a_pipe_prints_progress_per_phase(tmp_path, data_dir) -> None:
    """The harness's stdout is a pipe here: the progress shows up as lines, and the
    optimization line counts single rollouts (not only whole batches)."""
    result = run_cli("models=scripted", f"evidence_root={tmp_path / 'evidence'}", f"data_dir={data_dir}",
                     "budget.max_rollouts=12", "pools.train.count=8", "pools.pareto.count=4",
                     "pools.heldout.count=4")
    assert result.returncode == 0, result.stdout
    progress = [line for line in result.stdout.splitlines() if line.startswith("[progress] banking77:")]
    assert progress, result.stdout
    first = re.match(r"\[progress\] banking77: (\d+)/12 rollouts", progress[0])
    assert first and int(first.group(1)) == 1  # the line came with the first rollout, not after a batch
    # the run's end is a line of its own, with the metered totals
    assert re.search(r": 12/12 rollouts, heldout [1-9]\d* rollouts, best [\d.]+, \d+ tokens, done, ", progress[-1])


def test_a_sweep_status_off_a_terminal_prints_lines_on_news_and_on_ticks() -> None:
    """Off a terminal rich's live line would show only at the sweep's end: the status comes
    as lines instead, at once when the runs' counts change, else every `every_s`."""
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=False, width=200)
    with SweepStatus(console, "runs: 2 pending | 00:00:00", "2 pending", every_s=30.0, clock=clock) as status:
        clock.now = 1.0
        status.update("runs: 1 running, 1 pending | 00:00:01", "1 running, 1 pending")  # news: at once
        clock.now = 20.0
        status.update("runs: 1 running, 1 pending | 00:00:20", "1 running, 1 pending")  # no news, no tick
        clock.now = 31.0
        status.update("runs: 1 running, 1 pending | 00:00:31", "1 running, 1 pending")  # a tick
        clock.now = 40.0
        status.update("runs: 2 done | 00:00:40", "2 done")
    assert out.getvalue().splitlines() == [
        "runs: 2 pending | 00:00:00", "runs: 1 running, 1 pending | 00:00:01",
        "runs: 1 running, 1 pending | 00:00:31", "runs: 2 done | 00:00:40"]


def test_a_sweep_status_on_a_terminal_is_one_live_line() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with SweepStatus(console, "runs: 1 pending", "1 pending", every_s=30.0) as status:
        status.update("runs: 1 done", "1 done")
    raw = out.getvalue()
    assert "\r\x1b[2K" in raw  # the line is erased and redrawn in place
    assert re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", raw).split("\r")[-1].strip() == "runs: 1 done"
