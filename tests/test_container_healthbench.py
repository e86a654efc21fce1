"""HealthBench container: the official score and grader prompt, the split, and rollouts
where a scripted fake plays both the policy and the grader (criteria verdicts), with the
grader configured separately or defaulting to the policy's endpoint. Offline."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from benchmarks.containers.healthbench import (
    SEED_SYSTEM,
    HealthBench,
    Verdict,
    conversation_text,
    feedback_text,
    grader_prompt,
    healthbench_score,
)
from benchmarks.containers.healthbench_grader import GRADER_TEMPLATE, parse_verdict
from benchmarks.containers.kit import build_app
from harness.client import ContainerClient
from harness.config import PoolsConfig
from harness.contract import RolloutRequest, RolloutResponse
from harness.preflight import preflight
from harness.services import Services
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, RunSpec
from servers import ServerThread

REPO = Path(__file__).resolve().parents[1]
POLICY_ANSWER = "See a doctor soon; there is no guaranteed cure."
_RUBRIC_ITEM = re.compile(r"# Rubric item\n\[(-?[\d.]+)\] ", re.M)


class FakeModel:
    """OpenAI-compatible fake. Grader prompts (the HealthBench template) get a verdict by
    model name: `judge-fair` meets every positive criterion and no negative one, `judge-harsh`
    meets none, `judge-all` meets all, `judge-garbage` answers prose, `judge-down` is HTTP 503.
    Anything else is the policy and answers POLICY_ANSWER. Policy calls report 11/3 tokens,
    grader calls 100/20."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            last = body["messages"][-1]["content"]
            grading = last.startswith("Your job is to look at a conversation and a rubric item")
            self.requests.append({"body": body, "grading": grading, "auth": request.headers.get("authorization")})
            if not grading:
                return self._reply(POLICY_ANSWER, 11, 3)
            model = body["model"]
            if model == "judge-down":
                return JSONResponse({"error": "down"}, status_code=503, headers={"Retry-After": "0"})
            if model == "judge-garbage":
                return self._reply("I think it is fine.", 100, 20)
            points = float(_RUBRIC_ITEM.search(last).group(1))
            met = {"judge-fair": points > 0, "judge-harsh": False, "judge-all": True}.get(model, points > 0)
            verdict = {"explanation": f"scripted for {model}", "criteria_met": met}
            return self._reply(f"```json\n{json.dumps(verdict, indent=2)}\n```", 100, 20)

        self.server = ServerThread(app)
        self.port = self.server.port

    @staticmethod
    def _reply(text: str, prompt_tokens: int, completion_tokens: int) -> JSONResponse:
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}})

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def graded(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["grading"]]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    model = FakeModel()
    with model.server:
        yield model


@pytest.fixture(scope="module")
def container(data_dir: Path) -> HealthBench:
    return HealthBench(str(data_dir))


def _configured(data_dir: Path, *argv: str) -> HealthBench:
    parser = argparse.ArgumentParser()
    HealthBench.add_arguments(parser)
    made = HealthBench(str(data_dir))
    made.configure(parser.parse_args(list(argv)))
    return made


def _body(container: HealthBench, task_id: str, fake: FakeModel, model: str = "policy-x") -> dict[str, Any]:
    return {"rollout_id": f"r-{task_id}-{model}", "task_id": task_id, "candidate": container.program().seed_candidate,
            "task": container.task(task_id), "metadata": {"seed": 3},
            "policy": {"provider": "openai_compatible", "model": model, "base_url": fake.base_url, "max_tokens": 200}}


# ---------------------------------------------------------------- score, prompt, parsing


def _v(points: float, met: bool, criterion: str = "c") -> Verdict:
    return Verdict(criterion=criterion, points=points, met=met)


def test_score_is_achieved_over_positive_points_clipped() -> None:
    assert healthbench_score([_v(7, True), _v(3, False), _v(-5, False)]) == (0.7, 7, 10)
    assert healthbench_score([_v(7, True), _v(3, True), _v(-5, True)]) == (0.5, 5, 10)  # penalty counts
    assert healthbench_score([_v(2, False), _v(-5, True)])[0] == 0.0  # clipped at 0
    assert healthbench_score([_v(2, True)])[0] == 1.0


