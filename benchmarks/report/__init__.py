"""Sweep reports regenerated from Parquet evidence alone: ``write_report(sweep_dir)`` or
``python -m benchmarks.report <evidence_root>/<sweep>``. Definitions: benchmarks.report.metrics."""

from benchmarks.report.io import ReportError, SchemaVersionError
from benchmarks.report.pipeline import ReportFrames, ReportOptions, ReportPaths, compute_report, write_report

__all__ = ["ReportError", "ReportFrames", "ReportOptions", "ReportPaths", "SchemaVersionError", "compute_report",
           "write_report"]
