"""Whole runs through the inference gateway: the run's model calls in its evidence, a
replay that reproduces the evidence with zero upstream calls, a USD budget stop, and a
provider key that reaches neither the container nor any file the run writes."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest

from conftest import container_spec, make_run_spec, read_evidence, run_cli
from servers import GatewayThread, ScriptedModelThread, ServerThread
from gateway_fakes import FakeUpstream
from harness.evidence.schema import TIMING_COLUMNS, TRANSPORT_COLUMNS
from harness.gateway.models import GatewaySettings, Upstream
from harness.run import RunOutcome, run_sync
from harness.services import Endpoints, Services
from harness.specs import ModelSpec

TABLES = ("rollouts", "candidates", "proposals", "events", "model_calls")
KEY_ENV = "HARNESS_TEST_GATEWAY_RUN_KEY"


def small_spec(data_dir: Path, root: Path, parallel: int = 1, **fields: Any) -> Any:
    spec = make_run_spec(container_spec("banking77", data_dir), root, train=[f"train:{i}" for i in range(8)],
                         pareto=[f"train:{i}" for i in range(8, 12)], heldout=["test:0", "test:1", "test:2"],
                         params={"minibatch_size": 3, "parallel_proposals": parallel}, **fields)
    # several iterations in flight: the gateway sees their calls interleaved
    return spec if parallel == 1 else spec.model_copy(update={"concurrency": 3 * parallel})


def gateway_run(spec: Any, container_url: str, gateway: GatewayThread, upstream: str) -> RunOutcome:
    endpoints = Endpoints(container_url=container_url, policy_url=f"{gateway.url}/u/{upstream}/v1",
                          proposer_url=f"{gateway.url}/u/{upstream}/v1", gateway_url=gateway.url,
                          policy_upstream=upstream, proposer_upstream=upstream, gateway_token=gateway.admin_token)
    return run_sync(spec, endpoints)


def model_calls(outcome: RunOutcome) -> pl.DataFrame:
    return pl.read_parquet(Path(outcome.evidence_dir) / "model_calls.parquet")


@pytest.mark.parametrize("parallel", [1, 4])
def test_every_call_is_attributed_to_its_rollout_or_proposal(tmp_path, data_dir, banking77_url, parallel) -> None:
    with ScriptedModelThread("rules") as model, GatewayThread(
            GatewaySettings(), [Upstream(name="scripted-rules", base_url=model.base_url, provider="scripted")]) as gw:
        outcome = gateway_run(small_spec(data_dir, tmp_path, parallel, max_rollouts=60), banking77_url, gw,
                              "scripted-rules")
    assert outcome.status == "done", outcome.error
    ev, calls = read_evidence(outcome.evidence_dir), model_calls(outcome)
    policy, proposer = calls.filter(pl.col("role") == "policy"), calls.filter(pl.col("role") == "proposer")
    # one policy call per rollout (banking77 makes one), named by the rollout's own id
    assert sorted(policy["rollout_id"].to_list()) == sorted(ev["rollouts"]["rollout_id"].to_list())
    tokens = ev["rollouts"].select("rollout_id", "prompt_tokens", "completion_tokens").sort("rollout_id")
    assert policy.select("rollout_id", "prompt_tokens", "completion_tokens").sort("rollout_id").equals(tokens)
    assert policy["prompt_check"].to_list() == [True] * policy.height  # the candidate's text reached the model
    assert proposer.height == ev["manifest"]["totals"]["proposer_calls"] > 0
    assert set(proposer["proposal_id"].drop_nulls()) <= set(ev["proposals"]["proposal_id"])
    assert proposer["proposal_id"].null_count() == 0 and proposer["rollout_id"].null_count() == proposer.height
    # each proposal's tokens are those of the calls attributed to it (iterations in flight together included)
    metered = proposer.group_by("proposal_id").agg(pl.col("prompt_tokens").sum().alias("metered")).sort("proposal_id")
    own = ev["proposals"].filter(pl.col("prompt_tokens") > 0).select("proposal_id", "prompt_tokens").sort("proposal_id")
    assert metered["metered"].to_list() == own["prompt_tokens"].to_list()
    assert (calls["cost_usd"] == 0.0).all() and set(calls["cache"]) == {"off"} and set(calls["status"]) == {"ok"}
    gateway = ev["manifest"]["gateway"]
    assert gateway["prompt_check_misses"] == ev["manifest"]["totals"]["prompt_check_misses"] == 0
    assert gateway["by_role"]["policy"]["calls"] == policy.height


def test_replay_reproduces_the_evidence_with_zero_upstream_calls(tmp_path, data_dir, banking77_url) -> None:
    store = str(tmp_path / "responses.sqlite")
    with ScriptedModelThread("rules") as model:
        upstream = Upstream(name="scripted-rules", base_url=model.base_url, provider="scripted")
        with GatewayThread(GatewaySettings(cache="read_write", cache_path=store), [upstream]) as gw:
            recorded = gateway_run(small_spec(data_dir, tmp_path / "recorded", max_rollouts=40), banking77_url, gw,
                                   upstream.name)
        before = httpx.get(model.stats_url).json()["total"]
        with GatewayThread(GatewaySettings(cache="replay", cache_path=store), [upstream]) as gw:
            replayed = gateway_run(small_spec(data_dir, tmp_path / "replayed", max_rollouts=40), banking77_url, gw,
                                   upstream.name)
        after = httpx.get(model.stats_url).json()["total"]
    assert recorded.status == replayed.status == "done", (recorded.error, replayed.error)
    assert before > 0 and after == before  # not one live call in replay
    first, second = read_evidence(recorded.evidence_dir), read_evidence(replayed.evidence_dir)
    first["model_calls"], second["model_calls"] = model_calls(recorded), model_calls(replayed)
    assert set(first["model_calls"]["cache"]) == {"miss"} and set(second["model_calls"]["cache"]) == {"replay"}
    assert len(first["proposals"]) > 0 and first["model_calls"].height > 20
    for name in TABLES:
        keep = [c for c in first[name].columns if c not in TIMING_COLUMNS | TRANSPORT_COLUMNS]
        assert first[name].select(keep).equals(second[name].select(keep)), name
    for key in ("run_id", "totals", "heldout", "best_candidate_id", "stop_reason", "identity"):
        assert first["manifest"][key] == second["manifest"][key], key


@pytest.mark.parametrize("parallel", [1, 4])
def test_usd_budget_stops_the_run_before_it_is_crossed(tmp_path, data_dir, banking77_url, parallel) -> None:
    fake = FakeUpstream()
    upstream = Upstream(name="priced", base_url="", provider="openai_compatible")
    with ServerThread(fake.app()) as up:
        upstream = upstream.model_copy(update={"base_url": f"{up.url}/v1"})
        priced = ModelSpec(provider="openai_compatible", model="gpt-4.1-mini", base_url=f"{up.url}/v1",
                           max_tokens=24)
        spec = small_spec(data_dir, tmp_path, parallel, max_rollouts=1000, max_cost_usd=0.004)
        spec = spec.model_copy(update={"policy": priced, "proposer": priced.model_copy(update={"max_tokens": 400})})
        with GatewayThread(GatewaySettings(), [upstream]) as gw:
            outcome = gateway_run(spec, banking77_url, gw, upstream.name)
    assert outcome.status == "done", outcome.error
    assert outcome.stop_reason == "max_cost_usd"
    ev, calls = read_evidence(outcome.evidence_dir), model_calls(outcome)
    gateway = ev["manifest"]["gateway"]
    spent = gateway["cost_usd"]  # heldout re-scoring included
    assert outcome.cost_usd == pytest.approx(spent) and ev["manifest"]["totals"]["cost_usd"] == pytest.approx(spent)
    assert calls["cost_usd"].sum() == pytest.approx(spent)
    # the budget caps optimization, as max_rollouts does: the calls outside heldout rollouts
    heldout = ev["rollouts"].filter(pl.col("stage") == "heldout")["rollout_id"]
    optimizing = calls.filter(pl.col("rollout_id").is_null() | ~pl.col("rollout_id").is_in(heldout.implode()))
    # iterations in flight together each leave room for their next call: they stop further from the edge
    assert (0.003 if parallel == 1 else 0.002) < optimizing["cost_usd"].sum() <= 0.004
    assert gateway["budgeted_cost_usd"] == pytest.approx(optimizing["cost_usd"].sum())
    # a refused rollout is marked as such, neither a failure nor a result
    refused = ev["rollouts"].filter(pl.col("status") == "refused")
    assert ev["manifest"]["totals"]["failed_rollouts"] == 0
    assert set(refused["error_kind"]) <= {"budget"}


def test_a_child_whose_scoring_the_usd_budget_cut_short_is_recorded_as_rejected(tmp_path, data_dir,
                                                                                banking77_url) -> None:
    """The budget stops a run between a child's proposal and the end of its scoring: the child
    still gets its proposals row, rejected with the reason, and only children on the frontier
    are recorded as accepted. The budgets are ones at which the stop falls on the child's
    minibatch (0.0031, 0.0032), on its pareto scoring (0.0033, 0.0034), and after it (0.0045)."""
    fake = FakeUpstream()
    cut_short: set[str] = set()
    with ServerThread(fake.app()) as up:
        upstream = Upstream(name="priced", base_url=f"{up.url}/v1", provider="openai_compatible")
        priced = ModelSpec(provider="openai_compatible", model="gpt-4.1-mini", base_url=f"{up.url}/v1", max_tokens=24)
        with GatewayThread(GatewaySettings(), [upstream]) as gw:
            for budget in (0.0031, 0.0032, 0.0033, 0.0034, 0.0045):
                spec = small_spec(data_dir, tmp_path / str(budget), max_rollouts=1000, max_cost_usd=budget)
                spec = spec.model_copy(update={"policy": priced,
                                               "proposer": priced.model_copy(update={"max_tokens": 400})})
                outcome = gateway_run(spec, banking77_url, gw, upstream.name)
                assert outcome.status == "done" and outcome.stop_reason == "max_cost_usd", outcome.error
                ev = read_evidence(outcome.evidence_dir)
                origins = dict(ev["candidates"].select("candidate_id", "origin").rows())
                proposals = ev["proposals"].filter(pl.col("child_id").is_not_null())
                assert sorted(proposals["child_id"]) == sorted(c for c, o in origins.items() if o != "seed")
                pareto = ev["rollouts"].filter(pl.col("stage") == "pareto").group_by("candidate_id").len()
                on_frontier = {c for c, n in pareto.rows() if n == len(spec.pools.pareto)}
                for child, accepted, error in proposals.select("child_id", "accepted", "error").rows():
                    assert accepted == (child in on_frontier) == (origins[child] in ("proposal", "merge")), budget
                    if error and error.startswith("the run stopped (max_cost_usd) before the child's "):
                        cut_short.add(error.split("child's ")[1].split()[0])
    assert cut_short == {"minibatch", "pareto"}


def _grep(root: Path, secret: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_the_key_reaches_neither_the_container_nor_any_file(tmp_path, data_dir, monkeypatch) -> None:
    key = f"sk-run-{os.getpid()}-secret-value"
    monkeypatch.setenv(KEY_ENV, key)
    fake = FakeUpstream(key=key, echo_auth=True)  # it demands the key and echoes it back
    evidence, store = tmp_path / "evidence", tmp_path / "cache" / "responses.sqlite"
    with ServerThread(fake.app()) as up:
        hosted = ModelSpec(provider="openai_compatible", model="gpt-4.1-nano", base_url=f"{up.url}/v1",
                           api_key_env=KEY_ENV, max_tokens=24)
        spec = small_spec(data_dir, evidence, max_rollouts=20)
        spec = spec.model_copy(update={"policy": hosted, "proposer": hosted.model_copy(update={"max_tokens": 400})})
        settings = GatewaySettings(cache="read_write", cache_path=str(store))
        with Services(evidence / "logs", gateway=settings) as services:
            endpoints = services.endpoints(spec.container, spec.policy, spec.proposer)
            (container,) = [p for p, _ in services._containers.values()]
            environ = Path(f"/proc/{container.pid}/environ").read_bytes()
            outcome = run_sync(spec, endpoints)
    assert outcome.status == "done", outcome.error
    assert KEY_ENV.encode() not in environ and key.encode() not in environ  # the container never had it
    assert fake.refused == 0 and fake.completions > 0  # every call carried the key, added by the gateway
    calls = model_calls(outcome)
    assert calls["cost_usd"].null_count() == 0 and calls["cost_usd"].sum() > 0
    assert _grep(evidence, key.encode()) == [] and _grep(store.parent, key.encode()) == []
    stored = sqlite3.connect(store).execute("SELECT body FROM responses").fetchall()
    assert stored and all(key.encode() not in bytes(b) for (b,) in stored)


def test_live_usage_on_the_progress_line(tmp_path, data_dir) -> None:
    result = run_cli("models=scripted", f"evidence_root={tmp_path}", f"data_dir={data_dir}", "budget.max_rollouts=30",
                     "pools.train.count=8", "pools.pareto.count=4", "pools.heldout.count=2",
                     # the rotation, not examples first: this run must call the proposer
                     "algorithm.params.minibatch_size=3", "algorithm.params.examples_first=false",
                     env={"HARNESS_LIVE_USAGE": "1", "COLUMNS": "200"})
    assert result.returncode == 0, result.stdout
    assert "policy $0.0000" in result.stdout and "proposer $0.0000" in result.stdout
    (run_dir,) = [p.parent for p in tmp_path.rglob("manifest.json")]
    assert read_evidence(run_dir)["manifest"]["gateway"]["by_role"]["policy"]["calls"] > 0


def test_grader_calls_on_the_policy_endpoint_are_attributed_to_the_grader(tmp_path, data_dir) -> None:
    """HealthBench without a configured grader grades with the rollout's own endpoint and
    model; through the gateway those calls carry the grader role, not the policy's."""
    container = container_spec("healthbench", data_dir, request_timeout_s=120)
    spec = make_run_spec(container, tmp_path, train=["train:0"], pareto=["train:1", "train:2"], heldout=["test:0"],
                         max_rollouts=4, algorithm="seed_only")
    with ScriptedModelThread("rules") as model, GatewayThread(
            GatewaySettings(), [Upstream(name="scripted-rules", base_url=model.base_url, provider="scripted")]) as gw, \
            Services(tmp_path / "logs") as services:
        outcome = gateway_run(spec, services.container_url(container), gw, "scripted-rules")
    assert outcome.status == "done", outcome.error
    ev, calls = read_evidence(outcome.evidence_dir), model_calls(outcome)
    rollout_ids = sorted(ev["rollouts"]["rollout_id"].to_list())
    policy, grader = calls.filter(pl.col("role") == "policy"), calls.filter(pl.col("role") == "grader")
    assert set(calls["role"]) == {"policy", "grader"}
    assert sorted(policy["rollout_id"].to_list()) == rollout_ids  # one answer per rollout
    assert sorted(set(grader["rollout_id"])) == rollout_ids  # every rollout graded, under its own id
    assert grader.height >= len(rollout_ids) and grader["prompt_check"].null_count() == grader.height
    assert ev["manifest"]["gateway"]["by_role"]["grader"]["calls"] == grader.height
