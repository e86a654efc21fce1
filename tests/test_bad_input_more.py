"""More bad input to `python -m harness`, in the style of test_bad_input.py (whose helpers
this reuses): one clear error line before any rollout, and no run written.

Added here: a missing sweep or model option, budgets and settings out of range, sweep files
with a bad axis or key, task ids not of the form split:index, unset key variables named
without printing any key, and containers that speak another contract (a fake container on
loopback answering each preflight route as told)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from servers import ServerThread
from test_bad_input import assert_no_run_written, assert_one_error_line, harness
from test_contract_client_faults import HEALTH, PROGRAM, FakeContainer, ok

# ---------------------------------------------------------------- found while composing


@pytest.mark.parametrize("override, needles", [
    ("+sweep=nope", ["configs/sweep/ has no option 'nope'", "proposer_scaling, quality, same_container, smoke"]),
    ("policy=nope", ["configs/policy/ has no option 'nope'", "scripted", "local_1_5b"]),
    ("proposer=gpt_5_4_nan", ["configs/proposer/ has no option", "did you mean proposer=gpt_5_4_nano?"]),
    ("models=nope", ["configs/models/ has no option 'nope'", "hosted, local, scripted"]),
])
def test_a_missing_option_is_one_line(tmp_path, data_dir, override, needles) -> None:
    result, lines, evidence = harness(tmp_path, data_dir, override)
    assert_one_error_line(result, lines, *needles, only_line=True)
    assert not evidence.exists()


# ---------------------------------------------------------------- caught by our config models


@pytest.mark.parametrize("overrides, needles", [
    (["budget.max_cost_usd=-1"], ["budget.max_cost_usd", "greater than 0"]),
    (["budget.max_cost_usd=0"], ["budget.max_cost_usd", "greater than 0"]),
    (["models=hosted", "budget.max_cost_usd=1", "proposer.model=gpt-9"],
     ["budget.max_cost_usd is set but the proposer model 'gpt-9' has no price in harness/pricing.py"]),
    (["budget.max_generations=0"], ["budget.max_generations", "greater than 0"]),
    (["budget.max_rollouts=-1000000"], ["budget.max_rollouts", "greater than 0"]),
    (["concurrency=0"], ["concurrency", "greater than 0"]),
    (["max_error_rate=1.5"], ["max_error_rate", "less than or equal to 1"]),
    (["+pools.heldout.ids=[nosplit]"], ["task id 'nosplit' in pool 'heldout' is not of the form split:index"]),
    (["+pools.train.ids=[train:1,train:1]"], ["pool 'train' has duplicate task ids"]),
    (["+sweep=smoke", "sweep.seeds=[]"], ["error: sweep: axis 'seeds' is empty"]),
    (["+sweep=smoke", "+sweep.colour=red"], ["sweep 'colour'", "Extra inputs are not permitted"]),
    (["+sweep=smoke", "+sweep.zip=[[seeds,flavours]]"], ["zip names unknown axis 'flavours'"]),
    (["+sweep=smoke", "+sweep.exclude=[{containers:banking77}]"], ["exclude rule", "override keys"]),
])
def test_config_errors_print_one_line_and_start_nothing(tmp_path, data_dir, overrides, needles) -> None:
    result, lines, evidence = harness(tmp_path, data_dir, *overrides)
    assert_one_error_line(result, lines, *needles, only_line=True)
    assert not evidence.exists()


# ---------------------------------------------------------------- keys: the variable named, no key printed


def test_an_unset_container_key_variable_is_named(tmp_path, data_dir, banking77_url, monkeypatch) -> None:
    monkeypatch.delenv("HARNESS_TEST_UNSET_CONTAINER_KEY", raising=False)
    result, lines, evidence = harness(tmp_path, data_dir, "container.command=null", f"+container.url={banking77_url}",
                                      "container.api_key_env=HARNESS_TEST_UNSET_CONTAINER_KEY")
    assert_one_error_line(result, lines, "environment variable HARNESS_TEST_UNSET_CONTAINER_KEY is not set",
                          only_line=False)
    assert_no_run_written(evidence)


def test_an_unset_proposer_key_is_named_and_no_other_key_printed(tmp_path, data_dir, monkeypatch) -> None:
    secrets = [f"sk-{uuid.uuid4().hex}", f"pk-{uuid.uuid4().hex}"]
    monkeypatch.setenv("OPENAI_API_KEY", secrets[0])
    monkeypatch.setenv("HARNESS_TEST_POLICY_KEY", secrets[1])
    monkeypatch.delenv("HARNESS_TEST_UNSET_PROPOSER_KEY", raising=False)
    result, lines, evidence = harness(
        tmp_path, data_dir, "policy.provider=openai_compatible", "+policy.base_url=http://127.0.0.1:9/v1",
        "+policy.api_key_env=HARNESS_TEST_POLICY_KEY", "proposer.provider=openai_compatible",
        "+proposer.base_url=http://127.0.0.1:9/v1", "+proposer.api_key_env=HARNESS_TEST_UNSET_PROPOSER_KEY")
    assert_one_error_line(result, lines, "environment variable HARNESS_TEST_UNSET_PROPOSER_KEY is not set",
                          "proposer", only_line=False)
    assert all(secret not in result.stdout for secret in secrets)
    assert_no_run_written(evidence)


# ---------------------------------------------------------------- containers that speak another contract


METADATA = {"runtime_id": "fake", "capabilities": {"protocol": "http", "contract_version": HEALTH["contract_version"]},
            "metadata": {"optimizer_contracts": {"gepa": {"version": "synth_optimizers.gepa.v2"}}}}
MODULE = PROGRAM["modules"][0]


def answers(**routes: Any) -> dict[str, Any]:
    """A well-behaved fake's answers (2 train and 2 test rows), with `routes` replaced."""
    plan = {"/health": HEALTH, "/metadata": METADATA, "/program": PROGRAM,
            "/taskset": {"taskset_id": "fake", "splits": {"train": 2, "test": 2}}}
    plan.update({f"/{k.replace('__', '/')}": v for k, v in routes.items()})
    return plan