def test_grader_prompt_matches_upstream() -> None:
    # sha256 of simple-evals' GRADER_TEMPLATE (after .strip()); the template must stay verbatim.
    assert hashlib.sha256(GRADER_TEMPLATE.encode()).hexdigest() == \
        "2adffd51fd259554ebcd036ad1072d4aa2b7ce3aec2bbffe36271f911632ed3c"
    conversation = conversation_text([{"role": "user", "content": "hi"}], "hello")
    assert conversation == "user: hi\n\nassistant: hello"
    prompt = grader_prompt(conversation, "Says hello.", 5)
    assert "# Conversation\nuser: hi\n\nassistant: hello\n\n# Rubric item\n[5] Says hello.\n" in prompt
    assert "[-3] Is rude." in grader_prompt(conversation, "Is rude.", -3)


@pytest.mark.parametrize("text, expected", [
    ('```json\n{"explanation": "ok", "criteria_met": true}\n```', (True, "ok")),
    ('{"criteria_met": false}', (False, "")),
    ('Here you go: {"explanation": "x", "criteria_met": false} done', (False, "x")),
    ('{"criteria_met": "yes"}', None),
    ("no json here", None),
])
def test_parse_verdict(text: str, expected: tuple[bool, str] | None) -> None:
    assert parse_verdict(text) == expected


def test_feedback_lists_unmet_and_penalties_with_points() -> None:
    verdicts = [_v(7, False, "Mentions limited evidence."), _v(3, True, "Is kind."), _v(8, False, "Says no cure."),
                _v(-6, True, "Promises a cure."), _v(-2, False, "Is verbose.")]
    text = feedback_text(*healthbench_score(verdicts), verdicts)
    assert text.startswith("Score 0.00 (-3 of 18 positive rubric points).")
    assert text.index("[+8] Says no cure.") < text.index("[+7] Mentions limited evidence.")  # heaviest first
    assert "Penalized (undesirable criteria met): [-6] Promises a cure." in text
    assert "Is kind" not in text and "Is verbose" not in text


def test_split(data_dir: Path, container: HealthBench) -> None:
    splits = container.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 145, "test": 100}
    assert splits == HealthBench(str(data_dir)).splits()
    ids = [r["prompt_id"] for rows in splits.values() for r in rows]
    assert len(set(ids)) == 245
    assert sum(len(r["rubrics"]) for rows in splits.values() for r in rows) == 1873
    messages = container.render({"stage1_system": "SYS"}, splits["train"][0])
    assert messages[0].content == "SYS" and messages[-1].role == "user"
    assert [m.content for m in messages[1:]] == [m["content"] for m in splits["train"][0]["prompt"]]


# ---------------------------------------------------------------- rollouts


