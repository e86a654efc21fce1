"""Evidence read back, checked: manifests and tables of this schema version, table files
that are the ones the run wrote (sha256 against the manifest's), and the runs a sweep (or a
folder of single runs) is expected to hold. Shared by the report, the view and the exports."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harness.evidence import configs
from harness.evidence.schema import SCHEMA_METADATA_KEY, SCHEMA_VERSION
from harness.evidence.writer import MANIFEST

SWEEP_JSON = "sweep.json"


class EvidenceError(Exception):
    """A problem with the evidence, stated in one line."""


class SchemaVersionError(EvidenceError):
    pass


def _check_version(found: object, where: str) -> None:
    if found != SCHEMA_VERSION:
        raise SchemaVersionError(f"{where}: evidence schema version {found!r}, but this report reads version "
                                 f"{SCHEMA_VERSION!r}; regenerate the evidence or use a matching harness")


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / MANIFEST
    if not path.is_file():
        return None
    manifest = _read_json(path)
    _check_version(manifest.get("schema_version"), str(path))
    return manifest


def check_parquet_version(path: Path, columns: tuple[str, ...] = ()) -> None:
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise EvidenceError(f"{path}: unreadable Parquet file: {first_line(exc)}") from exc
    raw = (schema.metadata or {}).get(SCHEMA_METADATA_KEY)
    _check_version(raw.decode(errors="replace") if raw is not None else None, str(path))
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise EvidenceError(f"{path}: no column {missing[0]!r} (columns: {', '.join(schema.names)})")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvidenceError(f"{path}: unreadable JSON: {first_line(exc)}") from exc
    if not isinstance(value, dict):
        raise EvidenceError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def verify_files(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Every table file is the one the run wrote: its sha256 is the manifest's."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise EvidenceError(f"{run_dir / MANIFEST}: records no table digests ('files'); evidence written before "
                          "digests were recorded cannot be verified: regenerate it")
    for name, entry in sorted(files.items()):
        path = run_dir / name
        expected = entry.get("sha256") if isinstance(entry, dict) else None
        if "/" in name or name.startswith(".") or not isinstance(expected, str):
            raise EvidenceError(f"{run_dir / MANIFEST}: malformed file entry {name!r}")
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise EvidenceError(f"{path}: listed in the manifest but unreadable: {first_line(exc)}") from exc
        if digest != expected:
            raise EvidenceError(f"{path}: sha256 {digest[:16]}... does not match the manifest's {expected[:16]}...: "
                              "the file changed after the run wrote it")


def recorded_thresholds(sweep_dir: str | Path) -> dict[str, float]:
    """Per-task coverage thresholds the sweep recorded from its containers' configs."""
    sweep_file = Path(sweep_dir) / SWEEP_JSON
    if not sweep_file.is_file():
        return {}
    recorded = _read_json(sweep_file).get("solved_thresholds") or {}
    try:
        return {str(task): float(value) for task, value in dict(recorded).items()}
    except (TypeError, ValueError) as exc:
        raise EvidenceError(f"{sweep_file}: solved_thresholds: {first_line(exc)}") from exc


@dataclass(frozen=True)
class Target:
    """Which runs are read: those of ``root`` (a sweep, or a folder of single runs such as
    ``evidence/local``), or only ``run_ids`` when the path given was one run's directory."""
    root: Path
    run_ids: tuple[str, ...] | None = None


def _no_runs(root: Path) -> EvidenceError:
    """What to pass instead: a folder of sweeps names them."""
    inner = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                   and ((p / SWEEP_JSON).is_file() or any(q.is_dir() and (q / MANIFEST).is_file()
                                                          for q in p.iterdir())))
    hint = f"; it holds {', '.join(inner)}: pass one of them" if inner else ""
    return EvidenceError(f"{root}: holds no run (expected a run directory with {MANIFEST}, a sweep with "
                       f"{SWEEP_JSON}, or a folder of run directories such as evidence/local){hint}")


def _manifest_points(root: Path, only: tuple[str, ...] | None) -> list[dict[str, str]]:
    """Without sweep.json every run directory with a manifest is expected, with the axes it
    recorded; runs whose resolved configurations differ (apart from the seed) are told apart
    by a ``config`` axis naming what differs (configs.py), so they never pool into one cell."""
    dirs = sorted(p for p in root.iterdir() if (p / MANIFEST).is_file() and (only is None or p.name in only))
    points, found = [], {}
    for run_dir in dirs:
        manifest = read_manifest(run_dir) or {}
        found[run_dir.name] = configs.run_config(manifest)
        points.append({"run_id": run_dir.name, **{k: str(v) for k, v in (manifest.get("axes") or {}).items()}})
    labels = configs.config_labels(found) if only is None else None
    if labels:
        points = [{**p, configs.CONFIG_AXIS: labels[p["run_id"]]} for p in points]
    return points


def expected_grid(target: Target) -> list[dict[str, str]]:
    """The runs the sweep meant to produce (sweep.json's grid), else the run directories found."""
    sweep_file = target.root / SWEEP_JSON
    if sweep_file.is_file():
        grid = _read_json(sweep_file).get("grid") or []
        if not isinstance(grid, list) or not all(isinstance(p, dict) for p in grid):
            raise EvidenceError(f"{sweep_file}: 'grid' is not a list of objects")
        points = [{k: str(v) for k, v in point.items() if v is not None} for point in grid]
        if target.run_ids is not None:
            points = ([p for p in points if p.get("run_id") in target.run_ids]
                      or _manifest_points(target.root, target.run_ids))
    else:
        points = _manifest_points(target.root, target.run_ids)
    unique = {p["run_id"]: p for p in points if "run_id" in p}
    strays = [r for r in unique if not r or "/" in r or "\\" in r or r.startswith(".")]
    if strays:  # a run id names a directory inside the sweep, never a path out of it
        raise EvidenceError(f"{sweep_file}: run id {strays[0]!r} is not a plain directory name")
    if not unique:
        raise _no_runs(target.root)
    return [unique[run_id] for run_id in sorted(unique)]


def pools_used(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """The rows each pool of a run had: its `pools_used` (a stratified pool's spec holds the
    window its rows were chosen from), or the spec's pools in evidence from before it."""
    used = manifest.get("pools_used")
    pools = used if isinstance(used, dict) else (manifest.get("spec") or {}).get("pools") or {}
    return {name: [str(t) for t in pools[name]] for name in ("train", "pareto", "heldout")
            if isinstance(pools.get(name), list)}
