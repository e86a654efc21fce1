"""Evidence in, report files out: list a sweep's expected runs (sweep.json's grid) joined to
the runs that finished, refuse evidence of another schema version, scan the Parquet tables
lazily, and write outputs deterministically (sorted rows, no timestamps, atomic renames)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from harness.atomic import atomic_write
from harness.evidence.reader import (
    EvidenceError, Target, check_parquet_version, expected_grid, first_line, read_manifest, verify_files,
)
from harness.evidence.schema import CANDIDATES, PROPOSALS, ROLLOUTS
from harness.evidence.writer import MANIFEST

# grid axes with a fixed role in the report; every other axis splits cells
ROLE_AXES = ("container", "algorithm", "seed")
ROLLOUT_COLUMNS = ("run_id", "seq", "candidate_id", "task_id", "stage", "reward", "status")
CANDIDATE_COLUMNS = ("run_id", "candidate_id", "index", "origin", "rollouts_at_creation", "cost_usd_at_creation",
                     "elapsed_s_at_creation")
PROPOSAL_COLUMNS = ("run_id", "child_id", "parent_id", "accepted", "parent_minibatch_score",
                    "child_minibatch_score")
RUNS_SCHEMA: dict[str, Any] = {
    "run_id": pl.String, "task": pl.String, "stack": pl.String, "seed": pl.Int64, "status": pl.String,
    "seed_candidate_id": pl.String, "pick_candidate_id": pl.String, "policy_model": pl.String,
    "proposer_model": pl.String,
    # where each run's search ended, on the best-vs charts' axes (rollouts, USD, seconds)
    "end_rollouts": pl.Float64, "end_cost_usd": pl.Float64, "end_elapsed_s": pl.Float64,
}
FLOAT_DIGITS = 9


ReportError = EvidenceError  # the report's one error type: a problem with the evidence, stated in one line


def locate(path: str | Path) -> Target:
    given = Path(path)
    if not given.is_dir():
        raise ReportError(f"{given}: no such directory")
    if (given / MANIFEST).is_file():  # one run's directory: a report of that run
        return Target(given.parent, (given.name,))
    if any((given / f"{table}.parquet").is_file() for table in ("rollouts", "candidates", "events")):
        raise ReportError(f"{given}: an unfinished run (no {MANIFEST} yet): nothing to report")
    return Target(given)


def _only(values: set[str]) -> str:
    return next(iter(values)) if len(values) == 1 else "unknown"


def load_runs(target: Target, threshold: float = 1.0,
              task_thresholds: Mapping[str, float] | None = None) -> tuple[pl.DataFrame, list[str]]:
    """One row per expected run (finished or not) and the sweep's extra axes.

    Axis values come from the grid, so a missing run still lands in its cell; task and stack
    fall back to the manifest's spec, then to the sweep's only value."""
    root = target.root
    grid = expected_grid(target)
    axes = sorted({k for point in grid for k in point if k not in ("run_id", *ROLE_AXES)})
    # a run that failed before writing evidence (its container never started) is in the index only
    index = root / "index.parquet"
    failed_early: set[str] = set()
    if index.is_file():
        try:
            failed_early = set(pl.read_parquet(index, columns=["run_id", "status"]).filter(
                pl.col("status") == "failed")["run_id"])
        except (OSError, pl.exceptions.PolarsError, pa.ArrowException) as exc:
            raise ReportError(f"{index}: unreadable sweep index: {first_line(exc)}") from exc
    rows = []
    for point in grid:
        manifest = read_manifest(root / point["run_id"]) or {}
        spec = manifest.get("spec") or {}
        seed = point.get("seed", spec.get("seed"))
        rows.append({
            "run_id": point["run_id"],
            "task": point.get("container") or (spec.get("container") or {}).get("name"),
            "stack": point.get("algorithm") or (spec.get("algorithm") or {}).get("name"),
            "seed": int(seed) if seed is not None else None,
            "status": manifest.get("status", "failed" if point["run_id"] in failed_early else "missing"),
            "seed_candidate_id": manifest.get("seed_candidate_id"),
            "pick_candidate_id": manifest.get("best_candidate_id"),  # the run's own pick
            "policy_model": (spec.get("policy") or {}).get("model"),
            "proposer_model": (spec.get("proposer") or {}).get("model"),
            "end_rollouts": (manifest.get("totals") or {}).get("rollouts"),
            "end_cost_usd": (manifest.get("totals") or {}).get("cost_usd"),
            "end_elapsed_s": (manifest.get("timings") or {}).get("optimize_s"),
            **{axis: point.get(axis, "-") for axis in axes},
        })
    runs = pl.DataFrame(rows, schema={**RUNS_SCHEMA, **{axis: pl.String for axis in axes}})
    tasks, stacks = set(runs["task"].drop_nulls()), set(runs["stack"].drop_nulls())
    mapping = dict(task_thresholds or {})
    unknown = sorted(set(mapping) - tasks)
    if unknown:
        raise ReportError(f"threshold given for unknown task(s) {', '.join(unknown)}; tasks are "
                          f"{', '.join(sorted(tasks)) or 'none'}")
    runs = runs.with_columns(
        pl.col("task").fill_null(_only(tasks)), pl.col("stack").fill_null(_only(stacks)),
    ).with_columns(
        done=pl.col("status") == "done",
        threshold=pl.col("task").replace_strict(mapping, default=threshold, return_dtype=pl.Float64),
    )
    return runs.sort("task", "stack", *axes, "seed", "run_id"), axes


def _empty(schema: pa.Schema, columns: tuple[str, ...]) -> pl.LazyFrame:
    return pl.from_arrow(schema.empty_table()).lazy().select(columns)  # type: ignore[union-attr]


@dataclass(frozen=True)
class Tables:
    rollouts: pl.LazyFrame
    candidates: pl.LazyFrame
    proposals: pl.LazyFrame


def scan_tables(root: Path, run_ids: list[str]) -> Tables:
    """Lazy scans of the finished runs' rollouts, candidates and proposals, after checking every
    file's schema version (footers only), then its sha256 against the manifest's, then its columns."""
    tables = (("rollouts", ROLLOUTS, ROLLOUT_COLUMNS), ("candidates", CANDIDATES, CANDIDATE_COLUMNS),
              ("proposals", PROPOSALS, PROPOSAL_COLUMNS))
    for run_id in sorted(run_ids):
        for table, _, _ in tables:
            path = root / run_id / f"{table}.parquet"
            if not path.is_file():
                raise ReportError(f"{path}: missing from a finished run")
            check_parquet_version(path)  # evidence of another version: say so, not "changed"
        verify_files(root / run_id, read_manifest(root / run_id) or {})
    scans = []
    for table, schema, columns in tables:
        paths = [root / run_id / f"{table}.parquet" for run_id in sorted(run_ids)]
        for path in paths:
            check_parquet_version(path, columns)
        scans.append(pl.scan_parquet([str(p) for p in paths]).select(columns) if paths else _empty(schema, columns))
    # only an "ok" row has a reward: error and refused rows count as rows, never as zeros
    rollouts = scans[0].with_columns(reward=pl.when(pl.col("status") == "ok").then(pl.col("reward")))
    return Tables(rollouts, scans[1], scans[2])


def rounded(frame: pl.DataFrame) -> pl.DataFrame:
    """Round floats so that summation order (thread scheduling) cannot change output bytes."""
    return frame.with_columns(pl.col(pl.Float64).round(FLOAT_DIGITS))


def _atomic(path: Path, content: bytes | Callable[[str], None]) -> Path:
    atomic_write(path, content)  # a failed write (disk full) leaves nothing behind
    return path


def write_parquet(frame: pl.DataFrame, path: Path) -> Path:
    return _atomic(path, lambda p: frame.write_parquet(p, compression="zstd", statistics=True))


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_json(frame: pl.DataFrame, path: Path, **extra: Any) -> Path:
    rows = [{k: _clean(v) for k, v in row.items()} for row in frame.to_dicts()]
    body = json.dumps({**extra, "rows": rows}, indent=2, sort_keys=True, allow_nan=False) + "\n"
    return _atomic(path, body.encode())


def write_text(text: str, path: Path) -> Path:
    return _atomic(path, text.encode())
