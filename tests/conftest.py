"""Shared test fixtures. Tests are offline: datasets come from a local folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def shared_datasets_dir() -> Path:
    """$HARNESS_DATA_DIR, else the workspace's `shared/datasets` next to the repository."""
    configured = os.environ.get("HARNESS_DATA_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_datasets_dir()
    if not path.is_dir():  # an error, not a skip: a suite that skips its data tests could pass having tested little
        pytest.fail(f"dataset folder {path} not found: set HARNESS_DATA_DIR to the shared datasets folder",
                    pytrace=False)
    return path


# ---------------------------------------------------------------- shared servers and specs
# Real processes and real loopback servers: the banking77 / heart_disease containers as
# child processes (harness.services.Services); in-process servers are in servers.py.

REPO = Path(__file__).resolve().parents[1]
CONTAINER_MODULES = {"banking77": "stage2_system", "heart_disease": "system", "healthbench": "stage1_system"}


def container_spec(name: str, data_dir: Path, **fields: Any):
    """The spec of a reference container started as a child process (as configs/container/*.yaml)."""
    from harness.specs import ContainerSpec

    return ContainerSpec(name=name, command=["python", "-m", f"benchmarks.containers.{name}"],
                         data_dir=str(data_dir), target_modules=[CONTAINER_MODULES[name]], **fields)


def scripted_spec(script: str = "rules", max_tokens: int = 24):
    from harness.specs import ModelSpec

    return ModelSpec(provider="scripted", model=f"scripted-{script}", source=script, max_tokens=max_tokens)


def make_run_spec(container: Any, evidence_root: Path | str, *, train: list[str], pareto: list[str],
                  heldout: list[str], max_rollouts: int, seed: int = 0, params: dict[str, Any] | None = None,
                  proposer_script: str = "rules", algorithm: str = "gepa", **budget: Any):
    """A RunSpec for a scripted policy and proposer; `budget` adds max_wall_s etc."""
    from harness.specs import AlgorithmSpec, BudgetSpec, Pools, RunSpec

    return RunSpec(
        container=container, policy=scripted_spec("rules"), proposer=scripted_spec(proposer_script, 4000),
        algorithm=AlgorithmSpec(name=algorithm, params=params or {}),
        pools=Pools(train=tuple(train), pareto=tuple(pareto), heldout=tuple(heldout)),
        budget=BudgetSpec(max_rollouts=max_rollouts, **budget), seed=seed, concurrency=4,
        evidence_root=str(evidence_root),
    )


def execute(spec: Any, container_url: str, policy_url: str, proposer_url: str | None = None, **kwargs: Any):
    """harness.run.run_sync on the given endpoints (proposer defaults to the policy server);
    keyword arguments go on to it (max_error_rate, force, rollout_gate)."""
    from harness.run import run_sync
    from harness.services import Endpoints

    endpoints = Endpoints(container_url=container_url, policy_url=policy_url, proposer_url=proposer_url or policy_url)
    return run_sync(spec, endpoints, **kwargs)


def read_evidence(run_dir: str | Path) -> dict[str, Any]:
    """manifest.json and the four tables (polars) of a finished run."""
    import polars as pl

    run_dir = Path(run_dir)
    out: dict[str, Any] = {"manifest": json.loads((run_dir / "manifest.json").read_text())}
    for name in ("rollouts", "candidates", "proposals", "events"):
        out[name] = pl.read_parquet(run_dir / f"{name}.parquet")
    return out


def run_cli(*overrides: str, env: dict[str, str] | None = None, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """`python -m harness ...` from the repository root; stdout and stderr merged, 80 columns."""
    full_env = {**os.environ, "COLUMNS": "80", **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *overrides], cwd=REPO, env=full_env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Containers started once per test session (child processes, stopped at the end)."""
    from harness.services import Services

    with Services(tmp_path_factory.mktemp("service-logs")) as started:
        yield started


@pytest.fixture(scope="session")
def banking77_url(services: Any, data_dir: Path) -> str:
    return services.container_url(container_spec("banking77", data_dir))


@pytest.fixture(scope="session")
def heart_disease_url(services: Any, data_dir: Path) -> str:
    return services.container_url(container_spec("heart_disease", data_dir))


@pytest.fixture(scope="session")
def scripted_policy() -> Iterator[Any]:
    """The scripted model (`rules`) in a thread: the policy (and default proposer) of test runs."""
    from servers import ScriptedModelThread

    with ScriptedModelThread("rules") as server:
        yield server


LOCAL_TEST_MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module")
def local_model_ready() -> None:
    """Skip unless llama-server is built and the small local model can be assembled (cached)."""
    from harness.errors import ConfigError
    from harness.local_model import ensure_gguf, find_llama_server

    try:
        find_llama_server()
    except ConfigError as exc:
        pytest.skip(f"llama-server unavailable: {exc}")
    try:
        ensure_gguf(LOCAL_TEST_MODEL)
    except ConfigError as exc:
        pytest.skip(f"local model {LOCAL_TEST_MODEL} unavailable: {exc}")
