"""One contract suite for every registered optimizer, against the real Banking77 container
and the scripted model server, through `harness.run.execute_run`.

Every algorithm must: never spend more optimization rollouts than the budget; never roll
out a (candidate digest, task id) pair twice; only name parents that are candidates; get
every candidate it produced re-scored on heldout (`heldout_candidates=all`); record a container error on
one row as an error row without a reward (never a zero) and finish the run.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from algorithms.registry import algorithm_names
from benchmarks.containers.banking77 import SEED_SYSTEM
from conftest import CONTAINER_MODULES, execute
from harness.errors import ConfigError
from harness.run import RunOutcome, execute_run, run_sync
from harness.scripted_model import RULE_TEMPLATE
from harness.scripted_server import ScriptedModelServer
from servers import ScriptedModelThread, ServerThread
from harness.services import Endpoints, Services
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, Pools, RunSpec

ALGORITHMS = algorithm_names()
GEPA_ARMS = [name for name in ("gepa", "gepa_ai") if name in ALGORITHMS]
OPTIMIZATION_STAGES = {"seed", "pareto", "minibatch"}

TRAIN = tuple(f"train:{i}" for i in range(12))
PARETO = tuple(f"train:{i}" for i in range(12, 18))
HELDOUT = tuple(f"test:{i}" for i in range(6))
POOLS = Pools(train=TRAIN, pareto=PARETO, heldout=HELDOUT)
BAD_TASK = PARETO[2]

SCRIPTED = ModelSpec(provider="scripted", model="scripted-rules", source="rules", max_tokens=24)
QUEUE = ModelSpec(provider="scripted", model="scripted-queue", source="queue", max_tokens=400)


# ---- services ---------------------------------------------------------------------------


def failing_proxy(upstream: str, bad_task_id: str | None) -> FastAPI:
    """Banking77 behind a proxy that answers one task id's rollouts (None: every rollout)
    with a contract error."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=upstream, timeout=60.0) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        if path == "rollout":
            payload = json.loads(body)
            if bad_task_id is None or payload.get("task_id") == bad_task_id:
                return JSONResponse({"rollout_id": payload["rollout_id"], "status": "error",
                                     "error": f"injected failure on {payload.get('task_id')}",
                                     "reward_info": {"outcome_reward": 0.0}})
        upstream_response = await request.app.state.client.request(
            request.method, f"/{path}", content=body, headers={"content-type": "application/json"})
        return Response(upstream_response.content, status_code=upstream_response.status_code,
                        media_type=upstream_response.headers.get("content-type"))

    return app


@dataclass
class Stack:
    container_url: str
    failing_url: str
    broken_url: str
    rules_url: str
    data_dir: Path