CASES = {
    # /health's contract_version is informational: the optimizer contract in /metadata decides
    "no_optimizer_contract": (answers(health={"status": "ok", "contract_version": "2026-05-28"},
                                      metadata={**METADATA, "metadata": {}}),
                              "/metadata lacks metadata.optimizer_contracts.gepa.version; a container for this "
                              "harness declares 'synth_optimizers.gepa.v2' there"),
    "not_healthy": (answers(health={"status": "starting", "contract_version": "gepa_task.v1"}),
                    "/health status is 'starting'"),
    "optimizer_contract": (answers(metadata={**METADATA, "metadata": {"optimizer_contracts": {"gepa": {
        "version": "synth_optimizers.gepa.v1"}}}}),
        "metadata.optimizer_contracts.gepa.version is 'synth_optimizers.gepa.v1', this harness speaks "
        "'synth_optimizers.gepa.v2'"),
    "program_version": (answers(program={**PROGRAM, "version": "prompt_program.v0"}),
                        "program version 'prompt_program.v0', expected 'prompt_program.v1'"),
    "target_not_a_module": (answers(program={**PROGRAM, "target_modules": ["system", "ghost"]}),
                            "target module 'ghost' is not among the program's modules"),
    "target_not_mutable": (answers(program={**PROGRAM, "modules": [{**MODULE, "mutable": False}]}),
                           "target module 'system' is not mutable"),
    "extra_module": (answers(program={**PROGRAM, "target_modules": ["system", "footer"], "modules": [
        MODULE, {**MODULE, "module_id": "footer"}], "seed_candidate": {"system": "Answer.", "footer": "Bye."}}),
        "advertises target module(s) ['footer'] the config does not name"),
    "lacks_module": (answers(program={**PROGRAM, "target_modules": ["footer"], "modules": [
        {**MODULE, "module_id": "footer"}], "seed_candidate": {"footer": "Bye."}}),
        "lacks target module(s) ['system'] named in the config"),
    "unknown_task": (answers(taskset={"taskset_id": "fake", "splits": {"train": 2, "test": 1}}),
                     "task id 'test:1' in pool heldout is not in the taskset (test has 1 rows)"),
}


@pytest.fixture
def fake_container() -> Iterator[tuple[FakeContainer, str]]:
    container = FakeContainer()
    with ServerThread(container.app) as server:
        yield container, server.url


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_container_that_speaks_another_contract(tmp_path, data_dir, fake_container, case) -> None:
    server, url = fake_container
    plan, needle = CASES[case]
    server.plans = {route: [ok(payload)] for route, payload in plan.items()}
    result, lines, evidence = harness(
        tmp_path, data_dir, "container.command=null", f"+container.url={url}", "container.target_modules=[system]",
        "+pools.train.ids=[train:0]", "+pools.pareto.ids=[train:1]", "+pools.heldout.ids=[test:0,test:1]")
    error = assert_one_error_line(result, lines, f"container banking77: {needle}", only_line=False)
    assert "Traceback" not in result.stdout, error
    assert server.hits["/rollout"] == 0  # before any rollout
    assert_no_run_written(evidence)


# ---------------------------------------------------------------- a sweep folder's own files


def test_an_unreadable_sweep_index_is_one_line_and_left_as_it_was(tmp_path, data_dir) -> None:
    """The index carries earlier invocations' runs: one that cannot be read stops the sweep
    before it writes anything, rather than being replaced by this invocation's runs alone."""
    index = tmp_path / "evidence" / "smoke" / "index.parquet"
    index.parent.mkdir(parents=True)
    index.write_bytes(b"not parquet")
    result, lines, _ = harness(tmp_path, data_dir, "+sweep=smoke")
    assert_one_error_line(result, lines, f"{index}: unreadable sweep index", "move it aside", only_line=False)
    assert sorted(p.name for p in index.parent.iterdir()) == ["index.parquet"]
    assert index.read_bytes() == b"not parquet"
