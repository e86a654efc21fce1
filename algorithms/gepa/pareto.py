"""Per-row Pareto frontier over the pareto pool, and frontier sampling of parents
(GEPA, Agrawal et al. 2025, Algorithm 2). A row without a reward (a failed rollout) is
missing evidence: it is left out of means and leads no row, it never counts as zero."""

from __future__ import annotations

import random


class ParetoFrontier:
    def __init__(self, task_ids: tuple[str, ...]):
        self.task_ids = task_ids
        # candidate id -> reward per pareto row (None: no reward), in insertion order
        self.scores: dict[str, list[float | None]] = {}
        # non_dominated() until the next add: with many iterations in flight every one
        # samples a parent, and the frontier changes far less often
        self._leaders: dict[str, int] | None = None

    def add(self, candidate_id: str, rewards: list[float | None]) -> None:
        if len(rewards) != len(self.task_ids):
            raise ValueError("one reward per pareto row is required")
        self.scores[candidate_id] = list(rewards)
        self._leaders = None

    def mean(self, candidate_id: str) -> float | None:
        rewards = [r for r in self.scores[candidate_id] if r is not None]
        return sum(rewards) / len(rewards) if rewards else None

    def best(self) -> str:
        """Highest mean on the pareto pool; ties go to the earlier candidate."""
        order = list(self.scores)
        return max(self.scores, key=lambda c: (or_low(self.mean(c)), -order.index(c)))

    def fronts(self) -> list[set[str]]:
        """For each row, the candidates that reach the row's best reward."""
        rows = []
        for i in range(len(self.task_ids)):
            scored = {c: rewards[i] for c, rewards in self.scores.items() if rewards[i] is not None}
            top = max(scored.values(), default=None)
            rows.append({c for c, reward in scored.items() if reward == top})
        return rows

    def non_dominated(self) -> dict[str, int]:
        """Candidates on some row front, minus those whose front rows are a strict subset
        of another's, with how many rows each leads."""
        if self._leaders is None:
            self._leaders = self._non_dominated()
        return dict(self._leaders)

    def _non_dominated(self) -> dict[str, int]:
        fronts = self.fronts()
        rows_of: dict[str, frozenset[int]] = {
            c: frozenset(i for i, front in enumerate(fronts) if c in front) for c in self.scores
        }
        # dominance is between row sets: candidates often share one (ties on every row they
        # lead), so each distinct set is compared once, not each pair of candidates
        distinct = set(rows_of.values())
        open_sets = {rows for rows in distinct if rows and not any(rows < other for other in distinct)}
        return {c: len(rows) for c, rows in rows_of.items() if rows in open_sets}

    def sample(self, rng: random.Random) -> str:
        """A parent drawn with probability proportional to the rows it leads."""
        counts = self.non_dominated()
        if not counts:  # no row has a reward yet: the first candidate (the seed)
            return next(iter(self.scores))
        ids = [c for c in self.scores if c in counts]  # insertion order: deterministic
        return rng.choices(ids, weights=[counts[c] for c in ids], k=1)[0]


def or_low(value: float | None) -> float:
    return float("-inf") if value is None else value
