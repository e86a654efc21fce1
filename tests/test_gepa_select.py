"""The train rows GEPA keeps apart for its pick (algorithms/gepa/select.py): drawn plainly
they can lean to one class, and a prompt that always gives that class's answer then wins
the pick; spread by the rows' class they hold each class's share of the train pool."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.gepa.select import split_train
from conftest import container_spec, execute, make_run_spec, read_evidence
from harness.client import ContainerClient


@settings(max_examples=300, deadline=None)
@given(classes=st.lists(st.sampled_from("abcd"), min_size=1, max_size=80), count=st.integers(0, 50),
       seed=st.integers(0, 10**6))
def test_the_rows_kept_apart_hold_each_classs_share_of_the_pool(classes: list[str], count: int, seed: int) -> None:
    train = tuple(f"train:{i}" for i in range(len(classes)))
    of = dict(zip(train, classes))
    minibatch, apart = split_train(train, count, seed, of)
    kept = min(count, len(train) // 2)
    assert len(apart) == kept and set(minibatch) | set(apart) == set(train) and not set(minibatch) & set(apart)
    assert list(apart) == [t for t in train if t in apart]  # pool order, as the plain draw keeps it
    pool, drawn = Counter(classes), Counter(of[t] for t in apart)
    for value, size in pool.items():
        quota = kept * size / len(train)
        assert int(quota) <= drawn[value] <= int(quota) + 1, (value, quota, drawn)


def test_a_yes_no_pool_whose_plain_draw_leans_to_yes_is_kept_apart_even() -> None:
    """31 yes and 29 no: the seed-2 draw of 30 is 18 yes, where an always-yes prompt scores
    0.60 on the rows kept apart; spread, it scores the pool's own share there."""
    train = tuple(f"train:{i}" for i in range(60))
    of = {t: ("yes" if i < 31 else "no") for i, t in enumerate(train)}
    leaning = next(seed for seed in range(1000)
                   if sum(of[t] == "yes" for t in split_train(train, 30, seed)[1]) >= 18)
    _, apart = split_train(train, 30, leaning, of)
    assert sum(of[t] == "yes" for t in apart) in (15, 16)
    assert split_train(train, 30, leaning) != split_train(train, 30, leaning, of)


def test_a_run_keeps_apart_the_rows_spread_over_the_containers_label(tmp_path: Path, data_dir: Path,
                                                                     heart_disease_url: str, scripted_policy) -> None:
    """Heart disease rows carry their class (`target`): the run keeps apart the spread rows,
    says so in its events, and the plain draw of the same seed would have kept others."""
    train = [f"train:{i}" for i in range(24)]
    params = {"minibatch_size": 3, "select_top": 1, "select_rows": 10, "select_spread_by": "target"}
    spec = make_run_spec(container_spec("heart_disease", data_dir), tmp_path, train=train,
                         pareto=[f"train:{i}" for i in range(24, 30)], heldout=["test:0", "test:1"],
                         max_rollouts=80, seed=3, params=params, max_generations=1)
    outcome = execute(spec, heart_disease_url, scripted_policy.base_url)
    assert outcome.status == "done", outcome.error
    events = read_evidence(outcome.evidence_dir)["events"]
    kept = json.loads(events.filter(pl.col("kind") == "kept_apart")["data_json"][0])
    rows = _heart_rows(heart_disease_url, train)
    classes = {t: str(rows[t]["target"]) for t in train}
    assert kept == {"rows": list(split_train(tuple(train), 10, 3, classes)[1]), "spread_by": "target"}
    yes = sum(classes[t] == "1" for t in train)
    assert abs(sum(classes[t] == "1" for t in kept["rows"]) - 10 * yes / len(train)) < 1


def _heart_rows(url: str, ids: list[str]) -> dict[str, dict]:
    async def go() -> dict[str, dict]:
        client = ContainerClient(url)
        try:
            return {t.task_id: t.model_dump() for t in await client.tasks("train", ids)}
        finally:
            await client.aclose()

    return asyncio.run(go())
