"""Compare two evidence roots run by run: every Parquet table and manifest must agree,
apart from what depends on the wall clock or the transport (schema TIMING_COLUMNS and
TRANSPORT_COLUMNS; the manifest's timings, log paths, package versions, model server builds, file checksums and
the gateway's URL, and the node a run ran on).

    python -m benchmarks.compare_evidence EVIDENCE_ROOT_A EVIDENCE_ROOT_B

Exits 1 and names the first differences when they do not agree (e.g. a refactoring that
changed a result, or a replay that did not reproduce its recording)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import polars as pl

from harness.evidence.schema import TABLES, TIMING_COLUMNS, TRANSPORT_COLUMNS

# manifest entries that say where or when a run happened, not what it found ("files" holds
# checksums of the tables, which carry timings: the tables are compared column by column;
# "node" is the Ray node and its service endpoints)
_PLACE_AND_TIME = frozenset({"timings", "logs", "versions", "model_servers", "files", "node"})


def run_dirs(root: Path) -> dict[str, Path]:
    """Each run's directory under `root`, by `<sweep>/<run id>`."""
    return {f"{m.parent.parent.name}/{m.parent.name}": m.parent for m in sorted(root.glob("*/*/manifest.json"))}


def comparable_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in manifest.items() if k not in _PLACE_AND_TIME}
    spec = dict(kept.get("spec") or {})
    spec.pop("evidence_root", None)
    kept["spec"] = spec
    if kept.get("gateway"):
        kept["gateway"] = {k: v for k, v in kept["gateway"].items() if k != "url"}
    return kept


def table_differences(name: str, a: Path, b: Path) -> list[str]:
    left, right = pl.read_parquet(a / f"{name}.parquet"), pl.read_parquet(b / f"{name}.parquet")
    drop = [c for c in left.columns if c in TIMING_COLUMNS | TRANSPORT_COLUMNS]
    left, right = left.drop(drop), right.drop([c for c in drop if c in right.columns])
    if left.columns != right.columns:
        return [f"{name}: columns {left.columns} != {right.columns}"]
    if left.height != right.height:
        return [f"{name}: {left.height} rows != {right.height}"]
    return [f"{name}: column {c!r} differs" for c in left.columns if not left[c].equals(right[c], null_equal=True)]


def differences(root_a: Path, root_b: Path) -> list[str]:
    runs_a, runs_b = run_dirs(root_a), run_dirs(root_b)
    if set(runs_a) != set(runs_b):
        return [f"runs differ: only in A {sorted(set(runs_a) - set(runs_b))}, "
                f"only in B {sorted(set(runs_b) - set(runs_a))}"]
    found = []
    for run, a in runs_a.items():
        b = runs_b[run]
        manifests = [comparable_manifest(json.loads((d / "manifest.json").read_text())) for d in (a, b)]
        if manifests[0] != manifests[1]:
            missing = object()  # a key on one side only differs even when the other side holds null
            keys = sorted(k for k in manifests[0].keys() | manifests[1].keys()
                          if manifests[0].get(k, missing) != manifests[1].get(k, missing))
            found.append(f"{run}: manifest differs in {keys}")
        found += [f"{run}: {d}" for name in TABLES for d in table_differences(name, a, b)]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.compare_evidence EVIDENCE_ROOT_A EVIDENCE_ROOT_B", file=sys.stderr)
        return 2
    root_a, root_b = Path(argv[0]), Path(argv[1])
    for root in (root_a, root_b):
        if not run_dirs(root):
            print(f"no run evidence (<sweep>/<run id>/manifest.json) under {root}", file=sys.stderr)
            return 2
    found = differences(root_a, root_b)
    for line in found[:40]:
        print(line)
    print(f"{len(run_dirs(root_a))} runs compared: " + ("identical" if not found else f"{len(found)} differences"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
