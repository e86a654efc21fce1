"""`python -m harness export mlflow PATH [--uri URI] [--experiment NAME]`: export evidence
that exists (one run's folder, or a sweep folder: each of its finished runs) to MLflow.
Idempotent: a run exported before is left as it is, or replaced when its evidence changed.

Exit codes: 0 every run exported; 1 some run not exported (each said in one line);
2 bad input (MLflow not installed, no such folder, a store that does not open)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from harness.errors import ConfigError, HarnessError
from harness.tracking.settings import MlflowTarget, TrackingConfig, require_mlflow, resolve_target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness export",
                                     description="Export existing run evidence to an experiment tracker.")
    parser.add_argument("backend", choices=["mlflow"], help="the tracker")
    parser.add_argument("path", help="a run folder (with manifest.json) or a sweep folder")
    parser.add_argument("--uri", default=None, help="MLflow tracking URI (default: sqlite:///<evidence root>/"
                                                    ".mlflow/mlflow.db, the store tracking=mlflow writes)")
    parser.add_argument("--experiment", default=None, help="experiment name (default: each run's sweep name)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=False)
    try:
        code = _export(Path(args.path), TrackingConfig(uri=args.uri, experiment=args.experiment), console)
    except HarnessError as exc:
        console.print(f"error: {exc}", style="red", highlight=False, markup=False, soft_wrap=True)
        return 2
    return code


def _export(path: Path, config: TrackingConfig, console: Console) -> int:
    require_mlflow()  # before importing what imports MLflow
    from harness.tracking.hooks import open_target
    from harness.tracking.mlflow_export import export_run
    from harness.tracking.record import read_run, run_dirs

    opened: set[MlflowTarget] = set()
    failed = 0
    for folder in run_dirs(path):
        # a run folder sits in its sweep's folder, under the evidence root: the default store's place
        evidence_root = folder.resolve().parent.parent
        try:
            record = read_run(folder)
            target = resolve_target(config, evidence_root, record.sweep)
            if target not in opened:  # a store that does not open ends the command (exit 2)
                open_target(config, str(evidence_root), record.sweep)
                opened.add(target)
            result = export_run(record, target)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - this run is not exported; the others still are
            failed += 1
            reason = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
            console.print(f"run {folder.name}: not exported: {reason.splitlines()[0] if reason else ''}",
                          style="yellow", highlight=False, markup=False, soft_wrap=True)
            continue
        console.print(f"run {result.harness_run_id}: {result.action} (MLflow run {result.mlflow_run_id}, experiment "
                      f"{target.experiment!r})", highlight=False, markup=False, soft_wrap=True)
    for uri in sorted({t.uri for t in opened}):
        console.print(f"store: {uri}; view: mlflow ui --backend-store-uri {uri}", highlight=False, markup=False,
                      soft_wrap=True)
    return 1 if failed else 0
