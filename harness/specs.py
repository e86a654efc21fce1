"""Frozen, typed run specifications. Hydra's config ends at the entry point; everything
below takes these models. A run id hashes only the fields that change results."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.pricing import PRICE_TABLE_VERSION, cost_usd


class Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(Spec):
    """A model endpoint. `local` is the embedded llama.cpp server, `scripted` the fake
    model server for tests, `openai_compatible` any hosted or self-hosted endpoint."""

    provider: Literal["local", "scripted", "openai_compatible"]
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    max_tokens: int = Field(default=256, gt=0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    # local: GGUF reference (registry name, path, or hf:repo/file); scripted: script name
    source: str | None = None
    # transport settings, not part of the run id
    timeout_s: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.provider == "openai_compatible" and not self.base_url:
            raise ValueError(f"model {self.model!r}: provider openai_compatible needs base_url")
        return self

    def identity(self) -> dict[str, Any]:
        return self.model_dump(exclude={"timeout_s", "api_key_env"})


class ContainerSpec(Spec):
    name: str
    # how to start it (the harness appends --host/--port/--data-dir); None attaches to url
    command: list[str] | None = None
    url: str | None = None
    api_key_env: str | None = None
    policy_key_env: str | None = None
    # more variables of the harness's environment a started container may inherit (its
    # own grader's key, say); everything else but the basics is withheld from it
    env: list[str] = Field(default_factory=list)
    data_dir: str | None = None
    # when set, the container must advertise exactly these target modules
    target_modules: list[str] | None = None
    # how a started container learns its port: `args` appends --host/--port (and --data-dir,
    # --api-key-env, --policy-key-env); `env` appends nothing and relies on $PORT/$HOST
    # ($HARNESS_DATA_DIR for data), which the harness sets either way
    port_via: Literal["args", "env"] = "args"
    startup_timeout_s: float = Field(default=60.0, gt=0)
    request_timeout_s: float = Field(default=180.0, gt=0)
    # the report counts a row as solved (coverage) at reward >= this; None: 1.0 (exact match)
    solved_threshold: float | None = Field(default=None, gt=0)
    # the field of the container's rows that holds a row's class (its expected label), where
    # its rows carry one. Not in the run id: the container does the same with or without
    # it; an optimizer that reads it takes it as a param (algorithms/registry.py)
    label_field: str | None = Field(default=None, min_length=1)

    @field_validator("command", mode="before")
    @classmethod
    def _arguments_as_text(cls, value: Any) -> Any:
        """`--max-steps,30` in a Hydra override arrives as an int: a command line is text."""
        if isinstance(value, (list, tuple)):
            return [str(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else a for a in value]
        return value

    @model_validator(mode="after")
    def _check(self) -> "ContainerSpec":
        if not self.command and not self.url:
            raise ValueError(f"container {self.name!r}: needs a command to start it or a url to attach to")
        return self

    def identity(self) -> dict[str, Any]:
        # a container's options can change results (a grader model, a step limit); how it
        # is started (which python, which module path) or attached to cannot
        command = self.command or []
        first_option = next((i for i, part in enumerate(command) if part.startswith("--")), len(command))
        return {"name": self.name, "options": command[first_option:]}


class BudgetSpec(Spec):
    max_rollouts: int = Field(gt=0)
    max_cost_usd: float | None = Field(default=None, gt=0)
    max_wall_s: float | None = Field(default=None, gt=0)
    max_generations: int | None = Field(default=None, gt=0)


class PoolSpec(Spec):
    """Task ids, given explicitly or as a contiguous range of a split. With `stratify_by`
    the pool is `count` rows chosen from the `window` rows from `start`, spread over the
    values of that field of the container's rows (its label, where a container exposes one):
    the container is asked for the rows before the run, so the choice is made in preflight."""

    split: str | None = None
    start: int = Field(default=0, ge=0)
    count: int | None = Field(default=None, gt=0)
    ids: list[str] | None = None
    stratify_by: str | None = Field(default=None, min_length=1)
    window: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "PoolSpec":
        if self.ids is None and (self.split is None or self.count is None):
            raise ValueError("a pool needs either ids or split and count")
        if self.stratify_by is not None:
            if self.ids is not None or self.window is None or self.window < (self.count or 0):
                raise ValueError("a stratified pool needs split, count and a window of at least count rows")
        elif self.window is not None:
            raise ValueError("window is for a stratified pool (stratify_by)")
        return self

    def resolve(self) -> tuple[str, ...]:
        """The pool's ids; a stratified pool's window (its rows are chosen in preflight)."""
        if self.ids is not None:
            return tuple(self.ids)
        size = self.window if self.stratify_by is not None else self.count
        return tuple(f"{self.split}:{i}" for i in range(self.start, self.start + (size or 0)))

    def strata(self) -> "PoolStrata | None":
        return PoolStrata(field=self.stratify_by, count=self.count or 0) if self.stratify_by else None


class PoolStrata(Spec):
    """Choose `count` of a pool's ids, spread over the values of the rows' `field`."""

    field: str
    count: int = Field(gt=0)


STRATIFIABLE = ("train", "pareto")  # heldout stays the fixed rows every arm is judged on


class Pools(Spec):
    """Resolved task ids per pool. Feedback rows (minibatches, reflection) come from
    `train`; candidates are ranked on `pareto`; `heldout` judges them afterwards. A pool in
    `stratify` holds its window until `chosen` picks its rows."""

    train: tuple[str, ...]
    pareto: tuple[str, ...]
    heldout: tuple[str, ...]
    allow_overlap: bool = False
    stratify: dict[str, PoolStrata] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "Pools":
        for name in ("train", "pareto", "heldout"):
            ids = getattr(self, name)
            if not ids:
                raise ValueError(f"pool {name!r} is empty")
            if len(set(ids)) != len(ids):
                raise ValueError(f"pool {name!r} has duplicate task ids")
            for task_id in ids:
                split, sep, index = task_id.rpartition(":")
                # ASCII digits only: int() reads `٣` as 3, so `train:٣` would be `train:3` twice over
                if not (sep and split and index.isascii() and index.isdigit()):
                    raise ValueError(f"task id {task_id!r} in pool {name!r} is not of the form split:index "
                                     "(index in ASCII digits)")
        unknown = sorted(set(self.stratify) - set(STRATIFIABLE))
        if unknown:
            raise ValueError(f"pool {unknown[0]!r} cannot be stratified (only {', '.join(STRATIFIABLE)})")
        if not self.allow_overlap:
            overlap = (set(self.train) | set(self.pareto)) & set(self.heldout)
            if overlap:
                raise ValueError(f"heldout overlaps train/pareto on {len(overlap)} ids, e.g. {sorted(overlap)[0]}")
            if self.stratify and set(self.train) & set(self.pareto):
                raise ValueError("a stratified pool's window overlaps the other optimization pool")
        return self

    def chosen(self, rows: Mapping[str, Mapping[str, Any]]) -> "Pools":
        """The pools a run uses: each stratified pool's `count` ids taken round-robin over the
        values of its field, values in the order they first appear in the window and ids in
        window order (the same rows for every seed and arm). A ValueError names a row without
        the field."""
        if not self.stratify:
            return self
        picked: dict[str, tuple[str, ...]] = {}
        for name, strata in self.stratify.items():
            groups: dict[str, list[str]] = {}
            for task_id in getattr(self, name):
                value = (rows.get(task_id) or {}).get(strata.field)
                if value is None:
                    raise ValueError(f"pool {name} is stratified by {strata.field!r}, and task {task_id} "
                                     "has no such field")
                groups.setdefault(str(value), []).append(task_id)
            order = [ids[depth] for depth in range(max(map(len, groups.values())))
                     for ids in groups.values() if depth < len(ids)]
            picked[name] = tuple(order[:strata.count])
        return self.model_copy(update={**picked, "stratify": {}})

    def identity(self) -> dict[str, Any]:
        """What a run id hashes: without `stratify` when no pool is stratified (the ids of
        runs from before stratification stay as they were)."""
        dumped = self.model_dump()
        if not self.stratify:
            del dumped["stratify"]
        return dumped

    def used(self) -> dict[str, list[str]]:
        return {"train": list(self.train), "pareto": list(self.pareto), "heldout": list(self.heldout)}


class AlgorithmSpec(Spec):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class RunSpec(Spec):
    sweep: str = "local"
    container: ContainerSpec
    policy: ModelSpec
    proposer: ModelSpec
    algorithm: AlgorithmSpec
    pools: Pools
    budget: BudgetSpec
    seed: int = 0
    # re-score on heldout: "best" (seed and best), "all", or the top-K by pareto score
    heldout_candidates: Literal["best", "all"] | int = "best"
    # transport and placement: do not change results, not in the run id
    concurrency: int = Field(default=4, gt=0)
    checkpoint_every_s: float = Field(default=10.0, gt=0)  # while heldout re-scoring runs (harness/checkpoint.py)
    evidence_root: str = "evidence"
    axes: dict[str, str] = Field(default_factory=dict)

    @field_validator("heldout_candidates")
    @classmethod
    def _positive_k(cls, value: Any) -> Any:
        if isinstance(value, int) and value <= 0:
            raise ValueError("heldout_candidates as top-K must be positive")
        return value

    @model_validator(mode="after")
    def _priced_under_a_usd_budget(self) -> "RunSpec":
        """A USD budget can only be kept when every model's spend can be counted."""
        if self.budget.max_cost_usd is None:
            return self
        for role, model in (("policy", self.policy), ("proposer", self.proposer)):
            if cost_usd(model.provider, model.model, 1, 1) is None:
                raise ValueError(f"budget.max_cost_usd is set but the {role} model {model.model!r} has no price in "
                                 f"harness/pricing.py (table {PRICE_TABLE_VERSION}): add it, or drop the USD budget")
        return self

    def identity(self) -> dict[str, Any]:
        return {
            "container": self.container.identity(),
            "policy": self.policy.identity(),
            "proposer": self.proposer.identity(),
            "algorithm": self.algorithm.model_dump(),
            "pools": self.pools.identity(),
            "budget": self.budget.model_dump(),
            "seed": self.seed,
            "heldout_candidates": self.heldout_candidates,
        }

    @property
    def run_id(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]
