"""Candidates (module texts keyed by candidate field) and rollout results, as the
optimizer sees them."""

from __future__ import annotations

import hashlib
import json

from functools import cached_property

from pydantic import BaseModel, ConfigDict


def digest_of(texts: dict[str, str]) -> str:
    canonical = json.dumps(texts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True)
    candidate_id: str
    index: int
    texts: dict[str, str]
    parent_ids: tuple[str, ...] = ()
    generation: int = 0
    origin: str = "seed"

    @cached_property
    def digest(self) -> str:  # frozen texts: hashed once, not on every cache lookup
        return digest_of(self.texts)


class RolloutResult(BaseModel):
    """One rollout. An error row (no reward, a failed status, a transport failure) has
    reward None and status "error": it is never averaged in as a zero."""

    model_config = ConfigDict(frozen=True)
    candidate_id: str
    task_id: str
    reward: float | None
    status: str  # "ok" or "error"
    error: str | None = None
    feedback: str = ""
    output: str = ""
    task: dict | None = None
    # the text the container says the policy saw for this row (for the proposer's reflection)
    inputs: str | None = None
    # where the feedback came from: actionable_side_info, reward_info.details, summary, trace
    feedback_source: str | None = None
    # answer -> inputs the container vouches have that answer (the ones its feedback cites)
    answer_examples: dict[str, tuple[str, ...]] | None = None


def mean_reward(results: list[RolloutResult]) -> float | None:
    """Mean over the rows that have a reward; None when none has."""
    rewards = [r.reward for r in results if r.reward is not None]
    return sum(rewards) / len(rewards) if rewards else None
