"""Typed models of the HTTP task contract, shared by the client and the container kit.

Responses accept unknown extra fields so the harness can drive containers written by
others; the fields the harness relies on are validated and named in errors.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

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


# Status values published containers send: a rollout with one of OK_STATUSES and a reward
# is a result; anything else (or no reward) is an error row.
OK_STATUSES = frozenset({"ok", "completed", "complete", "succeeded", "success", "done"})
HEALTHY_STATUSES = frozenset({"ok", "healthy", "ready", "up", "serving", "true"})
# metadata.optimizer_contracts.gepa.<name>_route -> the default route it replaces
DEFAULT_ROUTES = {"health": "/health", "metadata": "/metadata", "program": "/program", "taskset": "/taskset",
                  "tasks": "/taskset/tasks", "rollout": "/rollout", "task_info": "/task_info"}
_ROUTE_ALIASES = {"taskset_tasks": "tasks", "info": "task_info"}


class HealthResponse(_Open):
    status: str | bool | None = None
    contract_version: str | None = None

    @property
    def healthy(self) -> bool:
        """A 200 answer is alive unless its status says otherwise."""
        return self.status is None or str(self.status).lower() in HEALTHY_STATUSES


class MetadataResponse(_Open):
    runtime_id: str | None = None
    name: str | None = None
    capabilities: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def _gepa(self) -> dict[str, Any]:
        contracts = self.metadata.get("optimizer_contracts") or self.model_extra.get("optimizer_contracts") or {}
        gepa = contracts.get("gepa") if isinstance(contracts, dict) else None
        return gepa if isinstance(gepa, dict) else {}

    @property
    def gepa_contract(self) -> str | None:
        version = self._gepa().get("version")
        return str(version) if version is not None else None

    def routes(self) -> dict[str, str]:
        """Routes the container advertises (`<name>_route`), keyed by DEFAULT_ROUTES names."""
        out: dict[str, str] = {}
        for key, value in self._gepa().items():
            if not key.endswith("_route") or not isinstance(value, str) or not value.strip():
                continue
            name = key.removesuffix("_route")
            name = _ROUTE_ALIASES.get(name, name)
            if name in DEFAULT_ROUTES:
                out[name] = "/" + value.strip().lstrip("/")
        return out


class ProgramModule(_Open):
    module_id: str
    role: str = "system"
    content: str = ""
    mutable: bool = False
    candidate_field: str | None = None


class TargetModule(_Open):
    """A target module as published containers send it: an object, or just its id."""

    module_id: str
    candidate_field: str | None = None
    objective: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_id(cls, value: Any) -> Any:
        return {"module_id": value} if isinstance(value, str) else value


class ProgramResponse(_Open):
    version: str
    program_id: str
    modules: list[ProgramModule]
    target_modules: list[str]
    seed_candidate: dict[str, str]
    # the target modules as sent (objects keep candidate_field/objective); target_modules holds their ids
    target_specs: list[TargetModule] = Field(default_factory=list, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _targets(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("target_modules"), list):
            raw = value["target_modules"]
            # an object without a string module_id is left as is: validation then names `target_modules.<i>`
            usable = [isinstance(t, str) or (isinstance(t, dict) and isinstance(t.get("module_id"), str)) for t in raw]
            if all(usable):
                specs = [TargetModule.model_validate(t) for t in raw]
                value = {**value, "target_modules": [t.module_id for t in specs], "target_specs": specs}
        return value

    def field_of(self, module_id: str) -> str:
        """The candidate field that carries a module's text."""
        for spec in self.target_specs:
            if spec.module_id == module_id and spec.candidate_field:
                return spec.candidate_field
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


# Published containers send null token counts when the policy reported none, and a null
# usage block. The nulls are read per field: a model-level "before" validator would have
# pydantic-core turn the whole rollout answer into Python objects before validating it,
# half again the CPU of its JSON path, on every rollout.
_TokenCount = Annotated[int, BeforeValidator(lambda value: 0 if value is None else value)]


class Usage(_Open):
    prompt_tokens: _TokenCount = 0
    completion_tokens: _TokenCount = 0
    cost_usd: float | None = None


class RewardInfo(_Open):
    outcome_reward: float | None = None
    score: float | None = None
    details: Any = None


