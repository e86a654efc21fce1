"""Typed boundaries of the inference gateway: its settings, what the harness registers
(upstreams, runs, rollout scopes) and what it reads back (spend, call records).

No model here ever holds a key: an upstream names the environment variable the gateway
reads its key from, in the gateway's own process."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass

CacheMode = Literal["off", "read_write", "replay"]
Role = Literal["policy", "proposer", "grader", "user_simulator"]
ROLES: tuple[str, ...] = ("policy", "proposer", "grader", "user_simulator")
# Roles a container may use besides the policy; without their own upstream they go to the policy's.
POLICY_SIDE_ROLES = ("grader", "user_simulator")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LimitSettings(_Frozen):
    """Caps for one (upstream, model): shared by every run that calls it through this gateway."""

    max_concurrency: int = Field(default=64, gt=0)
    requests_per_min: float | None = Field(default=None, gt=0)
    tokens_per_min: float | None = Field(default=None, gt=0)
    # a request asking for more output than this is capped to it; its token estimate (the
    # rate limiter's charge) never exceeds the model's context
    max_output_tokens: int = Field(default=32768, gt=0)
    context_tokens: int = Field(default=131072, gt=0)


class GatewaySettings(_Frozen):
    """`gateway:` in configs/config.yaml. Transport only: nothing here is in a run id."""

    enabled: bool = True
    cache: CacheMode = "off"
    cache_path: str | None = None  # default: <harness cache>/gateway/responses.sqlite
    live_usage: bool = False
    timeout_s: float = Field(default=300.0, gt=0)  # one upstream attempt
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=5, gt=0)  # upstream tries on 429/503
    max_backoff_s: float = Field(default=30.0, gt=0)
    # a Retry-After longer than this (a quota reset hours away) fails the call at once
    # instead of pausing every run on that model for hours
    max_retry_after_s: float = Field(default=60.0, gt=0)
    limits: LimitSettings = LimitSettings()
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)  # larger request bodies get a 413
    # per model name or upstream name; overrides `limits`
    model_limits: dict[str, LimitSettings] = Field(default_factory=dict)

    @field_validator("cache", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false

    def limits_for(self, upstream: str, model: str) -> LimitSettings:
        return self.model_limits.get(model) or self.model_limits.get(upstream) or self.limits


class Upstream(_Frozen):
    """A provider endpoint registered by name. `name` (not the URL, whose port may change
    between runs) is what cache digests use."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    base_url: str  # .../v1
    provider: str  # pricing: local and scripted are free
    api_key_env: str | None = None  # the NAME of the variable; its value stays in the gateway
    headers: dict[str, str] = Field(default_factory=dict)  # non-secret extras (e.g. OpenRouter's X-Title)


class RunRegistration(_Frozen):
    upstreams: dict[str, str]  # role -> upstream name; grader and user_simulator default to policy
    budget_usd: float | None = Field(default=None, gt=0)


class RunGrant(_Frozen):
    """A registered run: the capability its driver's own (proposer) calls carry."""

    registered: str
    token: str


class ScopeGrants(_Frozen):
    """Rollout scope -> the capability that rollout's container carries in its URL."""

    tokens: dict[str, str]


class ScopeClosing(_Frozen):
    scopes: list[str]


class Announcement(_Frozen):
    """Rollouts about to start: scope (rollout id) -> candidate id, the candidates' module
    texts (for the prompt check) and whether the run's USD budget applies to them."""

    scopes: dict[str, str]
    candidates: dict[str, dict[str, str]]
    budgeted: bool = True


@dataclass
class CallRecord:
    """One model call as the gateway saw it; a row of the `model_calls` evidence table.
    A (pydantic) dataclass: the gateway fills it field by field on its hot path, where a
    BaseModel's validating __setattr__ costs more than the rest of the bookkeeping."""

    run_id: str | None
    call_id: str
    scope: str | None
    role: str
    model: str | None
    upstream: str
    endpoint: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: the model is not in the price table
    latency_s: float = 0.0
    cache: Literal["off", "hit", "miss", "replay"] = "off"
    status: str = "ok"  # ok | error | refused | replay_miss
    http_status: int = 200
    attempts: int = 0  # upstream requests made (0: served from the store or refused)
    prompt_check: bool | None = None  # policy calls: a candidate module text is in the messages
    digest: str | None = None
    error: str | None = None


class RoleTotals(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unknown_cost_calls: int = 0
    live_calls: int = 0  # calls that reached the upstream (not served from the store)

    def add(self, record: CallRecord) -> None:
        self.calls += 1
        self.prompt_tokens += record.prompt_tokens
        self.completion_tokens += record.completion_tokens
        if record.status == "ok" and record.cost_usd is None:
            self.unknown_cost_calls += 1
        self.cost_usd += record.cost_usd or 0.0
        self.live_calls += record.attempts > 0


class RunSpend(BaseModel):
    """What a run reads back while it runs: the metered cost feeds its budget check."""

    run_id: str
    cost_usd: float = 0.0
    budgeted_cost_usd: float = 0.0  # max_cost_usd caps this: optimization, not heldout re-scoring
    unknown_cost_calls: int = 0
    budget_usd: float | None = None
    by_role: dict[str, RoleTotals] = Field(default_factory=dict)
    cache: dict[str, int] = Field(default_factory=dict)
    refused_scopes: list[str] = Field(default_factory=list)
    prompt_check_misses: int = 0
    replay_misses: int = 0


class UsageTotals(BaseModel):
    """Everything this gateway served since it started, by role (live usage across runs)."""

    by_role: dict[str, RoleTotals] = Field(default_factory=dict)
    runs: int = 0
