"""A RunRecord into MLflow, through MLflow's own client: one MLflow run per harness run,
in an experiment per sweep, tagged `harness.run_id`.

Idempotent: an export looks the run up by that tag first. The same evidence exported
before (tag `harness.export_digest`, set last, so a half-finished export never has it) is
left as it is; other evidence of the same run (redone with force=true, or a newer export
format) replaces it: MLflow params are immutable and metric history only grows, so the old
MLflow run is deleted (MLflow's soft delete; `mlflow gc` purges) and a new one logged.

Imported only when tracking is asked for: MLflow is an optional extra."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, TypeVar

# MLflow reports usage to its makers unless told not to: an experiment harness sends nothing
# anywhere by default (MLFLOW_DISABLE_TELEMETRY=false in the environment turns it back on)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param, RunStatus, ViewType  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH  # noqa: E402
from pydantic import BaseModel, ConfigDict

from harness.tracking.record import ExportError, RunRecord
from harness.tracking.settings import MlflowTarget

RUN_ID_TAG = "harness.run_id"
DIGEST_TAG = "harness.export_digest"
NOTE_TAG = "mlflow.note.content"  # the run page's description (markdown)
SAFE_RUN_ID = re.compile(r"[A-Za-z0-9_.-]+")
T = TypeVar("T")


class ExportResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    harness_run_id: str
    mlflow_run_id: str
    experiment_id: str
    # created: first export; replaced: other evidence of that run was there; unchanged: skipped
    action: Literal["created", "replaced", "unchanged"]


def prepare(target: MlflowTarget) -> str:
    """Open the store and make the experiment, before any run starts: a bad URI fails the
    command up front, and a new SQLite store is created (migrated) once, not by several
    sweep workers at the same time. Returns the experiment id."""
    with _quiet_mlflow(), _store_lock(target.uri):
        return _experiment_id(MlflowClient(tracking_uri=target.uri), target)


def export_run(record: RunRecord, target: MlflowTarget) -> ExportResult:
    if not SAFE_RUN_ID.fullmatch(record.run_id):
        raise ExportError(f"run id {record.run_id!r} is not a plain name")
    with _quiet_mlflow(), _store_lock(target.uri):
        try:
            return _export(MlflowClient(tracking_uri=target.uri), record, target)
        except MlflowException as exc:
            raise ExportError(f"MLflow: {_first_line(exc)}") from exc


def _export(client: MlflowClient, record: RunRecord, target: MlflowTarget) -> ExportResult:
    experiment_id = _experiment_id(client, target)
    existing = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{record.run_id}'",
                                  run_view_type=ViewType.ACTIVE_ONLY)
    kept = next((r for r in existing if r.data.tags.get(DIGEST_TAG) == record.digest), None)
    if kept is not None:
        for stale in existing:  # one MLflow run per harness run, whatever happened before
            if stale.info.run_id != kept.info.run_id:
                client.delete_run(stale.info.run_id)
        return ExportResult(harness_run_id=record.run_id, mlflow_run_id=kept.info.run_id,
                            experiment_id=experiment_id, action="unchanged")
    for stale in existing:
        client.delete_run(stale.info.run_id)
    run = client.create_run(experiment_id, start_time=record.started_ms, run_name=record.run_name,
                            tags={**record.tags, NOTE_TAG: record.description, "mlflow.source.name": "gepa-harness"})
    mlflow_run_id = run.info.run_id
    try:
        _log(client, mlflow_run_id, record)
        status = RunStatus.to_string(RunStatus.FINISHED if record.status == "done" else RunStatus.FAILED)
        client.set_terminated(mlflow_run_id, status=status, end_time=record.finished_ms)
        client.set_tag(mlflow_run_id, DIGEST_TAG, record.digest)  # last: marks the export complete
    except BaseException:
        with contextlib.suppress(Exception):  # no half-logged run left to look complete
            client.delete_run(mlflow_run_id)
        raise
    return ExportResult(harness_run_id=record.run_id, mlflow_run_id=mlflow_run_id, experiment_id=experiment_id,
                        action="replaced" if existing else "created")


def _log(client: MlflowClient, run_id: str, record: RunRecord) -> None:
    params = [Param(k, v[:MAX_PARAM_VAL_LENGTH]) for k, v in sorted(record.params.items())]
    for chunk in _chunks(params, MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=chunk)
    metrics = [Metric(m.key, m.value, m.timestamp_ms, m.step) for m in record.metrics]
    for batch in _chunks(metrics, MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=batch)
    for folder, texts in sorted(record.candidate_texts.items()):
        for module, text in sorted(texts.items()):
            client.log_text(run_id, text, f"{folder}/{_file_name(module)}.txt")
    for path in record.evidence_files:
        client.log_artifact(run_id, path, "evidence")
    for path in record.log_files:
        client.log_artifact(run_id, path, "logs")


def _experiment_id(client: MlflowClient, target: MlflowTarget) -> str:
    experiment = client.get_experiment_by_name(target.experiment)
    if experiment is None:
        try:
            return client.create_experiment(target.experiment, artifact_location=target.artifact_location,
                                            tags={"harness.sweep": target.experiment})
        except MlflowException:
            experiment = client.get_experiment_by_name(target.experiment)  # made meanwhile by another process
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    return experiment.experiment_id


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """One writer at a time on a SQLite store (sweep workers finish runs concurrently; SQLite
    takes one writer and MLflow's first open migrates the schema). Other stores serve
    concurrent clients themselves."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///").partition("?")[0])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow's INFO lines (creating the database tables) would break the harness's
    one-line-per-event output."""
    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


def _file_name(module: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", module).strip(".") or "module"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
