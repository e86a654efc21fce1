"""Find and read the evidence a page is built from. Everything is checked before a page is
written: the path is a sweep or a run folder, manifests and tables carry this schema version,
and every table file is the one the run wrote (its sha256 matches the manifest's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import polars as pl

from harness.errors import HarnessError
from harness.evidence.reader import (
    EvidenceError, check_parquet_version, expected_grid, read_manifest, recorded_thresholds, verify_files,
)
from harness.evidence.reader import Target as EvidenceTarget
from harness.evidence.schema import TABLES
from harness.evidence.writer import MANIFEST

SWEEP_MARKERS = ("sweep.json", "index.parquet")
VIEW_DIR = "view"


class ViewError(HarnessError):
    """Evidence that cannot be shown, stated in one line."""


@dataclass(frozen=True)
class Target:
    """What PATH is: one run's folder or a sweep's folder."""

    kind: Literal["run", "sweep"]
    path: Path


@dataclass(frozen=True)
class RunEvidence:
    run_dir: Path
    manifest: dict[str, Any]
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)  # every table of the schema, empty when absent
    solved_threshold: float = 1.0


def locate(path: str | Path) -> Target:
    """A run folder has manifest.json; a sweep folder has sweep.json, index.parquet or run
    folders. Anything else is refused with what was expected."""
    root = Path(path)
    if not root.exists():
        raise ViewError(f"{root}: no such file or directory")
    if not root.is_dir():
        raise ViewError(f"{root}: not a folder; give an evidence folder: evidence/<sweep> or evidence/<sweep>/<run_id>")
    if (root / MANIFEST).is_file():
        return Target("run", root)
    if any((root / marker).is_file() for marker in SWEEP_MARKERS) or any(
            (child / MANIFEST).is_file() for child in root.iterdir() if child.is_dir()):
        return Target("sweep", root)
    if any((root / f"{table}.parquet").is_file() for table in TABLES):
        raise ViewError(f"{root}: a run folder without manifest.json (an unfinished run, or one still running): "
                        "nothing to view until it finishes")
    raise ViewError(f"{root}: not evidence: expected a sweep folder (sweep.json, index.parquet or run folders with "
                    "manifest.json) or a run folder (manifest.json)")


def _threshold(run_dir: Path, manifest: dict[str, Any]) -> float:
    """The container's solved threshold as the sweep recorded it (sweep.json), else 1.0."""
    container = ((manifest.get("spec") or {}).get("container") or {}).get("name")
    return recorded_thresholds(run_dir.parent).get(str(container), 1.0)


def check_run(run_dir: str | Path) -> dict[str, Any]:
    """A finished (or failed) run's manifest, after checking that every table it lists carries
    this schema version and is the file the run wrote; the tables are not read."""
    root = Path(run_dir)
    try:
        manifest = read_manifest(root)
        if manifest is None:
            raise ViewError(f"{root}: no manifest.json: not a finished run")
        for name in manifest.get("files") or {}:
            check_parquet_version(root / name)  # another version: say so, not "changed"
        verify_files(root, manifest)
        return manifest
    except EvidenceError as exc:
        raise ViewError(str(exc)) from exc


def load_run(run_dir: str | Path) -> RunEvidence:
    """check_run, then the tables: a table the manifest does not list (a run that failed
    before writing it) is empty, which shows as nothing recorded, never as zeros."""
    root = Path(run_dir)
    manifest = check_run(root)
    listed = set(manifest.get("files") or {})
    tables = {name: pl.read_parquet(root / f"{name}.parquet") if f"{name}.parquet" in listed
              else pl.from_arrow(schema.empty_table()) for name, schema in TABLES.items()}
    return RunEvidence(run_dir=root, manifest=manifest, tables=tables,  # type: ignore[arg-type]
                       solved_threshold=_threshold(root, manifest))


def sweep_runs(sweep_dir: Path) -> list[dict[str, str]]:
    """The sweep's expected runs (sweep.json's grid, else the run folders), each with its axes."""
    try:
        return expected_grid(EvidenceTarget(sweep_dir))
    except EvidenceError as exc:
        raise ViewError(str(exc)) from exc


def run_manifest(run_dir: Path) -> dict[str, Any] | None:
    try:
        return read_manifest(run_dir)
    except EvidenceError as exc:
        raise ViewError(str(exc)) from exc