@pytest.fixture(scope="module")
def stack(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    logs = tmp_path_factory.mktemp("contract-logs")
    container = ContainerSpec(name="banking77", command=["python", "-m", "benchmarks.containers.banking77"],
                              data_dir=str(data_dir))
    with Services(logs) as services, ScriptedModelServer("rules", log_dir=logs) as rules:
        url = services.container_url(container)
        with ServerThread(failing_proxy(url, BAD_TASK)) as proxy, ServerThread(failing_proxy(url, None)) as broken:
            yield Stack(container_url=url, failing_url=proxy.url, broken_url=broken.url, rules_url=rules.base_url,
                        data_dir=data_dir)


def make_spec(algorithm: str, root: Path, *, params: dict[str, Any] | None = None, budget: int = 40,
              proposer: ModelSpec = SCRIPTED, pools: Pools = POOLS, seed: int = 0,
              container: str = "banking77") -> RunSpec:
    return RunSpec(
        sweep="contract",
        container=ContainerSpec(name=container, url="http://attached.invalid",
                                target_modules=[CONTAINER_MODULES[container]]),
        policy=SCRIPTED, proposer=proposer, algorithm=AlgorithmSpec(name=algorithm, params=params or {}),
        pools=pools, budget=BudgetSpec(max_rollouts=budget), seed=seed, heldout_candidates="all",
        concurrency=4, evidence_root=str(root),
    )


# ---- evidence checks --------------------------------------------------------------------------


@dataclass
class Evidence:
    manifest: dict[str, Any]
    rollouts: pl.DataFrame
    candidates: pl.DataFrame
    proposals: pl.DataFrame
    events: pl.DataFrame


def load(outcome: RunOutcome) -> Evidence:
    run_dir = Path(outcome.evidence_dir)
    return Evidence(
        manifest=json.loads((run_dir / "manifest.json").read_text()),
        rollouts=pl.read_parquet(run_dir / "rollouts.parquet").sort("seq"),
        candidates=pl.read_parquet(run_dir / "candidates.parquet"),
        proposals=pl.read_parquet(run_dir / "proposals.parquet"),
        events=pl.read_parquet(run_dir / "events.parquet"),
    )


def check_contract(outcome: RunOutcome, spec: RunSpec) -> Evidence:
    assert outcome.status == "done", outcome.error
    ev = load(outcome)
    rollouts, candidates = ev.rollouts, ev.candidates
    assert set(rollouts["stage"].unique()) <= OPTIMIZATION_STAGES | {"heldout"}

    optimization = rollouts.filter(pl.col("stage") != "heldout")
    assert optimization.height <= spec.budget.max_rollouts
    assert ev.manifest["totals"]["rollouts"] == optimization.height == outcome.rollouts
    assert rollouts.filter(pl.col("stage") == "heldout").height == ev.manifest["totals"]["heldout_rollouts"]

    digest = dict(zip(candidates["candidate_id"], candidates["digest"]))
    assert set(rollouts["candidate_id"]) <= set(digest)
    pairs = [(digest[c], t) for c, t in zip(rollouts["candidate_id"], rollouts["task_id"])]
    assert len(pairs) == len(set(pairs)), "a (candidate digest, task id) pair was rolled out twice"

    ids = set(candidates["candidate_id"])
    for cid, parents in zip(candidates["candidate_id"], candidates["parent_ids"]):
        assert set(parents) <= ids, f"{cid} names a parent that is not a candidate: {parents}"
        assert cid not in parents
    seed_id = ev.manifest["seed_candidate_id"]
    assert candidates.filter(pl.col("candidate_id") == seed_id)["origin"].to_list() == ["seed"]
    assert ev.manifest["best_candidate_id"] in ids

    # every candidate the algorithm produced (rejected children too) is re-scored on heldout
    heldout_ids = {h["candidate_id"] for h in ev.manifest["heldout"]}
    assert heldout_ids == ids
    for cid in heldout_ids:
        rows = rollouts.filter(pl.col("stage") == "heldout")
        assert set(spec.pools.heldout) <= {t for c, t in zip(rows["candidate_id"], rows["task_id"]) if digest[c] == digest[cid]}

    # the seed is scored on the pareto pool, in pool order, under stage "seed"
    seed_rows = rollouts.filter(pl.col("stage") == "seed")
    if seed_rows.height:
        assert seed_rows["candidate_id"].unique().to_list() == [seed_id]
        assert seed_rows["task_id"].to_list() == list(spec.pools.pareto)
    return ev


# ---- scripted proposer outputs shared by both GEPA arms ------------------------------------------


_WORD = re.compile(r"[A-Za-z]+")


def rule_replies(container_url: str) -> list[str]:
    """Proposer replies (a ``` block: the seed instruction plus rule lines the scripted policy
    follows) that fix half, then all, of the train and pareto rows."""
    rows: list[dict[str, Any]] = []
    ids = list(TRAIN + PARETO)
    response = httpx.post(f"{container_url}/taskset/tasks", json={"split": "train", "task_ids": ids}, timeout=30.0)
    response.raise_for_status()
    rows = response.json()["tasks"]
    texts = [r["text"].lower() for r in rows]
    rules = []
    for i, row in enumerate(rows):
        others = [t for j, t in enumerate(texts) if j != i]
        words = sorted({w.lower() for w in _WORD.findall(row["text"]) if len(w) >= 5}, key=lambda w: (-len(w), w))
        word = next((w for w in words if not any(w in t for t in others)), None)
        if word is not None:
            rules.append(RULE_TEMPLATE.format(word=word, label=row["label"]))
    half = rules[::2]
    return [f"```\n{SEED_SYSTEM}\n{chr(10).join(part)}\n```" for part in (half, rules)]


# ---- the suite ----------------------------------------------------------------------------------


def test_every_algorithm_is_registered() -> None:
    assert {"gepa", "gepa_ai", "seed_only"} <= set(ALGORITHMS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_contract_with_scripted_models(algorithm: str, stack: Stack, tmp_path: Path) -> None:
    spec = make_spec(algorithm, tmp_path)
    outcome = execute(spec, stack.container_url, stack.rules_url)
    ev = check_contract(outcome, spec)
    assert ev.rollouts.filter(pl.col("status") != "ok").height == 0
    if algorithm != "seed_only":
        assert ev.proposals.height >= 1
        assert ev.manifest["totals"]["proposer_calls"] >= ev.proposals["attempts"].sum()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_contract_on_heart_disease(algorithm: str, stack: Stack, heart_disease_url: str, tmp_path: Path) -> None:
    spec = make_spec(algorithm, tmp_path, container="heart_disease")
    ev = check_contract(execute(spec, heart_disease_url, stack.rules_url), spec)
    assert ev.rollouts.filter(pl.col("status") != "ok").height == 0
    assert set(ev.rollouts["reward"]) <= {0.0, 1.0}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_container_error_on_one_row_is_an_error_row_without_reward(algorithm: str, stack: Stack, tmp_path: Path) -> None:
    spec = make_spec(algorithm, tmp_path, budget=30)
    outcome = execute(spec, stack.failing_url, stack.rules_url)
    ev = check_contract(outcome, spec)
    bad = ev.rollouts.filter(pl.col("task_id") == BAD_TASK)
    assert bad.height >= 1  # the seed on the pareto pool, then every candidate scored there
    assert set(bad["status"]) == {"error"}
    assert bad["reward"].null_count() == bad.height  # no reward: never a zero
    assert all(f"injected failure on {BAD_TASK}" in e for e in bad["error"])
    assert ev.rollouts.filter(pl.col("task_id") != BAD_TASK)["status"].unique().to_list() == ["ok"]
    if algorithm == "gepa_ai":  # the library needs a float: the bridge hands it the failed row as 0
        tree = json.loads(ev.events.filter(pl.col("kind") == "library_tree")["data_json"][0])
        seed_rows = ev.rollouts.filter(pl.col("stage") == "seed")
        assert tree["val_scores"][0] == pytest.approx(seed_rows["reward"].fill_null(0.0).mean())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_container_failing_every_rollout_fails_the_run(algorithm: str, stack: Stack, tmp_path: Path) -> None:
    spec = make_spec(algorithm, tmp_path, budget=30)
    outcome = execute(spec, stack.broken_url, stack.rules_url)
    assert outcome.status == "failed"
    assert "rollouts failed" in (outcome.error or "")
    ev = load(outcome)
    assert ev.manifest["status"] == "failed"
    assert ev.rollouts.height <= spec.budget.max_rollouts
    assert ev.events.filter(pl.col("kind") == "library_error").height == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_budget_smaller_than_the_pareto_pool_returns_the_seed(algorithm: str, stack: Stack, tmp_path: Path) -> None:
    spec = make_spec(algorithm, tmp_path, budget=len(PARETO) - 1)
    outcome = execute(spec, stack.container_url, stack.rules_url)
    ev = check_contract(outcome, spec)
    assert outcome.stop_reason == "max_rollouts"
    assert outcome.rollouts == 0 and outcome.best_candidate_id == ev.manifest["seed_candidate_id"]
    assert ev.manifest["heldout"][0]["candidate_id"] == outcome.best_candidate_id


@pytest.mark.parametrize("algorithm", GEPA_ARMS)
def test_a_proposer_that_keeps_failing_fails_the_run(algorithm: str, stack: Stack, tmp_path: Path) -> None:
    """Failed proposals are recorded; after `max_proposer_errors` consecutive failed calls the
    run fails with the endpoint's error instead of stalling."""
    spec = make_spec(algorithm, tmp_path, budget=30, params={"max_proposer_errors": 3})
    with ScriptedModelThread("fail_429") as proposer:
        outcome = execute(spec, stack.container_url, stack.rules_url, proposer.base_url)
    assert outcome.status == "failed" and "429" in (outcome.error or "")
    ev = load(outcome)
    assert ev.manifest["status"] == "failed"
    assert ev.rollouts.filter(pl.col("stage") != "heldout").height <= spec.budget.max_rollouts
    assert ev.proposals.height >= 1
    assert set(ev.proposals["status"]) == {"error"} and not ev.proposals["accepted"].any()
    assert ev.manifest["totals"]["proposer_calls"] == 0
    assert ev.candidates.height == 1


def test_gepa_arms_score_the_seed_on_the_same_rows(stack: Stack, tmp_path: Path) -> None:
    """With the same scripted proposer outputs, both GEPA arms score the seed on the pareto
    ids, in order, with the same rewards, and both improve on it."""
    replies = rule_replies(stack.container_url)
    seeds = {}
    for algorithm in GEPA_ARMS:
        # our arm keeps at most max_new_lines of a reply, those about the minibatch first:
        # room for every line, so the rules that fix pareto rows get in as they do in the library's rewrite
        params = {"max_new_lines": 12} if algorithm == "gepa" else None
        spec = make_spec(algorithm, tmp_path / algorithm, proposer=QUEUE, budget=60, params=params)
        with ScriptedModelThread("queue", replies) as proposer:
            outcome = execute(spec, stack.container_url, stack.rules_url, proposer.base_url)
        ev = check_contract(outcome, spec)
        seed_rows = ev.rollouts.filter(pl.col("stage") == "seed")
        seeds[algorithm] = list(zip(seed_rows["task_id"], seed_rows["reward"]))
        pareto_scored = ev.rollouts.filter(pl.col("stage") == "pareto")["candidate_id"].unique()
        assert pareto_scored.len() >= 1, f"{algorithm} accepted no child"
        assert ev.proposals.filter(pl.col("accepted"))["child_id"].is_in(pareto_scored.to_list()).all()
        assert outcome.best_candidate_id != ev.manifest["seed_candidate_id"]
    assert len(set(map(tuple, seeds.values()))) == 1
    assert [t for t, _ in next(iter(seeds.values()))] == list(PARETO)


def test_gepa_ai_maps_the_library_tree_and_proposals(stack: Stack, tmp_path: Path) -> None:
    spec = make_spec("gepa_ai", tmp_path, proposer=QUEUE, budget=60)
    with ScriptedModelThread("queue", rule_replies(stack.container_url)) as proposer:
        outcome = execute(spec, stack.container_url, stack.rules_url, proposer.base_url)
    ev = check_contract(outcome, spec)
    tree = ev.events.filter(pl.col("kind") == "library_tree")
    assert tree.height == 1
    data = json.loads(tree["data_json"][0])
    by_id = {row["candidate_id"]: row for row in ev.candidates.iter_rows(named=True)}
    # library index i -> our id; its parents are our parents
    for idx, cid in enumerate(data["candidates"]):
        lib_parents = [data["candidates"][p] for p in data["parents"][idx] if p is not None]
        assert by_id[cid]["parent_ids"] == lib_parents
        assert by_id[cid]["origin"] == ("seed" if idx == 0 else "library")
    assert len(data["candidates"]) >= 2
    assert outcome.best_candidate_id == data["candidates"][max(range(len(data["val_scores"])),
                                                               key=lambda i: data["val_scores"][i])]
    # minibatch-rejected children are marked, and never scored on the pareto pool
    rejected = [c for c, row in by_id.items() if row["origin"] == "library_rejected"]
    pareto_ids = set(ev.rollouts.filter(pl.col("stage") == "pareto")["candidate_id"])
    assert not set(rejected) & pareto_ids
    # one proposal row per reflection, with tokens from our proposer endpoint
    props = ev.proposals
    assert props.height >= 1
    assert (props["prompt_tokens"] > 0).all() and (props["module"] == "stage2_system").all()
    assert set(props["parent_id"]) <= set(by_id)
    assert ev.manifest["totals"]["proposer_calls"] == props["attempts"].sum()
    accepted = props.filter(pl.col("accepted"))
    assert accepted.height == len(data["candidates"]) - 1
    assert (accepted["child_minibatch_score"] > accepted["parent_minibatch_score"]).all()


def test_gepa_ai_stops_at_the_budget_inside_an_iteration(stack: Stack, tmp_path: Path) -> None:
    """The seed (6) + parent minibatch (4) + child minibatch (4) leave 3 of 17 rollouts: the
    accepted child's pareto scoring (6) would overshoot, so it is refused and recorded."""
    spec = make_spec("gepa_ai", tmp_path, proposer=QUEUE, budget=17)
    with ScriptedModelThread("queue", rule_replies(stack.container_url)) as proposer:
        outcome = execute(spec, stack.container_url, stack.rules_url, proposer.base_url)
    ev = check_contract(outcome, spec)
    assert outcome.stop_reason == "max_rollouts"
    assert outcome.rollouts == 14
    stops = ev.events.filter(pl.col("kind") == "budget_stop")
    assert stops.height == 1
    data = json.loads(stops["data_json"][0])
    assert data["how"] == "refused" and data["stage"] == "pareto" and data["needed"] == len(PARETO)
    assert data["rollouts_left"] == 3
    assert ev.proposals.height == 1
    assert "pareto scoring" in ev.proposals["error"][0]


def test_gepa_ai_runs_are_reproducible(stack: Stack, tmp_path: Path) -> None:
    replies = rule_replies(stack.container_url)
    seen = []
    for attempt in range(2):
        spec = make_spec("gepa_ai", tmp_path / str(attempt), proposer=QUEUE, budget=40, seed=3)
        with ScriptedModelThread("queue", replies) as proposer:
            ev = check_contract(execute(spec, stack.container_url, stack.rules_url, proposer.base_url), spec)
        seen.append((
            ev.rollouts.select("seq", "candidate_id", "task_id", "stage", "reward").rows(),
            ev.candidates.select("candidate_id", "parent_ids", "origin", "digest").rows(),
            ev.proposals.select("iteration", "parent_id", "child_id", "status", "accepted").rows(),
        ))
    assert seen[0] == seen[1]


def test_gepa_ai_cancelled_run_winds_its_thread_down(stack: Stack, tmp_path: Path) -> None:
    """Cancelling the run's coroutine stops the library's worker thread: asyncio.run returns."""

    @asynccontextmanager
    async def slow_gate() -> AsyncIterator[None]:
        await asyncio.sleep(0.3)  # the seed's 6 rollouts alone take 0.6 s: cancelled mid-library
        yield

    spec = make_spec("gepa_ai", tmp_path, budget=200)
    endpoints = Endpoints(container_url=stack.container_url, policy_url=stack.rules_url, proposer_url=stack.rules_url)

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(execute_run(spec, endpoints, rollout_gate=slow_gate), timeout=1.0)

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 10.0
    assert not [t for t in threading.enumerate() if t.name.startswith("asyncio_")]


def test_reflective_record_shows_failures() -> None:
    from algorithms.gepa_ai.adapter import reflective_record
    from harness.candidates import RolloutResult

    ok = RolloutResult(candidate_id="c0000", task_id="train:1", reward=1.0, status="ok", feedback="Correct: `a`.",
                       output="a", task={"task_id": "train:1", "split": "train", "seed": 1, "text": "hello"})
    failed = RolloutResult(candidate_id="c0000", task_id="train:2", reward=None, status="error", error="HTTP 500",
                           task={"task_id": "train:2", "split": "train", "seed": 2, "text": "bye"})
    assert reflective_record(ok) == {"Inputs": "hello", "Generated Outputs": "a", "Feedback": "Correct: `a`."}
    assert reflective_record(failed) == {"Inputs": "bye", "Generated Outputs": "(empty)",
                                         "Feedback": "The rollout failed: HTTP 500"}


@pytest.mark.slow
def test_gepa_ai_with_the_local_model(data_dir: Path, tmp_path: Path) -> None:
    """One full library iteration (seed 2 + minibatches 2 + 2 + child's pareto 2 = 8 rollouts)
    with the embedded 0.5B model as policy and proposer."""
    from harness.local_model import find_llama_server

    try:
        find_llama_server()
    except ConfigError as exc:
        pytest.skip(f"no llama-server: {exc}")
    local = ModelSpec(provider="local", model="qwen2.5-coder-0.5b", source="qwen2.5-coder-0.5b", max_tokens=24,
                      timeout_s=900.0)
    spec = RunSpec(
        sweep="contract", container=ContainerSpec(name="banking77", url="http://attached.invalid"),
        policy=local, proposer=local.model_copy(update={"max_tokens": 128, "temperature": 0.8}),
        algorithm=AlgorithmSpec(name="gepa_ai", params={"minibatch_size": 2, "proposer_max_tokens": 128}),
        pools=Pools(train=TRAIN[:4], pareto=PARETO[:2], heldout=HELDOUT[:2]), budget=BudgetSpec(max_rollouts=8),
        heldout_candidates="all", concurrency=2, evidence_root=str(tmp_path),
    )
    container = ContainerSpec(name="banking77", command=["python", "-m", "benchmarks.containers.banking77"],
                              data_dir=str(data_dir))
    with Services(tmp_path / "logs") as services:
        endpoints = services.endpoints(container, spec.policy, spec.proposer)
        outcome = run_sync(spec, endpoints)
    ev = check_contract(outcome, spec)
    assert ev.rollouts.filter(pl.col("stage") == "seed").height == 2
    assert ev.manifest["totals"]["proposer_calls"] >= 1
    assert ev.proposals.height >= 1 and (ev.proposals["prompt_tokens"] > 0).all()
