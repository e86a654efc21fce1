"""CLI: ``python -m benchmarks.report PATH [--k K] [--threshold T] [--threshold TASK=T ...]
[--out DIR]`` regenerates a report from evidence alone; PATH is a sweep, a folder of single runs
(evidence/local) or one run's directory."""

from __future__ import annotations

import argparse
import sys

import polars as pl
import pyarrow as pa

from benchmarks.report.io import ReportError
from benchmarks.report.pipeline import write_report


def parse_thresholds(values: list[str]) -> tuple[float, dict[str, float]]:
    """``0.8`` sets the default; ``task=0.8`` sets one task's threshold."""
    default, per_task = 1.0, {}
    for value in values:
        task, sep, number = value.rpartition("=")
        try:
            threshold = float(number)
        except ValueError:
            raise ReportError(f"--threshold {value!r}: expected a number or TASK=NUMBER") from None
        if sep:
            per_task[task] = threshold
        else:
            default = threshold
    return default, per_task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", metavar="PATH",
                        help="<evidence_root>/<sweep> (a sweep, or evidence/local: single runs), or one run's "
                             "directory <evidence_root>/<sweep>/<run_id>")
    parser.add_argument("--k", type=int, default=None, help="coverage through the first K candidates (default: all)")
    parser.add_argument("--threshold", action="append", default=[], metavar="[TASK=]REWARD",
                        help="a row counts as solved when reward >= this (default 1.0; a task's container "
                             "config may record its own, which TASK=REWARD overrides); repeatable per task")
    parser.add_argument("--out", default=None, help="output directory (default: PATH/report)")
    parser.add_argument("--no-charts", action="store_true", help="write tables only")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples for the seed CI")
    parser.add_argument("--ci-seed", type=int, default=0, help="RNG seed of the bootstrap")
    args = parser.parse_args(argv)
    try:
        default, per_task = parse_thresholds(args.threshold)
        paths = write_report(args.sweep_dir, k=args.k, threshold=default, task_thresholds=per_task, out=args.out,
                             charts=not args.no_charts, resamples=args.resamples, ci_seed=args.ci_seed)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # evidence the checks above did not foresee (a table that reads but computes wrong): still
    # one line, never a traceback or a polars panic
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, pa.ArrowException, OSError, ValueError,
            KeyError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: cannot build the report from {args.sweep_dir}: {type(exc).__name__}: {first}", file=sys.stderr)
        return 2
    with open(paths.summary_md) as handle:
        print(handle.read(), end="")
    print(f"\nreport: {paths.report_dir} ({len(paths.charts)} chart files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
