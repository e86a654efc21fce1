"""Reports regenerated from Parquet evidence alone: ``write_report(path)`` or ``python -m
benchmarks.report PATH`` for a sweep, a folder of single runs or one run. Definitions:
benchmarks.report.metrics (cells, noise floor), trace (a run's trace), conclusions (titles)."""

from benchmarks.report.frames import ReportFrames, ReportOptions
from benchmarks.report.io import ReportError
from benchmarks.report.pipeline import ReportPaths, compute_report, write_report
from harness.evidence.reader import SchemaVersionError

__all__ = ["ReportError", "ReportFrames", "ReportOptions", "ReportPaths", "SchemaVersionError", "compute_report",
           "write_report"]
