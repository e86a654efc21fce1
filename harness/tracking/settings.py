"""Tracking settings: the `tracking` config group (Hydra stops at the entry point, so this
is what the harness sees) and the resolved MLflow target. No MLflow import here: the
harness must start, and say what is missing, without the optional extra."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from harness.errors import ConfigError

INSTALL_HINT = "pip install -e '.[mlflow]'"
# The default store, beside the sweeps under the evidence root: one database for every
# sweep (an experiment each), so the MLflow UI compares sweeps side by side. A leading dot:
# never a sweep's name (EvidenceLocation refuses those), so it cannot clash with one.
STORE_DIR = ".mlflow"


class TrackingConfig(BaseModel):
    """configs/tracking/<backend>.yaml; `tracking: null` (the default) exports nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backend: Literal["mlflow"] = "mlflow"
    # null: a SQLite store under the evidence root (see default_store); else any MLflow URI
    uri: str | None = None
    # null: the sweep's name (`local` for single runs)
    experiment: str | None = None


class MlflowTarget(BaseModel):
    """Where a run goes: a tracking URI, an experiment name, and where that experiment's
    artifacts live when the harness creates it (None: the store's own default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    uri: str
    experiment: str
    artifact_location: str | None = None


def default_store(evidence_root: str | Path) -> tuple[str, str]:
    """(tracking URI, artifact location) of the store under `evidence_root`. SQLite, not a
    `file:` store: MLflow 3 refuses `file:` stores unless MLFLOW_ALLOW_FILE_STORE=true
    (maintenance mode), while `mlflow ui --backend-store-uri sqlite:///...` just opens this."""
    store = Path(evidence_root).resolve() / STORE_DIR
    return f"sqlite:///{store / 'mlflow.db'}", (store / "artifacts").as_uri()


def resolve_target(config: TrackingConfig, evidence_root: str | Path, sweep: str) -> MlflowTarget:
    if "://" in str(evidence_root):
        raise ConfigError(f"tracking=mlflow exports from the evidence files, and evidence_root {str(evidence_root)!r} "
                          "is not a local folder: run without tracking, then `python -m harness export mlflow` on a "
                          "local copy of the sweep folder")
    experiment = config.experiment or sweep
    if config.uri and config.uri.startswith("sqlite:///"):
        # MLflow's default for a SQLite store is ./mlruns in whatever folder the command ran
        # from: keep a new experiment's artifacts beside the database instead
        database = Path(config.uri.removeprefix("sqlite:///").partition("?")[0]).resolve()
        return MlflowTarget(uri=config.uri, experiment=experiment,
                            artifact_location=(database.parent / "mlartifacts").as_uri())
    if config.uri:  # a server or another database: it knows where its artifacts go
        return MlflowTarget(uri=config.uri, experiment=experiment)
    uri, artifacts = default_store(evidence_root)
    return MlflowTarget(uri=uri, experiment=experiment, artifact_location=artifacts)


def require_mlflow() -> None:
    """One line naming the fix when the optional extra is not installed (before any work)."""
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(f"tracking=mlflow needs MLflow, which is not installed: {INSTALL_HINT}")