class SideInfo(_Open):
    feedback: str | None = None
    # the text the policy saw for this row, for the proposer's reflection
    inputs: str | None = None
    # answer -> inputs the container vouches have that answer (those its feedback cites), so
    # an optimizer can tell a learned line that pairs an answer with another answer's inputs
    answer_examples: dict[str, list[str]] | None = None

    @field_validator("answer_examples", mode="before")
    @classmethod
    def _examples_or_none(cls, value: Any) -> Any:
        # optional and advisory: a malformed value is ignored, never an error row
        if not isinstance(value, dict):
            return None
        kept = {k: [t for t in v if isinstance(t, str) and t.strip()] for k, v in value.items()
                if isinstance(k, str) and isinstance(v, list)}
        return {k: v for k, v in kept.items() if v} or None


_EXPECTED_KEYS = ("expected", "expected_answer", "gold", "label", "target", "answer")
_PREDICTED_KEYS = ("predicted", "prediction", "predicted_answer", "predicted_label", "output", "response")


def _text(value: Any) -> str | None:
    """A non-empty one-string view of a reason or feedback value (string, or mapping with a message)."""
    if value is None or value == "" or value == {} or value == []:
        return None
    if isinstance(value, dict):
        for key in ("message", "detail", "reason", "error"):
            if isinstance(value.get(key), str) and value[key]:
                return value[key]
        return json.dumps(value, sort_keys=True, default=str)[:2000]
    return value if isinstance(value, str) else json.dumps(value, default=str)[:2000]


def _first(mapping: dict[str, Any] | None, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if mapping and mapping.get(key) not in (None, ""):
            return mapping[key]
    return None


class RolloutResponse(_Open):
    rollout_id: str | None = None  # a container that does not echo it answers the request it was sent
    status: str | None = None
    reward_info: RewardInfo | None = None
    objective_scores: dict[str, float] | None = None
    usage: Annotated[Usage, BeforeValidator(lambda value: {} if value is None else value)] = Field(
        default_factory=Usage)
    trace: dict[str, Any] | None = None
    actionable_side_info: SideInfo | None = None
    summary: dict[str, Any] | None = None
    reward: float | None = None
    error: Any = None
    status_detail: Any = None

    def resolved_reward(self) -> float | None:
        """First present of reward_info.outcome_reward, reward_info.score,
        summary.outcome_reward, top-level reward."""
        if self.reward_info is not None:
            if self.reward_info.outcome_reward is not None:
                return float(self.reward_info.outcome_reward)
            if self.reward_info.score is not None:
                return float(self.reward_info.score)
        if self.summary and isinstance(self.summary.get("outcome_reward"), (int, float)):
            return float(self.summary["outcome_reward"])
        if self.reward is not None:
            return float(self.reward)
        return None

    @property
    def status_ok(self) -> bool:
        """No status (an older container) or one of the success values."""
        return self.status is None or self.status.strip().lower() in OK_STATUSES

    def failure_reason(self) -> str | None:
        """The container's own reason for a failure: `error`, `status_detail`,
        `summary.status_detail`, `summary.error`, in that order."""
        summary = self.summary or {}
        for value in (self.error, self.status_detail, summary.get("status_detail"), summary.get("error")):
            text = _text(value)
            if text:
                return text
        return None

    def feedback_and_source(self) -> tuple[str, str | None]:
        """Feedback for reflection and where it came from: `actionable_side_info`,
        `reward_info.details`, `summary` (expected vs predicted), or `trace`."""
        if self.actionable_side_info and self.actionable_side_info.feedback:
            return self.actionable_side_info.feedback, "actionable_side_info"
        details = _text(self.reward_info.details) if self.reward_info else None
        if details:
            return details, "reward_info.details"
        expected, predicted = _first(self.summary, _EXPECTED_KEYS), _first(self.summary, _PREDICTED_KEYS)
        if expected is not None:
            shown = "(none)" if predicted is None else _text(predicted)
            return f"Expected: {_text(expected)}\nPredicted: {shown}", "summary"
        feedback = _first(self.summary, ("feedback", "details"))
        if feedback is not None:
            return _text(feedback) or "", "summary"
        trace_feedback = _first(self.trace, ("feedback",))
        if trace_feedback is not None:
            return _text(trace_feedback) or "", "trace"
        return "", None

    @property
    def feedback(self) -> str:
        return self.feedback_and_source()[0]

    @property
    def answer_examples(self) -> dict[str, list[str]] | None:
        return self.actionable_side_info.answer_examples if self.actionable_side_info else None

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
        predicted = _first(self.summary, _PREDICTED_KEYS)
        return predicted if isinstance(predicted, str) else ""
