"""Pools stratified over a field of the container's rows (Banking77's label): the rows are
chosen in preflight from a window, round-robin over the field's values, the same for every
seed and arm; the run ranks candidates on them and records them in its manifest."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from benchmarks.containers.banking77 import Banking77
from conftest import container_spec, execute, read_evidence, scripted_spec
from harness.config import PoolsConfig
from harness.specs import AlgorithmSpec, BudgetSpec, PoolSpec, RunSpec
from harness.tracking.record import spec_params


def pools_config(**pareto: object) -> PoolsConfig:
    return PoolsConfig(train={"split": "train", "start": 0, "count": 20},
                       pareto={"split": "train", "start": 20, "count": 6, **pareto},
                       heldout={"split": "test", "start": 0, "count": 3})


def test_a_stratified_pool_takes_its_rows_round_robin_over_the_field() -> None:
    pools = pools_config(stratify_by="label", window=12).resolve()
    assert pools.pareto == tuple(f"train:{i}" for i in range(20, 32))  # the window, until preflight
    labels = {f"train:{i}": {"label": "ab"[i % 2] if i < 30 else "c"} for i in range(20, 32)}
    chosen = pools.chosen(labels)
    # a, b, c in order of first appearance, then the second of each, ...
    assert chosen.pareto == ("train:20", "train:21", "train:30", "train:22", "train:23", "train:31")
    assert chosen.train == pools.train and chosen.stratify == {}
    with pytest.raises(ValueError, match="task train:25 has no such field"):
        pools.chosen({**labels, "train:25": {"text": "no label"}})


def test_an_unstratified_run_keeps_its_id_and_a_stratified_one_gets_another(tmp_path) -> None:
    def spec(pools_cfg: PoolsConfig) -> RunSpec:
        return RunSpec(container=container_spec("banking77", tmp_path), policy=scripted_spec(),
                       proposer=scripted_spec(), algorithm=AlgorithmSpec(name="seed_only", params={}),
                       pools=pools_cfg.resolve(), budget=BudgetSpec(max_rollouts=10), evidence_root=str(tmp_path))

    plain = spec(pools_config())
    assert "stratify" not in plain.identity()["pools"]  # ids of runs from before stratification stand
    assert spec(pools_config(stratify_by="label", window=12)).run_id != plain.run_id


@pytest.mark.parametrize("fields, message", [
    ({"stratify_by": "label"}, "a window of at least count rows"),
    ({"stratify_by": "label", "window": 3}, "a window of at least count rows"),
    ({"window": 12}, "window is for a stratified pool"),
])
def test_a_stratified_pool_needs_a_window_of_at_least_its_count(fields, message) -> None:
    with pytest.raises(ValidationError, match=message):
        PoolSpec(split="train", start=0, count=6, **fields)


def test_heldout_is_not_stratified() -> None:
    with pytest.raises(ValidationError, match="'heldout' cannot be stratified"):
        PoolsConfig(train={"split": "train", "count": 4}, pareto={"split": "train", "start": 4, "count": 2},
                    heldout={"split": "test", "count": 4, "stratify_by": "label", "window": 8}).resolve()


def test_a_run_ranks_candidates_on_the_chosen_rows_and_records_them(tmp_path, data_dir, banking77_url,
                                                                    scripted_policy) -> None:
    pools = pools_config(stratify_by="label", window=200).resolve()
    spec = RunSpec(container=container_spec("banking77", data_dir), policy=scripted_spec(), proposer=scripted_spec(),
                   algorithm=AlgorithmSpec(name="seed_only", params={}), pools=pools,
                   budget=BudgetSpec(max_rollouts=50), concurrency=4, evidence_root=str(tmp_path))
    outcome = execute(spec, banking77_url, scripted_policy.base_url)
    assert outcome.status == "done", outcome.error
    evidence = read_evidence(outcome.evidence_dir)
    manifest = evidence["manifest"]
    used = manifest["pools_used"]["pareto"]
    assert len(used) == 6 and set(used) < set(pools.pareto)
    assert len(manifest["spec"]["pools"]["pareto"]) == 200  # the spec keeps the window it was chosen from
    seed_rows = evidence["rollouts"].filter(evidence["rollouts"]["stage"] == "seed")
    assert sorted(seed_rows["task_id"].to_list()) == sorted(used)
    # six different intents, where the window's first six rows repeat one
    train = Banking77(str(data_dir)).splits()["train"]
    labels = [train[int(t.split(":")[1])]["label"] for t in used]
    first_six = [train[i]["label"] for i in range(20, 26)]
    assert len(set(first_six)) < 6
    assert Counter(labels).most_common(1)[0][1] == 1 and labels[0] == first_six[0]
    # an export logs the rows the run used, and the window beside them
    params = spec_params(manifest["spec"], manifest["pools_used"])
    assert params["pools.pareto_count"] == "6" and params["pools.pareto_stratified_by"] == "label"
    assert params["pools.pareto_window"] == "train:20-219"
