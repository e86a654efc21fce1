"""A second process for a report's charts: matplotlib holds the GIL, so a report's figures
drawn in two processes take about half the wall time on a machine of two cores or more.

write_report starts it before computing, so its imports (matplotlib: about a second) overlap
the compute; then sends the frames, the output directory and the names of the charts this
process draws, pickled on stdin. It prints each path it wrote on a line. A worker with
nothing to draw (the report failed, or had one chart) is stopped.

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


class ChartWorker:
    """The report's handle on the worker process."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                                          os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen([sys.executable, "-m", "benchmarks.report.chart_worker"], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._talk: threading.Thread | None = None
        self._answer: tuple[bytes, bytes] = (b"", b"")

    @classmethod
    def start(cls, wanted: bool | None = None) -> "ChartWorker | None":
        """A worker when `wanted`, or by default when a core is to spare (a second process on a
        busy machine only adds its imports); None when it cannot start."""
        if wanted is None:
            cores = os.cpu_count() or 1
            wanted = cores >= 2 and os.getloadavg()[0] <= cores - 1
        if not wanted:
            return None
        try:
            return cls()
        except OSError:
            return None

    def send(self, frames: "ReportFrames", out_dir: Path, names: Sequence[str]) -> None:
        """Hand over the charts to draw; returns at once (the worker reads its input only once
        its imports are done, and a pipe holds 64 KiB)."""
        payload = pickle.dumps((frames, str(out_dir), tuple(names)))
        self._talk = threading.Thread(target=self._exchange, args=(payload,), daemon=True)
        self._talk.start()

    def paths(self) -> list[Path]:
        """The paths the worker wrote, once it has drawn its share; a ReportError if it failed."""
        assert self._talk is not None, "send first"
        self._talk.join()
        out, err = self._answer
        if self._proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines() or ["no output"]
            raise ReportError(f"the chart worker failed (exit {self._proc.returncode}): {lines[-1]}")
        return [Path(line) for line in out.decode().splitlines() if line]

    def close(self) -> None:
        """Stop a worker that was sent nothing (the report failed, or had one chart to draw)
        without waiting for its imports; a no-op once it was sent its share."""
        if self._talk is None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()

    def _exchange(self, payload: bytes) -> None:
        self._answer = self._proc.communicate(payload)


def main() -> None:
    from benchmarks.report.charts import draw  # the import the early start overlaps

    payload = sys.stdin.buffer.read()
    if not payload:
        return
    frames, out_dir, names = pickle.loads(payload)
    for path in draw(frames, Path(out_dir), names):
        print(path, flush=True)


if __name__ == "__main__":
    main()
