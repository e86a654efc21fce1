"""What a run has spent and recorded, and its progress: plain values the run context
keeps and the optimizers, the driver and the report read (the two ways a run stops early,
BudgetExhausted and RunFailed, live with the budget in harness/budget.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPTIMIZATION_STAGES = frozenset({"seed", "pareto", "minibatch", "reflection", "library", "select"})


@dataclass
class Usage:
    rollouts: int = 0
    heldout_rollouts: int = 0
    failed_rollouts: int = 0
    policy_prompt_tokens: int = 0
    policy_completion_tokens: int = 0
    proposer_prompt_tokens: int = 0
    proposer_completion_tokens: int = 0
    proposer_calls: int = 0
    cost_usd: float = 0.0
    cost_unknown: bool = False
    budget_refused: bool = False  # the gateway refused a call that would cross max_cost_usd

    @property
    def tokens(self) -> int:
        return (self.policy_prompt_tokens + self.policy_completion_tokens
                + self.proposer_prompt_tokens + self.proposer_completion_tokens)


@dataclass
class Evidence:
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    proposals: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Progress:
    rollouts: int
    budget: int
    best_score: float | None
    tokens: int
    stage: str
    spend: Any = None  # the gateway's RunSpend (policy vs proposer), when the run goes through one
    heldout_rollouts: int = 0  # re-scoring after optimization: outside the budget
