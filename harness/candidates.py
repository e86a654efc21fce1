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
    model_config = ConfigDict(frozen=True)
    candidate_id: str
    task_id: str
    reward: float
    status: str
    error: str | None = None
    feedback: str = ""
    output: str = ""
    task: dict | None = None
    inputs: str | None = None  # what the policy saw of the row, as the container reports it


def mean_reward(results: list[RolloutResult]) -> float:
    return sum(r.reward for r in results) / len(results) if results else 0.0
