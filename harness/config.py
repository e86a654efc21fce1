"""From a composed Hydra config (as a plain dict) to frozen specs. Hydra stops here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from algorithms.registry import build_optimizer, params_from_container
from harness.errors import ConfigError, first_error
from harness.gateway.models import GatewaySettings
from harness.services import LocalServerOptions
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, Pools, PoolSpec, RunSpec
from harness.tracking.settings import TrackingConfig

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")  # the Hydra config tree


class PoolsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    train: PoolSpec
    pareto: PoolSpec
    heldout: PoolSpec
    allow_overlap: bool = False

    def resolve(self) -> Pools:
        strata = {name: chosen for name, spec in (("train", self.train), ("pareto", self.pareto),
                                                  ("heldout", self.heldout)) if (chosen := spec.strata())}
        return Pools(train=self.train.resolve(), pareto=self.pareto.resolve(), heldout=self.heldout.resolve(),
                     allow_overlap=self.allow_overlap, stratify=strata)


class RayConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    address: str | None = None
    max_runs_in_flight: int = Field(default=2, gt=0)
    cpus_per_run: float = Field(default=0.5, gt=0)
    container_concurrency: int = Field(default=8, gt=0)  # rollouts in flight per container, across runs
    model_concurrency: int = Field(default=4, gt=0)  # calls in flight per model endpoint, across runs


class HarnessConfig(BaseModel):
    """The composed config, validated; a misspelled key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    container: ContainerSpec
    policy: ModelSpec
    proposer: ModelSpec
    algorithm: AlgorithmSpec
    pools: PoolsConfig
    budget: BudgetSpec
    seed: int = 0
    concurrency: int = Field(default=2, gt=0)
    checkpoint_every_s: float = Field(default=10.0, gt=0)
    progress_every_s: float = Field(default=30.0, gt=0)  # progress lines when stdout is not a terminal
    max_error_rate: float = Field(default=0.5, ge=0.0, le=1.0)
    heldout_candidates: Any = "best"
    evidence_root: str = "evidence"
    force: bool = False  # redo runs that are done (their evidence is replaced only if they finish again)
    data_dir: str | None = None
    local_server: LocalServerOptions = LocalServerOptions()
    ray: RayConfig = RayConfig()
    gateway: GatewaySettings = GatewaySettings()
    sweep: dict[str, Any] | None = None
    tracking: TrackingConfig | None = None  # None: runs are not exported to a tracker
    # the models profile's axis defaults per shipped sweep, read by the sweep files
    sweep_axes: dict[str, dict[str, list[str]]] = {}


def _first_error(exc: ValidationError) -> str:
    error = first_error(exc)
    # a model-level check (e.g. Pools' overlap check) has an empty location: name the model
    where = error.where or exc.title.lower()
    if error.kind == "extra_forbidden":
        return f"unknown config key '{where}' (misspelled?)"
    return f"config '{where}': {error.message}"


def load_config(raw: dict[str, Any], base_dir: str | None = None) -> HarnessConfig:
    """Validate the composed config; relative paths resolve against the directory the user ran from."""
    base = Path(base_dir or os.getcwd())
    data = dict(raw)
    if data.get("data_dir"):
        data["data_dir"] = str((base / data["data_dir"]).resolve())
        container = dict(data.get("container") or {})
        if container.get("data_dir"):
            container["data_dir"] = str((base / container["data_dir"]).resolve())
        data["container"] = container
    if data.get("evidence_root") and "://" not in data["evidence_root"]:
        data["evidence_root"] = str((base / data["evidence_root"]).resolve())
    try:
        return HarnessConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_first_error(exc)) from exc


def run_spec(config: HarnessConfig, *, sweep: str = "local", axes: dict[str, str] | None = None) -> RunSpec:
    algorithm = config.algorithm.model_copy(update={"params": params_from_container(
        config.algorithm.name, config.algorithm.params, config.container)})
    try:
        spec = RunSpec(
            sweep=sweep, container=config.container, policy=config.policy, proposer=config.proposer,
            algorithm=algorithm, pools=config.pools.resolve(), budget=config.budget, seed=config.seed,
            heldout_candidates=config.heldout_candidates, concurrency=config.concurrency,
            checkpoint_every_s=config.checkpoint_every_s,
            evidence_root=config.evidence_root, axes=axes or {},
        )
    except ValidationError as exc:
        raise ConfigError(_first_error(exc)) from exc
    # the algorithm's own params are its optimizer's to judge: refused here, before any
    # service starts (a sweep: before Ray), not when the run's turn comes
    build_optimizer(spec.algorithm.name, spec.algorithm.params)
    return spec
