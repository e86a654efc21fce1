"""A sweep's closing summary is written by the report registered under the
`gepa_harness.report` entry point (`benchmarks.report`, declared in pyproject.toml), so the
harness ends a sweep with its report without importing the package that holds it."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Protocol

ENTRY_POINT_GROUP = "gepa_harness.report"
SUMMARY_WRITER = "sweep_summary"


class WrittenReport(Protocol):
    report_dir: str  # the folder holding summary.md


class SummaryWriter(Protocol):
    def __call__(self, sweep_dir: str) -> WrittenReport: ...


def summary_writer() -> SummaryWriter | None:
    """The installed report's writer, or None when no package registers one."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=SUMMARY_WRITER)
    return next(iter(found)).load() if found else None
