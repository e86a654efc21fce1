"""The Node.js container (standard library only) speaks the same contract: the harness
starts it from its container config through Services, checks every route, and runs a
whole GEPA run against it with the scripted model until status done. Offline."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import yaml

from harness.client import ContainerClient
from harness.config import PoolsConfig
from harness.contract import CONTRACT_VERSION, GEPA_OPTIMIZER_CONTRACT, RolloutRequest
from harness.preflight import preflight
from harness.run import run_sync
from harness.scripted_server import ScriptedModelServer
from harness.services import Services
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, Pools, RunSpec

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "container" / "node_banking77.yaml"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


def _container(data_dir: Path, **over: Any) -> ContainerSpec:
    raw = yaml.safe_load(CONFIG.read_text())["container"]
    return ContainerSpec.model_validate({**raw, "data_dir": str(data_dir), **over})


def _scripted() -> ModelSpec:
    return ModelSpec(provider="scripted", model="scripted-rules", source="rules", max_tokens=24)


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the config's command path is relative to the repository root


def test_config_starts_node_and_every_route_answers(data_dir: Path, tmp_path: Path) -> None:
    spec = _container(data_dir)
    assert spec.command == ["node", "benchmarks/containers/node/server.js"]
    raw_pools = yaml.safe_load(CONFIG.read_text())["pools"]
    run = RunSpec(container=spec, policy=_scripted(), proposer=_scripted(), algorithm=AlgorithmSpec(name="seed_only"),
                  pools=PoolsConfig.model_validate(raw_pools).resolve(), budget=BudgetSpec(max_rollouts=5))
    with ScriptedModelServer(script="rules", log_dir=tmp_path) as model, Services(tmp_path / "logs") as services:
        url = services.container_url(spec)

        async def drive() -> tuple[Any, ...]:
            client = ContainerClient(url, concurrency=4)
            try:
                metadata = await client.metadata()
                checked = await preflight(client, run, ["system"])
                labels = checked.taskset.labels or []
                policy = {"provider": "scripted", "model": "scripted-rules", "base_url": model.base_url, "max_tokens": 24}
                requests = [RolloutRequest(rollout_id=f"r{i}", task_id=t, candidate=checked.program.seed_candidate,
                                           task=checked.rows[t], policy=policy, metadata={"seed": 0})
                            for i, t in enumerate(run.pools.train[:4])]
                # A rule for the first row's message: the scripted policy then answers its label.
                first = checked.rows[run.pools.train[0]]
                word = max(first["text"].split(), key=len).strip("?.,!").lower()
                ruled = {"system": f'{checked.program.seed_candidate["system"]}\n- If the message mentions "{word}", answer: {first["label"]}'}
                requests.append(RolloutRequest(rollout_id="ruled", task_id=run.pools.train[0], candidate=ruled,
                                               task={}, policy=policy))
                results = await asyncio.gather(*(client.rollout(r) for r in requests))
                return metadata, checked, labels, results
            finally:
                await client.aclose()

        metadata, checked, labels, results = asyncio.run(drive())
        raw_body = {"rollout_id": "x", "task_id": "train:0", "candidate": {"system": "s"}, "task": {},
                    "policy": {"provider": "p", "model": "m", "base_url": model.base_url, "api_key": "sk-LEAKED-9"}}
        leaked = httpx.post(f"{url}/rollout", json=raw_body)
        unknown = httpx.post(f"{url}/taskset/tasks", json={"split": "train", "task_ids": ["train:999999"]})
        no_field = httpx.post(f"{url}/rollout", json={**raw_body, "candidate": {}, "policy": {
            "provider": "p", "model": "m", "base_url": model.base_url}})
    assert metadata.gepa_contract == GEPA_OPTIMIZER_CONTRACT and metadata.capabilities["contract_version"] == CONTRACT_VERSION
    assert metadata.metadata["language"] == "javascript"
    assert checked.taskset.taskset_id == "node_banking77" and checked.taskset.splits == {"train": 10003, "test": 3080}
    assert len(labels) == 77 and checked.task_info and checked.task_info["labels"] == labels
    assert checked.program.version == "prompt_program.v1" and checked.program.target_modules == ["system"]
    assert len(checked.rows) == 180 and {"text", "label", "seed", "split"} <= set(checked.rows["train:0"])
    assert all(r.status == "ok" for r in results)
    plain, ruled = results[:4], results[4]
    # The scripted policy answers the first listed label unless a rule matches.
    assert all(r.output_text == labels[0] for r in plain)
    for r, t in zip(plain, run.pools.train[:4]):
        expected = 1.0 if checked.rows[t]["label"] == labels[0] else 0.0
        assert r.resolved_reward() == expected
        assert (f"expected intent `{checked.rows[t]['label']}`" in r.feedback) == (expected == 0.0)
    assert ruled.resolved_reward() == 1.0 and ruled.feedback.startswith("Correct")
    assert plain[0].usage.prompt_tokens > 0 and plain[0].usage.cost_usd is None
    assert leaked.status_code == 422 and "sk-LEAKED-9" not in leaked.text and "api_key" in leaked.text
    assert unknown.status_code == 404 and "train:999999" in unknown.text
    assert no_field.status_code == 422 and "system" in no_field.text


def test_bearer_auth(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_NODE_KEY", "nk-s3cret")
    with Services(tmp_path / "logs") as services:
        url = services.container_url(_container(data_dir, api_key_env="TEST_NODE_KEY"))
        assert httpx.get(f"{url}/health").status_code == 200
        for path in ("/metadata", "/program", "/taskset", "/task_info"):
            assert httpx.get(f"{url}{path}").status_code == 401
        assert httpx.get(f"{url}/taskset", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(f"{url}/rollout", content=b"not json").status_code == 401
        ok = httpx.get(f"{url}/taskset", headers={"Authorization": "Bearer nk-s3cret"})
        assert ok.status_code == 200 and "nk-s3cret" not in ok.text


def test_gepa_run_against_node_container_is_done(data_dir: Path, tmp_path: Path) -> None:
    gepa = yaml.safe_load((REPO / "configs" / "algorithm" / "gepa.yaml").read_text())
    spec = RunSpec(
        sweep="node-test", container=_container(data_dir), policy=_scripted(),
        proposer=ModelSpec(provider="scripted", model="scripted-rules", source="rules", max_tokens=400, temperature=0.8),
        algorithm=AlgorithmSpec(name=gepa["name"], params=gepa["params"]),
        pools=Pools(train=tuple(f"train:{i}" for i in range(12)), pareto=tuple(f"train:{i}" for i in range(12, 20)),
                    heldout=tuple(f"test:{i}" for i in range(10))),
        budget=BudgetSpec(max_rollouts=48, max_wall_s=240), concurrency=4, evidence_root=str(tmp_path / "evidence"))
    with Services(tmp_path / "logs") as services:
        # Scripted model specs make Services start harness.scripted_server.ScriptedModelServer("rules").
        endpoints = services.endpoints(spec.container, spec.policy, spec.proposer)
        outcome = run_sync(spec, endpoints)
        stats = httpx.get(endpoints.policy_url.removesuffix("/v1") + "/stats").json()
    assert outcome.status == "done", outcome.error
    assert outcome.rollouts > 0 and outcome.heldout_rollouts >= 10 and outcome.seed_heldout is not None
    assert stats["requests"]["policy"] >= outcome.rollouts and stats["requests"]["proposer"] >= 1
    run_dir = Path(outcome.evidence_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "done" and manifest["spec"]["container"]["command"][0] == "node"
    rollouts = pq.read_table(run_dir / "rollouts.parquet").to_pylist()
    assert rollouts and all(r["status"] == "ok" for r in rollouts)
    assert any("expected intent" in (r["feedback"] or "") for r in rollouts)
