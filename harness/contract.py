"""Typed models of the HTTP task contract, shared by the client and the container kit.

Responses accept unknown extra fields so the harness can drive containers written by
others; the fields the harness relies on are validated and named in errors.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

CONTRACT_VERSION = "gepa_task.v1"
GEPA_OPTIMIZER_CONTRACT = "synth_optimizers.gepa.v2"
PROGRAM_VERSION = "prompt_program.v1"

# A rollout request whose policy block carries a credential is refused (422). A field
# name, at any depth, is a credential when one of its words (split at _ - . and spaces)
# is one of these: `openai_api_key`, `x-api-key`, `headers.Authorization`, `apiKey`, but
# not `max_tokens` or `top_k`.
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "authorization", "bearer",
                          "credential", "credentials", "cookie"})


def credential_fields(value: Any, path: str = "") -> list[str]:
    """Dotted names of every field in `value` (nested mappings and lists too) that names a credential."""
    found: list[str] = []
    if isinstance(value, dict):
        for name, inner in value.items():
            where = f"{path}.{name}" if path else str(name)
            words = set(re.split(r"[_\-\s.]+", str(name).lower()))
            if words & SECRET_WORDS or str(name).lower().replace("-", "_").endswith("api_key"):
                found.append(where)
            found.extend(credential_fields(inner, where))
    elif isinstance(value, list):
        for inner in value:
            found.extend(credential_fields(inner, path))
    return found


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class HealthResponse(_Open):
    status: str
    contract_version: str | None = None


class MetadataResponse(_Open):
    runtime_id: str | None = None
    name: str | None = None
    capabilities: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def gepa_contract(self) -> str | None:
        contracts = self.metadata.get("optimizer_contracts") or {}
        gepa = contracts.get("gepa") or {}
        return gepa.get("version")


class ProgramModule(_Open):
    module_id: str
    role: str
    content: str
    mutable: bool = False
    candidate_field: str | None = None


class ProgramResponse(_Open):
    version: str
    program_id: str
    modules: list[ProgramModule]
    target_modules: list[str]
    seed_candidate: dict[str, str]

    def field_of(self, module_id: str) -> str:
        """The candidate field that carries a module's text."""
        for module in self.modules:
            if module.module_id == module_id:
                return module.candidate_field or module.module_id
        raise KeyError(module_id)


class TasksetResponse(_Open):
    taskset_id: str
    splits: dict[str, int]
    labels: list[str] | None = None
    source: str | None = None


class TasksRequest(BaseModel):
    split: str
    task_ids: list[str]


class Task(_Open):
    task_id: str
    split: str
    seed: int = 0


class TasksResponse(_Open):
    tasks: list[Task]


class PolicyBlock(_Open):
    """Which model the container should call; never a credential."""

    provider: str
    model: str
    base_url: str | None = None
    inference_url: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0

    @model_validator(mode="after")
    def _no_credentials(self) -> "PolicyBlock":
        leaked = credential_fields(self.model_extra or {})
        if leaked:
            raise ValueError(f"policy block must not carry credentials: {sorted(leaked)}")
        if not (self.base_url or self.inference_url):
            raise ValueError("policy block needs base_url or inference_url")
        return self

    @property
    def endpoint(self) -> str:
        return (self.inference_url or self.base_url or "").rstrip("/")


def role_url(url: str, role: str) -> str:
    """The same rollout's gateway URL for another role (`grader`, `user_simulator`), so a
    container's grader or simulator calls on the rollout's endpoint are attributed as such.
    A URL that is not an attributed gateway URL (`.../r/<run>/<scope>/policy/v1`), such as
    a provider's own base URL, comes back unchanged."""
    head, sep, tail = url.rstrip("/").rpartition("/policy/")
    if not sep or tail != "v1" or "/r/" not in head:
        return url
    return f"{head}/{role}/v1"


class RolloutRequest(_Open):
    rollout_id: str
    task_id: str
    candidate: dict[str, str]
    task: dict[str, Any]
    policy: PolicyBlock
    metadata: dict[str, Any] = Field(default_factory=dict)


class Usage(_Open):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None


class RewardInfo(_Open):
    outcome_reward: float | None = None
    score: float | None = None


class SideInfo(_Open):
    feedback: str | None = None
    inputs: str | None = None  # what the policy saw of the row, for reflection


class RolloutResponse(_Open):
    rollout_id: str
    status: str = "ok"
    reward_info: RewardInfo | None = None
    objective_scores: dict[str, float] | None = None
    usage: Usage = Field(default_factory=Usage)
    trace: dict[str, Any] | None = None
    actionable_side_info: SideInfo | None = None
    summary: dict[str, Any] | None = None
    reward: float | None = None
    error: str | None = None

    def resolved_reward(self) -> float | None:
        """First present of reward_info.outcome_reward, reward_info.score,
        summary.outcome_reward, top-level reward."""
        if self.reward_info is not None:
            if self.reward_info.outcome_reward is not None:
                return float(self.reward_info.outcome_reward)
            if self.reward_info.score is not None:
                return float(self.reward_info.score)
        if self.summary and self.summary.get("outcome_reward") is not None:
            return float(self.summary["outcome_reward"])
        if self.reward is not None:
            return float(self.reward)
        return None

    @property
    def feedback(self) -> str:
        if self.actionable_side_info and self.actionable_side_info.feedback:
            return self.actionable_side_info.feedback
        return ""

    @property
    def inputs(self) -> str | None:
        """What the container says the policy saw of the row (for the proposer's reflection)."""
        if self.actionable_side_info and self.actionable_side_info.inputs:
            return self.actionable_side_info.inputs
        value = (self.summary or {}).get("inputs")
        return value if isinstance(value, str) and value else None

    @property
    def output_text(self) -> str:
        if self.trace and isinstance(self.trace.get("output"), str):
            return self.trace["output"]
        return ""
