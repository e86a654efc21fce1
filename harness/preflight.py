"""Checks a container against the run before any rollout; each failure is one line
naming the cause."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.client import ContainerClient
from harness.contract import GEPA_OPTIMIZER_CONTRACT, PROGRAM_VERSION, ProgramResponse, TasksetResponse
from harness.errors import ConfigError, PreflightError, ServiceError
from harness.specs import Pools, RunSpec


class PreflightResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    program: ProgramResponse
    taskset: TasksetResponse
    task_info: dict[str, Any] | None
    rows: dict[str, dict[str, Any]]
    pools: Pools  # the spec's, with each stratified pool's rows chosen


def check_model_keys(spec: RunSpec, through_gateway: bool = False) -> None:
    """Hosted models' keys must be in this environment before any rollout: the proposer's
    (the harness calls it) and the policy's when the harness's gateway adds it to every
    container's calls or the harness starts the container (which inherits this
    environment); an attached container without the gateway holds its own keys."""
    needed = [("proposer", spec.proposer, spec.proposer.api_key_env)]
    if spec.container.command or through_gateway:
        needed.insert(0, ("policy", spec.policy, spec.container.policy_key_env or spec.policy.api_key_env))
    for role, model, key_env in needed:
        if key_env and not os.environ.get(key_env):
            raise ConfigError(f"environment variable {key_env} is not set (API key for {role} {model.model})")


async def preflight(client: ContainerClient, spec: RunSpec, expected_modules: list[str] | None) -> PreflightResult:
    check_model_keys(spec)
    name = spec.container.name
    try:
        # /health's contract_version is informational: containers put their own values there
        health = await client.health()
        if not health.healthy:
            raise PreflightError(f"container {name}: /health status is {health.status!r}")
        metadata = await client.metadata()
        problem = optimizer_contract_problem(metadata.gepa_contract)
        if problem:
            raise PreflightError(f"container {name}: {problem}")
        client.use_routes(metadata)
        program = await client.program()
        _check_program(name, program, expected_modules)
        taskset = await client.taskset()
        rows = await _check_pools(client, name, spec, taskset)
        task_info = await client.task_info()
    except ServiceError as exc:
        raise PreflightError(f"container {name}: {exc}") from exc
    try:
        pools = spec.pools.chosen(rows)
    except ValueError as exc:
        raise PreflightError(f"container {name}: {exc}") from exc
    label = spec.container.label_field
    unlabelled = next((t for t in (*pools.train, *pools.pareto) if label and rows[t].get(label) is None), None)
    if unlabelled is not None:
        raise PreflightError(f"container {name}: its label_field is {label!r}, and task {unlabelled} has no such field")
    return PreflightResult(program=program, taskset=taskset, task_info=task_info, rows=rows, pools=pools)


def optimizer_contract_problem(version: str | None) -> str | None:
    """Why a container's metadata.optimizer_contracts.gepa.version rules it out, if it does."""
    if version is None:
        return (f"/metadata lacks metadata.optimizer_contracts.gepa.version; a container for this harness "
                f"declares {GEPA_OPTIMIZER_CONTRACT!r} there")
    if version != GEPA_OPTIMIZER_CONTRACT:
        return f"metadata.optimizer_contracts.gepa.version is {version!r}, this harness speaks {GEPA_OPTIMIZER_CONTRACT!r}"
    return None


def program_problems(program: ProgramResponse) -> list[str]:
    """Every way the program fails the contract, one line each."""
    problems = []
    if program.version != PROGRAM_VERSION:
        problems.append(f"program version {program.version!r}, expected {PROGRAM_VERSION!r}")
    modules = {m.module_id: m for m in program.modules}
    if not program.target_modules:
        problems.append("program has no target modules")
    for module_id in program.target_modules:
        module = modules.get(module_id)
        if module is None:
            problems.append(f"target module {module_id!r} is not among the program's modules")
            continue
        if not module.mutable:
            problems.append(f"target module {module_id!r} is not mutable")
        field = program.field_of(module_id)
        if field not in program.seed_candidate:
            problems.append(f"seed candidate lacks field {field!r} for module {module_id!r}")
    return problems


def _check_program(name: str, program: ProgramResponse, expected: list[str] | None) -> None:
    problems = program_problems(program)
    if problems:
        raise PreflightError(f"container {name}: {problems[0]}")
    if expected is not None:
        missing = sorted(set(expected) - set(program.target_modules))
        extra = sorted(set(program.target_modules) - set(expected))
        if missing:
            raise PreflightError(f"container {name}: lacks target module(s) {missing} named in the config")
        if extra:
            raise PreflightError(f"container {name}: advertises target module(s) {extra} the config does not name")


async def _check_pools(client: ContainerClient, name: str, spec: RunSpec, taskset: TasksetResponse) -> dict[str, dict[str, Any]]:
    pools = spec.pools
    # per split, its ids once each in pool order; a dict, as a list's membership test made large pools quadratic
    wanted: dict[str, dict[str, None]] = {}
    for pool_name in ("train", "pareto", "heldout"):
        for task_id in getattr(pools, pool_name):
            split, _, index = task_id.partition(":")
            if split not in taskset.splits:
                raise PreflightError(f"container {name}: pool {pool_name} names split {split!r}; "
                                     f"the taskset has {sorted(taskset.splits)}")
            if not index.isdigit() or int(index) >= taskset.splits[split]:
                raise PreflightError(f"container {name}: task id {task_id!r} in pool {pool_name} is not in the "
                                     f"taskset ({split} has {taskset.splits[split]} rows)")
            wanted.setdefault(split, {})[task_id] = None
    rows: dict[str, dict[str, Any]] = {}
    for split, ids in wanted.items():
        for task in await client.tasks(split, list(ids)):
            rows[task.task_id] = task.model_dump()
    return rows
