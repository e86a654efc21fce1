"""Run the performance benchmarks one after another, each in its own process, then print
and write the summary table (`benchmarks/perf/results/summary.md`).

    python -m benchmarks.perf [--only overhead,overlap] [--quick] [--results-dir DIR]

Run it on an otherwise idle machine: the benchmarks time real processes on shared cores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.perf.common import REPO, RESULTS_DIR
from benchmarks.perf.summary import write_summary

# order: the cheap, CPU-bound ones first; the local model (minutes of llama.cpp) last
BENCHMARKS = ("overhead", "overlap", "scale", "cluster", "gateway_overhead", "report_scale", "local_model")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="each benchmark's smoke-sized variant")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    chosen = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
    failed = []
    for name in chosen:
        command = [sys.executable, "-m", f"benchmarks.perf.{name}", "--results-dir", str(args.results_dir)]
        if args.quick:
            command.append("--quick")
        print(f"\n=== {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        code = subprocess.call(command, cwd=REPO)
        print(f"=== {name}: exit {code} after {time.monotonic() - started:.0f}s", flush=True)
        if code != 0:
            failed.append(name)
    table = write_summary(args.results_dir)
    print("\n" + table)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
