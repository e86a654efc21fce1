"""The run's pick. The best mean over one small pareto pool favours the luckiest candidate:
each edit of a small policy's prompt flips about a fifth of its answers either way, so the
leader of 30 rows is often a candidate that drew well. With `select_top` > 0 the pool's
leaders that beat the seed there, and the seed, are also scored on train rows that no
minibatch uses, and the best mean on those rows is the pick (the pareto mean breaks ties).
Those rows alone are unbiased: the leaders were chosen for their pareto means, so adding
the pareto rows back favours the luckiest again. The seed among them lets a run keep it
when no child holds up.

Where the rows carry a class (`select_spread_by`, the container's label field), the rows
kept apart take each class's share of the train pool. Drawn plainly, 30 rows of a yes/no
pool can lean 18 to 12 where the pool is even, and a prompt that answers yes to everything
then outscores every child that learned when to say no."""

from __future__ import annotations

import random
from collections.abc import Mapping

from algorithms.gepa.pareto import ParetoFrontier, or_low


def apart_count(train_size: int, wanted: int) -> int:
    """Train rows kept apart for the pick: `wanted`, never more than half the pool (the
    minibatches keep the rest)."""
    return max(0, min(wanted, train_size // 2))


def split_train(train: tuple[str, ...], count: int, seed: int,
                classes: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(rows for the minibatches, rows kept apart for the pick): a fixed shuffle of the train
    pool by the run's seed, at most half of it kept apart. With `classes` (task id -> class)
    each class gives its share of the pool (largest remainders, ties to the class seen first)."""
    count = apart_count(len(train), count)
    if count == 0:
        return train, ()
    order = list(train)
    random.Random(f"gepa-select-{seed}").shuffle(order)
    if classes is None:
        apart = set(order[:count])
    else:
        groups: dict[str, list[str]] = {}
        for task_id in order:
            groups.setdefault(classes[task_id], []).append(task_id)
        exact = {value: count * len(ids) / len(train) for value, ids in groups.items()}
        share = {value: int(quota) for value, quota in exact.items()}
        for value in sorted(exact, key=lambda v: share[v] - exact[v])[:count - sum(share.values())]:
            share[value] += 1
        apart = {task_id for value, ids in groups.items() for task_id in ids[:share[value]]}
    return tuple(t for t in train if t not in apart), tuple(t for t in train if t in apart)


def contenders(frontier: ParetoFrontier, top: int, seed_id: str) -> list[str]:
    """The `top` best pareto means (ties to the earlier) among the candidates that beat the
    seed there, then the seed; none when no candidate beats it (the seed is then the pick)."""
    order = list(frontier.scores)
    bar = or_low(frontier.mean(seed_id)) if seed_id in frontier.scores else float("-inf")
    better = [c for c in order if c != seed_id and or_low(frontier.mean(c)) > bar]
    ranked = sorted(better, key=lambda c: (-or_low(frontier.mean(c)), order.index(c)))[:top]
    return [*ranked, seed_id] if ranked and seed_id in frontier.scores else ranked


def best_on_kept(frontier: ParetoFrontier, kept_means: dict[str, float | None]) -> str:
    """The contender with the best mean on the kept rows (one without any reward there comes
    last); ties go to the better pareto mean, then to the earlier candidate."""
    order = list(frontier.scores)
    return max(kept_means, key=lambda c: (or_low(kept_means[c]), or_low(frontier.mean(c)), -order.index(c)))
