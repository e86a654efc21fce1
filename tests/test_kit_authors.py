"""The container kit for its authors: score() gets the whole policy result, an exception in
render/score is an error row with its message (not a 500 the harness retries, so the paid
policy call is not repeated; one log line each, the traceback once), and the kit sends what
the policy saw as actionable_side_info.inputs. Real loopback servers, offline."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from benchmarks.containers.kit import (
    PROGRAM_VERSION, ChatMessage, PolicyResult, ProgramModule, ProgramResponse, RolloutRequest, Row, SingleCallContainer,
    build_app,
)
from harness.client import ContainerClient
from harness.outcome import judge

from servers import ServerThread


class Sums(SingleCallContainer):
    """Add two numbers; row 2's scorer is broken, row 3's renderer is."""

    taskset_id = "sums"
    name = "sums"

    def load_splits(self) -> dict[str, list[Row]]:
        return {"train": [{"a": 1, "b": 2}, {"a": 3, "b": 4}, {"a": 5, "b": 6}, {"a": 7, "b": 8}]}

    def program(self) -> ProgramResponse:
        return ProgramResponse(version=PROGRAM_VERSION, program_id="sums.v1", target_modules=["system"],
                               modules=[ProgramModule(module_id="system", role="system", content="Add.", mutable=True)],
                               seed_candidate={"system": "Add."})

    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]:
        if row["a"] == 7:
            raise KeyError("template field 'c'")
        return [ChatMessage(role="system", content=candidate["system"]),
                ChatMessage(role="user", content=f"What is {row['a']} + {row['b']}?")]

    def score(self, row: Row, result: PolicyResult) -> tuple[float, str]:
        if row["a"] == 5:
            raise ValueError("no scorer for this row")
        cut = " The answer was cut off at the token limit." if result.finish_reason == "length" else ""
        right = result.text.strip() == str(row["a"] + row["b"])
        return float(right), f"{'Right' if right else 'Wrong'} ({result.completion_tokens} tokens).{cut}"


class FakePolicy:
    """OpenAI-compatible: answers `3`, cut off (finish_reason length); counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def complete(request: Request) -> dict[str, Any]:
            await request.json()
            self.calls += 1
            return {"choices": [{"message": {"role": "assistant", "content": "3"}, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 1}}


@pytest.fixture()
def served() -> Any:
    policy = FakePolicy()
    with ServerThread(policy.app) as model, ServerThread(build_app(Sums())) as container:
        yield container.url, f"{model.url}/v1", policy


def _request(task_id: str, policy_url: str) -> RolloutRequest:
    return RolloutRequest(rollout_id=f"r-{task_id}", task_id=task_id, candidate={"system": "Add."}, task={},
                          policy={"provider": "fake", "model": "m", "base_url": policy_url, "max_tokens": 8})


def _rollouts(url: str, requests: list[RolloutRequest]) -> list[Any]:
    async def go() -> list[Any]:
        client = ContainerClient(url)
        try:
            return [await client.rollout(r) for r in requests]
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_score_gets_the_whole_policy_result_and_inputs_go_to_the_proposer(served) -> None:
    url, policy_url, _ = served
    (response,) = _rollouts(url, [_request("train:0", policy_url)])
    outcome = judge(response)
    assert outcome.reward == 1.0 and outcome.feedback_source == "actionable_side_info"
    assert outcome.feedback == "Right (1 tokens). The answer was cut off at the token limit."
    assert outcome.inputs == "What is 1 + 2?"  # the kit's default: the non-system messages


def test_an_exception_in_score_or_render_is_an_error_row_not_a_retried_500(served, caplog) -> None:
    url, policy_url, policy = served
    caplog.set_level(logging.ERROR, logger="benchmarks.containers.kit")
    responses = _rollouts(url, [_request("train:2", policy_url), _request("train:2", policy_url),
                                _request("train:3", policy_url)])
    outcomes = [judge(r) for r in responses]
    assert [o.reward for o in outcomes] == [None, None, None]
    assert outcomes[0].error == "status error: ValueError: no scorer for this row"
    assert outcomes[2].error == "status error: KeyError: \"template field 'c'\""
    # score ran after the policy call, once per request; render failed before any call
    assert policy.calls == 2
    assert responses[0].usage.prompt_tokens == 9  # the paid call's usage stays on the error row
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("score raised on train:2: ValueError") for m in lines) == 2
    assert sum(m.startswith("render raised on train:3: KeyError") for m in lines) == 1
    assert sum(m.startswith("traceback (shown once)") for m in lines) == 2  # one per place that raised


def test_a_score_error_answers_200_without_a_reward(served) -> None:
    url, policy_url, _ = served
    body = _request("train:2", policy_url).model_dump(exclude_none=True)
    response = httpx.post(f"{url}/rollout", json=body)
    assert response.status_code == 200
    payload = response.json()
    assert payload["status"] == "error" and payload["reward_info"] is None and payload["error_kind"] == "fatal"


def test_the_kit_is_the_one_import_of_a_container() -> None:
    """Every name the kit exports exists, the contract's types are the harness's own, and each
    reference container is exactly one of the two kinds (no dead score, no default rollout)."""
    import benchmarks.containers.kit as kit
    import harness.contract as contract
    from benchmarks.containers.banking77 import Banking77
    from benchmarks.containers.chaos import Chaos
    from benchmarks.containers.healthbench import HealthBench
    from benchmarks.containers.heart_disease import HeartDisease
    from benchmarks.containers.hotpotqa import HotpotQA
    from benchmarks.containers.instant import InstantBanking77
    from benchmarks.containers.tau2_retail import Tau2Retail

    assert [name for name in kit.__all__ if not hasattr(kit, name)] == []
    assert kit.RolloutResponse is contract.RolloutResponse and kit.ProgramModule is contract.ProgramModule
    single = (Banking77, Chaos, HeartDisease, HotpotQA, InstantBanking77)
    assert all(issubclass(c, kit.SingleCallContainer) and not issubclass(c, kit.MultiStepContainer) for c in single)
    multi = (HealthBench, Tau2Retail)
    assert all(issubclass(c, kit.MultiStepContainer) and not hasattr(c, "score") for c in multi)
    with pytest.raises(TypeError, match="score"):  # a single-call container must score
        type("NoScore", (kit.SingleCallContainer,), {"load_splits": Sums.load_splits, "program": Sums.program,
                                                     "render": Sums.render})()
