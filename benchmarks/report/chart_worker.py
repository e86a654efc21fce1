"""A second process for a report's charts: matplotlib holds the GIL, so a report's figures
drawn in two processes take about half the wall time on a machine of two cores or more.

write_report starts it before computing, so its imports (matplotlib: half a second to a second) overlap
the compute; then sends the frames, the output directory and the names of the charts this
process draws, pickled on stdin; it answers the paths it wrote, pickled on stdout. A worker
with nothing to draw (the report failed, or had one chart) is stopped.

    python -m benchmarks.report.chart_worker < pickle of (ReportFrames, out_dir, names)
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.report.io import ReportError

if TYPE_CHECKING:
    from benchmarks.report.frames import ReportFrames

PROJECT_ROOT = Path(__file__).resolve().parents[2]


WAIT_S = 600.0  # for the worker's share: five charts take seconds


class ChartWorker:
    """The report's handle on the worker process."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                                          os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen([sys.executable, "-m", "benchmarks.report.chart_worker"], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._talk: threading.Thread | None = None
        self._answer: tuple[bytes, bytes] = (b"", b"")
        self._answered = False

    @classmethod
    def start(cls, wanted: bool | None = None) -> "ChartWorker | None":
        """A worker when `wanted` (an OSError if it cannot start), or by default when a core is
        to spare, else None: a second process on a busy machine only adds its imports."""
        if wanted is None:
            cores = len(os.sched_getaffinity(0))
            if cores < 2 or os.getloadavg()[0] > cores - 1:
                return None
            try:
                return cls()
            except OSError:
                return None
        return cls() if wanted else None

    def send(self, frames: "ReportFrames", out_dir: Path, names: Sequence[str]) -> None:
        """Hand over the charts to draw and return: a thread writes them, since the worker
        reads its input only once its imports are done."""
        payload = pickle.dumps((frames, str(out_dir), tuple(names)))
        self._talk = threading.Thread(target=self._exchange, args=(payload,), daemon=True)
        self._talk.start()

    def paths(self) -> list[Path]:
        """The paths the worker wrote, once it has drawn its share (none when it was sent no
        share); a ReportError if it failed."""
        if self._talk is None:
            return []
        self._talk.join(WAIT_S)
        if self._talk.is_alive():
            raise ReportError(f"the chart worker drew nothing within {WAIT_S:.0f} s")
        self._answered = True
        out, err = self._answer
        try:
            written = pickle.loads(out) if self._proc.returncode == 0 else None
        except (pickle.UnpicklingError, EOFError, ValueError):
            written = None
        if written is None:
            lines = err.decode(errors="replace").strip().splitlines() or ["no output"]
            raise ReportError(f"the chart worker failed (exit {self._proc.returncode}): {lines[-1]}")
        return [Path(p) for p in written]

    def close(self) -> None:
        """Stop the worker unless it has answered: it was sent nothing (the report failed, or
        had one chart), or this process failed while it drew (it must not write charts into
        a report that failed)."""
        if not self._answered and self._proc.poll() is None:
            self._proc.kill()
        if self._talk is None:
            self._proc.communicate()
        else:
            self._talk.join(WAIT_S)

    def _exchange(self, payload: bytes) -> None:
        self._answer = self._proc.communicate(payload)


def main() -> None:
    # the answer goes to the real stdout; anything else printed (a library's notice) to stderr
    answer, sys.stdout = sys.stdout.buffer, sys.stderr
    from benchmarks.report.charts import draw  # the import the early start overlaps

    payload = sys.stdin.buffer.read()
    if not payload:
        return
    frames, out_dir, names = pickle.loads(payload)
    answer.write(pickle.dumps([str(path) for path in draw(frames, Path(out_dir), names)]))
    answer.flush()
    sys.stderr.flush()
    # the report waits for this process to end: the interpreter's teardown with polars and
    # matplotlib loaded (0.15 s) would be on its critical path, and has nothing left to save
    os._exit(0)


if __name__ == "__main__":
    main()
