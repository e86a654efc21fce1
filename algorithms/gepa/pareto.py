"""Per-row Pareto frontier over the pareto pool, and frontier sampling of parents
(GEPA, Agrawal et al. 2025, Algorithm 2)."""

from __future__ import annotations

import random


class ParetoFrontier:
    def __init__(self, task_ids: tuple[str, ...]):
        self.task_ids = task_ids
        # candidate id -> reward per pareto row, in insertion order; None: an error row (no reward)
        self.scores: dict[str, list[float | None]] = {}

    def add(self, candidate_id: str, rewards: list[float | None]) -> None:
        if len(rewards) != len(self.task_ids):
            raise ValueError("one reward per pareto row is required")
        self.scores[candidate_id] = list(rewards)

    def mean(self, candidate_id: str) -> float:
        """Mean over the rows with a reward (0.0 when none has one)."""
        rewards = [r for r in self.scores[candidate_id] if r is not None]
        return sum(rewards) / len(rewards) if rewards else 0.0

    def best(self) -> str:
        """Highest mean on the pareto pool; ties go to the earlier candidate."""
        return max(self.scores, key=lambda c: (self.mean(c), -list(self.scores).index(c)))

    def fronts(self) -> list[set[str]]:
        """For each row, the candidates that reach the row's best reward."""
        rows = []
        for i in range(len(self.task_ids)):
            top = max((rewards[i] for rewards in self.scores.values() if rewards[i] is not None), default=None)
            rows.append({c for c, rewards in self.scores.items() if top is not None and rewards[i] == top})
        return rows

    def non_dominated(self) -> dict[str, int]:
        """Candidates on some row front, minus those whose front rows are a strict subset
        of another's, with how many rows each leads."""
        fronts = self.fronts()
        rows_of: dict[str, frozenset[int]] = {
            c: frozenset(i for i, front in enumerate(fronts) if c in front) for c in self.scores
        }
        keep = {}
        for c, rows in rows_of.items():
            if not rows:
                continue
            dominated = any(other != c and rows < other_rows for other, other_rows in rows_of.items())
            if not dominated:
                keep[c] = len(rows)
        return keep

    def sample(self, rng: random.Random) -> str:
        """A parent drawn with probability proportional to the rows it leads."""
        counts = self.non_dominated()
        if not counts:  # no row has a reward yet (every rollout an error row): any candidate
            return rng.choice(list(self.scores))
        ids = [c for c in self.scores if c in counts]  # insertion order: deterministic
        return rng.choices(ids, weights=[counts[c] for c in ids], k=1)[0]
