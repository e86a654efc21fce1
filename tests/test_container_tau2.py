"""tau2 retail container: the tools, the gold replay, the reward, and whole episodes where a
scripted fake plays the agent (with real tool calls) and the user simulator. Every task's
reference trajectory, played by the fake agent, must score 1; concurrent rollouts on the
same task must not share database state. Offline."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from benchmarks.containers.kit import RolloutEnv, build_app
from benchmarks.containers.tau2_retail import Tau2Retail
from benchmarks.containers.tau2_retail.chat import ChatTurn, parse_tool_calls
from benchmarks.containers.tau2_retail.data import RetailData, db_hash
from benchmarks.containers.tau2_retail.episode import FIRST_AGENT_MESSAGE, USER_GUIDELINES, user_instructions
from benchmarks.containers.tau2_retail.scoring import action_matches, communicated, replay_gold, score_episode
from benchmarks.containers.tau2_retail.tools import SCHEMAS, WRITE_TOOLS, RetailTools, ToolError
from harness.client import ContainerClient
from harness.config import PoolsConfig
from harness.contract import RolloutRequest, RolloutResponse
from harness.preflight import preflight
from harness.services import Services
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, RunSpec
from servers import ServerThread

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def retail(data_dir: Path) -> RetailData:
    return RetailData.load(str(data_dir))


@pytest.fixture(scope="module")
def container(data_dir: Path) -> Tau2Retail:
    return Tau2Retail(str(data_dir))


# ---------------------------------------------------------------- a scripted fake model


def _call(name: str, arguments: dict[str, Any], k: int, raw: str | None = None) -> dict[str, Any]:
    return {"id": f"call_{k}", "type": "function",
            "function": {"name": name, "arguments": raw if raw is not None else json.dumps(arguments)}}


class FakeModel:
    """OpenAI-compatible fake on loopback playing both sides; which side by the system prompt.

    User simulator: asks for help, then says ###STOP### once the agent has spoken twice
    (greeting + one answer); a model named `user-loop...` never stops.
    Agent, by model name `KIND:TASK_ID`: `gold` makes the task's expected tool calls one per
    turn, then answers with every communicate_info string; `chatty` only talks; `wrong`
    exchanges just the first item of task 0's exchange; `broken` sends an unknown tool and
    unparseable arguments; `fail` is HTTP 400."""

    def __init__(self, tasks: dict[str, dict[str, Any]]) -> None:
        self.tasks = tasks
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            simulating = body["messages"][0]["content"].startswith("# User Simulation Guidelines")
            self.requests.append({"body": body, "user_sim": simulating})
            if simulating:
                return self._user(body)
            return self._agent(body)

        self.server = ServerThread(app)
        self.port = self.server.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @staticmethod
    def _reply(content: str | None, calls: list[dict[str, Any]] | None = None, tokens: int = 7) -> JSONResponse:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return JSONResponse({"choices": [{"message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                             "usage": {"prompt_tokens": tokens * 10, "completion_tokens": tokens}})

    def _user(self, body: dict[str, Any]) -> JSONResponse:
        agent_said = [m for m in body["messages"][1:] if m["role"] == "user"]
        if body["model"].startswith("user-loop") or len(agent_said) < 2:
            return self._reply("Hi, I need help with my order.", tokens=3)
        return self._reply("Thanks, that is all. ###STOP###", tokens=3)

    def _agent(self, body: dict[str, Any]) -> JSONResponse:
        assert {t["function"]["name"] for t in body["tools"]} == set(SCHEMAS)
        kind, _, task_id = body["model"].partition(":")
        history = body["messages"][1:]
        done = sum(m["role"] == "tool" for m in history)
        if kind == "fail":
            return JSONResponse({"error": "bad request"}, status_code=400)
        if kind == "gold":
            criteria = self.tasks[task_id]["evaluation_criteria"]
            actions = criteria["actions"]
            if done < len(actions):
                return self._reply(None, [_call(actions[done]["name"], actions[done]["arguments"], done)])
            return self._reply("All done. " + " ".join(criteria["communicate_info"]))
        if kind == "wrong" and done == 0:
            args = {"order_id": "#W2378156", "item_ids": ["1151293680"], "new_item_ids": ["7706410293"],
                    "payment_method_id": "credit_card_9513926"}
            return self._reply(None, [_call("exchange_delivered_order_items", args, 0)])
        if kind == "broken":
            return self._reply(None, [_call("no_such_tool", {}, 2 * done), _call("get_order_details", {}, 2 * done + 1, "{oops")])
        return self._reply("Could you tell me more about your order?")


@pytest.fixture(scope="module")
def fake(retail: RetailData) -> Iterator[FakeModel]:
    model = FakeModel(retail.tasks)
    with model.server:
        yield model


def _index(container: Tau2Retail, task_id: str) -> str:
    for split, rows in container.splits().items():
        for i, row in enumerate(rows):
            if row["id"] == task_id:
                return f"{split}:{i}"
    raise KeyError(task_id)


def _body(container: Tau2Retail, fake: FakeModel, task_id: str, kind: str, rollout: str = "") -> dict[str, Any]:
    tid = _index(container, task_id)
    return {"rollout_id": f"r-{kind}-{task_id}{rollout}", "task_id": tid, "candidate": container.program().seed_candidate,
            "task": container.task(tid), "metadata": {"seed": 0},
            "policy": {"provider": "openai_compatible", "model": f"{kind}:{task_id}", "base_url": fake.base_url,
                       "max_tokens": 64}}


# ---------------------------------------------------------------- tools


def test_tools_follow_tau2_semantics(retail: RetailData) -> None:
    tools = RetailTools(retail.fresh_db())
    assert tools.call("find_user_id_by_name_zip", {"first_name": "yusuf", "last_name": "ROSSI", "zip": 19122}) == "yusuf_rossi_9620"
    with pytest.raises(ToolError, match="User not found"):
        tools.call("find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": "00000"})
    assert tools.call("calculate", {"expression": "3131.1 + 4777.75 + 367.38"}) == "8276.23"
    for bad in ("__import__('os')", "2 ** 8", "1 / 0"):
        with pytest.raises(ToolError):
            tools.call("calculate", {"expression": bad})
    with pytest.raises(ToolError, match="missing \\['order_id'\\]"):
        tools.call("get_order_details", {})
    with pytest.raises(ToolError, match="not found"):
        tools.call("delete_everything", {})
    products = json.loads(tools.call("list_all_product_types", {}))
    assert len(products) == 50 and list(products) == sorted(products)
    # A cancelled gift-card order is refunded to the card at once.
    db = tools.db
    order_id, order = next((oid, o) for oid, o in db["orders"].items() if o["status"] == "pending" and any(
        p["payment_method_id"].startswith("gift_card") for p in o["payment_history"]) and len(o["payment_history"]) == 1)
    card = db["users"][order["user_id"]]["payment_methods"][order["payment_history"][0]["payment_method_id"]]
    before = card["balance"]
    with pytest.raises(ToolError, match="Invalid reason"):
        tools.call("cancel_pending_order", {"order_id": order_id, "reason": "changed my mind"})
    result = json.loads(tools.call("cancel_pending_order", {"order_id": order_id, "reason": "no longer needed"}))
    assert result["status"] == "cancelled" and result["payment_history"][-1]["transaction_type"] == "refund"
    assert card["balance"] == round(before + order["payment_history"][0]["amount"], 2)
    with pytest.raises(ToolError, match="Non-pending order cannot be cancelled"):
        tools.call("cancel_pending_order", {"order_id": order_id, "reason": "no longer needed"})
    assert WRITE_TOOLS < set(SCHEMAS) and len(SCHEMAS) == 16


def test_gold_replays_and_reward_rules(retail: RetailData) -> None:
    initial = db_hash(retail.fresh_db())
    failed, changed = [], 0
    for task_id, task in retail.tasks.items():
        gold = replay_gold(retail.fresh_db(), task["evaluation_criteria"]["actions"])
        failed += [task_id] if gold.failed_writes else []
        changed += gold.hash != initial
    # Two upstream references hold a write that cannot apply (tau2 logs the same failures).
    assert failed == ["64", "105"] and changed == 103
    assert communicated("1288.65", ["The total is $1,288.65."]) and not communicated("10", ["nothing"])
    expected = {"name": "transfer_to_human_agents", "arguments": {"summary": "x"}, "compare_args": []}
    assert action_matches(expected, {"name": "transfer_to_human_agents", "arguments": {"summary": "other"}})
    assert not action_matches({"name": "get_order_details", "arguments": {"order_id": "#W1"}},
                              {"name": "get_order_details", "arguments": {"order_id": "#W2"}})
    text = user_instructions(retail.tasks["0"]["user_scenario"])
    assert text.startswith("Domain: retail\nReason for call:\n\tYou received your order #W2378156")


def test_copy_on_access_db_equals_a_full_copy(retail: RetailData) -> None:
    """The per-rollout tables give the same state as tools run on a full private copy, and
    fingerprints are equal exactly when the full states are."""
    pristine = json.dumps(retail.db_base, sort_keys=True)
    states, hashes = [], []
    for actions in (retail.tasks["0"]["evaluation_criteria"]["actions"],
                    retail.tasks["16"]["evaluation_criteria"]["actions"],
                    retail.tasks["0"]["evaluation_criteria"]["actions"][:-1]):
        full = json.loads(json.dumps(retail.db_base))
        tables = retail.fresh_db()
        for db in (full, tables):
            tools = RetailTools(db)
            for action in actions:
                try:
                    tools.call(action["name"], action["arguments"])
                except ToolError:
                    pass
        materialized = {name: {key: table.view(key) for key in table} for name, table in tables.items()}
        assert materialized == full
        states.append(full)
        hashes.append(db_hash(tables))
    assert (hashes[0] == hashes[2]) == (states[0] == states[2]) is False
    assert db_hash(retail.fresh_db()) != hashes[0]
    assert json.dumps(retail.db_base, sort_keys=True) == pristine  # the shared base was never written


def test_tool_call_parsing_tolerates_local_servers() -> None:
    calls = parse_tool_calls([
        {"function": {"name": "get_order_details", "arguments": {"order_id": "#W1"}}},  # object, no id
        {"id": "c2", "function": {"name": "calculate", "arguments": "{not json"}},
        {"id": "c3", "function": {"name": "list_all_product_types", "arguments": ""}},
    ], turn_index=4)
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_4_0", "get_order_details", {"order_id": "#W1"}), ("c2", "calculate", None),
        ("c3", "list_all_product_types", {})]
    turn = ChatTurn(content="", tool_calls=calls[:1], prompt_tokens=0, completion_tokens=0, latency_s=0.0)
    assert turn.assistant_message()["tool_calls"][0]["function"]["arguments"] == '{"order_id": "#W1"}'


def test_feedback_names_unexpected_writes(retail: RetailData) -> None:
    task = retail.tasks["24"]  # nothing to change: only information to give
    db = retail.fresh_db()
    order_id = next(oid for oid, o in db["orders"].items() if o["status"] == "pending")
    args = {"order_id": order_id, "reason": "ordered by mistake"}
    RetailTools(db).call("cancel_pending_order", args)
    verdict = score_episode(task, db, replay_gold(retail.fresh_db(), []), [{"name": "cancel_pending_order",
                            "arguments": args, "ok": True}], ["It is made of polyester and cotton."], "user_stop", 8)
    assert verdict.reward == 0.0 and verdict.communicate_ok and not verdict.db_match
    assert f'Unexpected database actions: cancel_pending_order(order_id="{order_id}"' in verdict.feedback


# ---------------------------------------------------------------- episodes in process


def test_gold_chatty_wrong_and_broken_episodes(container: Tau2Retail, fake: FakeModel) -> None:
    with TestClient(build_app(container)) as client:
        gold = RolloutResponse.model_validate(client.post("/rollout", json=_body(container, fake, "0", "gold")).json())
        chatty = client.post("/rollout", json=_body(container, fake, "0", "chatty")).json()
        wrong = client.post("/rollout", json=_body(container, fake, "0", "wrong")).json()
        info = client.post("/rollout", json=_body(container, fake, "16", "gold")).json()
        transfer = client.post("/rollout", json=_body(container, fake, "10", "gold")).json()
        failing = client.post("/rollout", json=_body(container, fake, "0", "fail")).json()
    assert gold.status == "ok" and gold.resolved_reward() == 1.0 and gold.trace
    assert gold.trace["termination"] == "user_stop" and gold.trace["db_match"] is True
    assert gold.objective_scores == {"db": 1.0, "communicate": 1.0, "actions": 1.0}
    assert gold.trace["messages"][0]["content"].startswith("<instructions>\nYou are a customer service agent")
    assert container.program().seed_candidate["domain_policy"] in gold.trace["messages"][0]["content"]
    assert gold.trace["messages"][1] == {"role": "assistant", "content": FIRST_AGENT_MESSAGE}
    assert USER_GUIDELINES in gold.trace["user_system"] and "#W2378156" in gold.trace["user_system"]
    assert "agent -> exchange_delivered_order_items(" in gold.output_text
    assert gold.usage.prompt_tokens == 70 * gold.trace["agent_calls"]  # the agent's tokens only
    assert gold.usage.model_extra["user_simulator"]["calls"] == 2
    assert gold.trace["agent_max_tokens"] == 512  # the floor over the policy block's 64
    agent_bodies = [r["body"] for r in fake.requests if not r["user_sim"]]
    assert agent_bodies and {b["max_tokens"] for b in agent_bodies} == {512}
    assert chatty["reward_info"]["outcome_reward"] == 0.0
    assert "exchange_delivered_order_items(" in chatty["actionable_side_info"]["feedback"]
    assert "(never called)" in chatty["actionable_side_info"]["feedback"]
    feedback = wrong["actionable_side_info"]["feedback"]
    assert wrong["reward_info"]["outcome_reward"] == 0.0 and "final database differs" in feedback
    assert "but the agent called exchange_delivered_order_items(" in feedback
    assert info["reward_info"]["outcome_reward"] == 1.0 and info["trace"]["missing_info"] == []
    assert transfer["reward_info"]["outcome_reward"] == 1.0 and transfer["trace"]["termination"] == "transfer"
    assert failing["status"] == "error" and "HTTP 400" in failing["error"] and failing["trace"]["termination"] == "model_error"


def test_missing_information_fails(container: Tau2Retail, fake: FakeModel) -> None:
    body = _body(container, fake, "16", "gold")
    body["task"] = {**body["task"], "evaluation_criteria": {**body["task"]["evaluation_criteria"],
                                                            "communicate_info": ["a fact never said"]}}
    with TestClient(build_app(container)) as client:
        result = client.post("/rollout", json=body).json()
    assert result["reward_info"]["outcome_reward"] == 0.0 and result["objective_scores"]["db"] == 1.0
    assert "Not communicated to the customer: 'a fact never said'" in result["actionable_side_info"]["feedback"]


def test_limits_end_episodes(data_dir: Path, fake: FakeModel) -> None:
    parser = argparse.ArgumentParser()
    Tau2Retail.add_arguments(parser)
    limited = Tau2Retail(str(data_dir))
    limited.configure(parser.parse_args(["--user-model", "user-loop", "--max-steps", "9", "--max-errors", "3"]))
    with TestClient(build_app(limited)) as client:
        looping = client.post("/rollout", json=_body(limited, fake, "0", "chatty")).json()
        broken = client.post("/rollout", json=_body(limited, fake, "0", "broken")).json()
    assert looping["status"] == "ok" and looping["reward_info"]["outcome_reward"] == 0.0
    assert looping["trace"]["termination"] == "max_steps" and looping["trace"]["steps"] == 9
    assert "the step limit was reached" in looping["actionable_side_info"]["feedback"]
    assert looping["usage"]["user_simulator"]["model"] == "user-loop"
    assert broken["trace"]["termination"] == "too_many_errors"
    errors = [c["result"] for c in broken["trace"]["tool_calls"]]
    assert "Error: Tool 'no_such_tool' not found" in errors and any("not a JSON object" in e for e in errors)


# ---------------------------------------------------------------- the process: config, preflight, concurrency


def test_process_scores_every_reference_and_isolates_state(data_dir: Path, tmp_path: Path, fake: FakeModel,
                                                           retail: RetailData, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    raw = yaml.safe_load((REPO / "configs" / "container" / "tau2_retail.yaml").read_text())
    container = ContainerSpec.model_validate({**raw["container"], "data_dir": str(data_dir)})
    scripted = ModelSpec(provider="scripted", model="scripted-rules")
    spec = RunSpec(container=container, policy=scripted, proposer=scripted, algorithm=AlgorithmSpec(name="seed_only"),
                   pools=PoolsConfig.model_validate(raw["pools"]).resolve(), budget=BudgetSpec(max_rollouts=10))

    async def drive(url: str) -> tuple[Any, dict[str, RolloutResponse]]:
        client = ContainerClient(url, concurrency=8, timeout_s=120)
        try:
            checked = await preflight(client, spec, ["domain_policy"])
            seed = checked.program.seed_candidate
            tasks = await client.tasks("train", [f"train:{i}" for i in range(74)]) + \
                await client.tasks("test", [f"test:{i}" for i in range(40)])
            requests = []
            for task in tasks:
                row = task.model_dump()
                for kind in ("gold",) + (("chatty", "wrong", "gold") if row["id"] == "0" else ()):
                    requests.append(RolloutRequest(
                        rollout_id=f"{kind}-{row['id']}-{len(requests)}", task_id=task.task_id, candidate=seed, task=row,
                        policy={"provider": "openai_compatible", "model": f"{kind}:{row['id']}", "base_url": fake.base_url}))
            results = await asyncio.gather(*(client.rollout(r) for r in requests))
            return checked, {r.rollout_id: r for r in results}
        finally:
            await client.aclose()

    with Services(tmp_path / "logs") as services:
        checked, results = asyncio.run(drive(services.container_url(spec.container)))
    assert checked.taskset.splits == {"train": 74, "test": 40}
    assert checked.program.seed_candidate["domain_policy"] == retail.policy
    assert [m.module_id for m in checked.program.modules if m.mutable] == ["domain_policy"]
    gold = {k: v for k, v in results.items() if k.startswith("gold-")}
    assert len(gold) == 115 and all(r.status == "ok" for r in results.values())
    assert [k for k, r in gold.items() if r.resolved_reward() != 1.0] == []  # every reference trajectory scores 1
    # The wrong and chatty rollouts on task 0 ran alongside two gold ones and did not leak into them.
    assert sorted(r.resolved_reward() for k, r in results.items() if "-0-" in k) == [0.0, 0.0, 1.0, 1.0]
    assert len({r.trace["agent_db_hash"] for k, r in results.items() if "-0-" in k}) == 3


def test_simulator_on_the_rollouts_gateway_url_is_attributed_to_its_role(container: Tau2Retail) -> None:
    """Without a configured simulator the user is played on the rollout's own endpoint:
    behind the harness's gateway that URL is re-addressed to the `user_simulator` role."""
    attributed = "http://127.0.0.1:5/r/run1/run1-c0000-test:0/policy/v1"
    req = RolloutRequest(rollout_id="r1", task_id="test:0", candidate={"domain_policy": "p"}, task={},
                         policy={"provider": "local", "model": "m", "inference_url": attributed})
    env = RolloutEnv(http=None)  # the clients are only built here, never used
    user, _ = container.user_client(req, env)
    assert user.base_url == "http://127.0.0.1:5/r/run1/run1-c0000-test:0/user_simulator/v1"
    assert container.policy_client(req, env).base_url == attributed
    direct = req.model_copy(update={"policy": req.policy.model_copy(update={"inference_url": None,
                                                                            "base_url": "https://api.example.com/v1"})})
    assert container.user_client(direct, env)[0].base_url == "https://api.example.com/v1"
