"""Where the harness calls the tracker. Before any work: `open_target` (the extra is
installed, the store opens, the experiment exists). After a run's evidence is final, in
the process that finished it (the entry point for a single run, the Ray worker for a
sweep's run, the sweep driver for runs it skipped as already done): `export_finished`,
which never raises: a tracking failure is one line, and the run, its evidence and its
status stay as they are."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from harness.errors import ConfigError, HarnessError
from harness.tracking.settings import MlflowTarget, TrackingConfig, require_mlflow, resolve_target


class ExportNote(BaseModel):
    model_config = ConfigDict(frozen=True)
    ok: bool
    message: str  # one line


def open_target(config: TrackingConfig | None, evidence_root: str, sweep: str) -> MlflowTarget | None:
    """None without tracking; else the target, checked. ConfigError (one line) otherwise."""
    if config is None:
        return None
    require_mlflow()
    target = resolve_target(config, evidence_root, sweep)
    from harness.tracking.mlflow_export import prepare

    try:
        prepare(target)
    except Exception as exc:  # noqa: BLE001 - any store problem is bad input, said in one line
        raise ConfigError(f"cannot open the MLflow store {target.uri}: {_one_line(exc)}") from exc
    return target


def export_finished(target: MlflowTarget, run_dir: str) -> ExportNote:
    try:
        from harness.tracking.mlflow_export import export_run
        from harness.tracking.record import read_run

        result = export_run(read_run(run_dir), target)
    except Exception as exc:  # noqa: BLE001 - the run is done whatever the tracker says
        return ExportNote(ok=False, message=f"tracking: run not exported to MLflow at {target.uri}: {_one_line(exc)}")
    return ExportNote(ok=True, message=f"tracking: MLflow run {result.mlflow_run_id} {result.action} in experiment "
                                       f"{target.experiment!r} ({target.uri})")


def ui_hint(target: MlflowTarget) -> str:
    return f"view: mlflow ui --backend-store-uri {target.uri}"


def _one_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, HarnessError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