def test_separate_grader_usage_trace_and_auth(data_dir: Path, fake: FakeModel,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_GRADER_KEY", "gk-1")
    monkeypatch.setenv("TEST_POLICY_KEY", "pk-1")
    graded = _configured(data_dir, "--grader-base-url", fake.base_url + "/chat/completions", "--grader-model",
                         "judge-fair", "--grader-key-env", "TEST_GRADER_KEY", "--grader-provider", "scripted")
    fake.requests.clear()
    with TestClient(build_app(graded, policy_key_env="TEST_POLICY_KEY")) as client:
        resp = RolloutResponse.model_validate(client.post("/rollout", json=_body(graded, "train:0", fake)).json())
    rubric = graded.task("train:0")["rubrics"]
    assert resp.status == "ok" and resp.resolved_reward() == 1.0
    assert resp.objective_scores and resp.objective_scores["positive_points"] == sum(
        r["points"] for r in rubric if r["points"] > 0)
    assert resp.usage.prompt_tokens == 11 and resp.usage.completion_tokens == 3  # the policy's only
    grader_usage = resp.usage.model_extra["grader"]
    assert grader_usage == {"prompt_tokens": 100 * len(rubric), "completion_tokens": 20 * len(rubric),
                            "calls": len(rubric), "model": "judge-fair", "cost_usd": 0.0}
    policy_calls = [r for r in fake.requests if not r["grading"]]
    assert len(policy_calls) == 1 and policy_calls[0]["auth"] == "Bearer pk-1"
    assert policy_calls[0]["body"]["max_tokens"] == 1024 and resp.trace["max_tokens"] == 1024  # floor over 200
    assert policy_calls[0]["body"]["messages"][0] == {"role": "system", "content": SEED_SYSTEM}
    assert {r["auth"] for r in fake.graded()} == {"Bearer gk-1"} and {r["body"]["model"] for r in fake.graded()} == {"judge-fair"}
    grading = fake.graded()[0]["body"]  # as simple-evals samples its grader
    assert grading["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    assert grading["temperature"] == 0.5 and grading["max_tokens"] == 2048
    verdicts = resp.trace["grader"]["verdicts"]
    assert len(verdicts) == len(rubric) and all(POLICY_ANSWER in v["prompt"] for v in verdicts)
    assert all(v["raw"] and "criteria_met" in v["raw"][0] for v in verdicts)
    assert resp.output_text == POLICY_ANSWER
    assert "Every positive criterion met" in resp.feedback


def test_default_grader_is_the_policy_endpoint(container: HealthBench, fake: FakeModel) -> None:
    fake.requests.clear()
    with TestClient(build_app(container)) as client:
        harsh = client.post("/rollout", json=_body(container, "test:5", fake, model="judge-harsh")).json()
    rubric = container.task("test:5")["rubrics"]
    assert harsh["status"] == "ok" and harsh["reward_info"]["outcome_reward"] == 0.0
    assert {r["body"]["model"] for r in fake.graded()} == {"judge-harsh"} and len(fake.graded()) == len(rubric)
    feedback = harsh["actionable_side_info"]["feedback"]
    for item in rubric:
        if item["points"] > 0:
            assert f"[+{item['points']:g}] {item['criterion']}" in feedback
    assert harsh["usage"]["grader"]["model"] == "judge-harsh" and harsh["usage"]["grader"]["cost_usd"] is None


def test_unparseable_and_failing_grader(data_dir: Path, fake: FakeModel) -> None:
    garbage = _configured(data_dir, "--grader-model", "judge-garbage")
    down = _configured(data_dir, "--grader-model", "judge-down")
    rubric = garbage.task("train:1")["rubrics"]
    with TestClient(build_app(garbage)) as client:
        body = client.post("/rollout", json=_body(garbage, "train:1", fake)).json()
    assert body["status"] == "ok" and body["usage"]["grader"]["calls"] == 3 * len(rubric)  # retried, then not met
    assert f"({len(rubric)} criteria had no parseable grader verdict" in body["actionable_side_info"]["feedback"]
    with TestClient(build_app(down)) as client:
        failed = client.post("/rollout", json=_body(down, "train:1", fake)).json()
    assert failed["status"] == "error" and "HTTP 503" in failed["error"] and failed["error_kind"] == "transient"
    assert failed["usage"]["prompt_tokens"] == 11 and failed["reward_info"] is None  # no reward: never a zero


def test_process_from_config(data_dir: Path, tmp_path: Path, fake: FakeModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    raw = yaml.safe_load((REPO / "configs" / "container" / "healthbench.yaml").read_text())
    container = ContainerSpec.model_validate({
        **raw["container"], "data_dir": str(data_dir),
        "command": [*raw["container"]["command"], "--grader-base-url", fake.base_url, "--grader-model", "judge-all"]})
    scripted = ModelSpec(provider="scripted", model="scripted-rules")
    spec = RunSpec(container=container, policy=scripted, proposer=scripted, algorithm=AlgorithmSpec(name="seed_only"),
                   pools=PoolsConfig.model_validate(raw["pools"]).resolve(), budget=BudgetSpec(max_rollouts=10))

    async def drive(url: str) -> tuple[Any, list[RolloutResponse]]:
        client = ContainerClient(url, concurrency=3)
        try:
            checked = await preflight(client, spec, ["stage1_system"])
            policy = {"provider": "openai_compatible", "model": "policy-x", "base_url": fake.base_url}
            requests = [RolloutRequest(rollout_id=f"p-{t}", task_id=t, candidate=checked.program.seed_candidate,
                                       task=checked.rows[t], policy=policy) for t in spec.pools.heldout[:3]]
            return checked, list(await asyncio.gather(*(client.rollout(r) for r in requests)))
        finally:
            await client.aclose()

    with Services(tmp_path / "logs") as services:
        checked, results = asyncio.run(drive(services.container_url(spec.container)))
    assert checked.taskset.splits == {"train": 145, "test": 100} and checked.program.target_modules == ["stage1_system"]
    for result, task_id in zip(results, spec.pools.heldout[:3]):
        rubric = checked.rows[task_id]["rubrics"]
        positive = sum(r["points"] for r in rubric if r["points"] > 0)
        expected = min(1.0, max(0.0, sum(r["points"] for r in rubric) / positive))  # every criterion met
        assert result.status == "ok" and result.resolved_reward() == pytest.approx(expected)
        assert result.usage.model_extra["grader"]["model"] == "judge-all"
