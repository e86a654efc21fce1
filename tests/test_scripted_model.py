"""The scripted model through the real HTTP client path (harness.llm.ChatClient)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from harness.errors import FailureKind, ServiceError
from harness.http_pool import SharedSession
from harness.llm import ChatClient, ChatMessage, ChatResult
from harness.retry import RetryPolicy
from harness.scripted_model import CURRENT_CLOSE, CURRENT_OPEN, PROPOSER_MARKER, format_example, rules_in
from harness.scripted_server import SCRIPTS, ScriptedModelServer
from servers import ScriptedModelThread

INSTRUCTION = 'Classify the customer message.\n- If the message mentions "refund", answer: request_refund'
LABELS = "Available intents:\n- greeting\n- request_refund\n- track_order"
FAST_RETRY = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05)


def chat(base_url: str, system: str, user: str, *, max_tokens: int = 256, retry: RetryPolicy | None = None) -> ChatResult:
    async def go() -> ChatResult:
        client = ChatClient(base_url, "scripted", retry=retry or FAST_RETRY, timeout_s=10.0)
        try:
            messages = [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)]
            return await client.complete(messages, max_tokens=max_tokens)
        finally:
            await client.aclose()

    return asyncio.run(go())


def stats(server: ScriptedModelServer | ScriptedModelThread) -> dict:
    return httpx.get(server.stats_url, timeout=5.0).json()


@pytest.fixture(scope="module")
def rules_server():
    # a real child process, as the harness runs it
    with ScriptedModelServer("rules") as server:
        yield server


def test_policy_follows_first_matching_rule(rules_server: ScriptedModelServer) -> None:
    result = chat(rules_server.base_url, INSTRUCTION, f"I need a REFUND for my order\n{LABELS}")
    assert result.text == "request_refund"
    assert result.finish_reason == "stop"
    assert result.completion_tokens == 1
    assert result.prompt_tokens == len(INSTRUCTION.split()) + len(f"I need a REFUND for my order\n{LABELS}".split())


def test_policy_falls_back_to_first_label_then_unknown(rules_server: ScriptedModelServer) -> None:
    # "request_refund" in the label list must not trigger the refund rule
    assert chat(rules_server.base_url, INSTRUCTION, f"hello there\n{LABELS}").text == "greeting"
    assert chat(rules_server.base_url, INSTRUCTION, "where is it?\nLabels: track_order, greeting").text == "track_order"
    assert chat(rules_server.base_url, "Answer.", "no labels here").text == "unknown"


def test_proposer_adds_one_rule_for_first_uncovered_failure(rules_server: ScriptedModelServer) -> None:
    examples = (
        format_example(1, "I want a refund please", "request_refund", "Correct. Expected: request_refund")
        + format_example(2, "My refund never arrived", "greeting", "Expected: request_refund")  # label already ruled
        + format_example(3, "Where is my package delivery?", "greeting", "Wrong, expected intent `track_order`")
        + format_example(4, "cancel my subscription", "greeting", "Expected: cancel_plan")
    )
    user = f"Improve the instruction.\n{CURRENT_OPEN}\n{INSTRUCTION}\n{CURRENT_CLOSE}\n{examples}"
    result = chat(rules_server.base_url, f"{PROPOSER_MARKER} for a classifier.", user)
    assert result.text.startswith("```\n") and result.text.endswith("\n```")
    new_instruction = result.text.strip("`\n")
    assert new_instruction.startswith(INSTRUCTION)
    # the longest >=5-letter word of example 3's input becomes the rule word
    assert rules_in(new_instruction) == [("refund", "request_refund"), ("delivery", "track_order")]
    # the improved instruction now makes the policy answer the failing example correctly
    assert chat(rules_server.base_url, new_instruction, f"where is my package delivery\n{LABELS}").text == "track_order"


def test_proposer_returns_instruction_unchanged_when_nothing_to_add(rules_server: ScriptedModelServer) -> None:
    examples = format_example(1, "I want a refund please", "request_refund", "Expected: request_refund")
    user = f"{CURRENT_OPEN}\n{INSTRUCTION}\n{CURRENT_CLOSE}\n{examples}"
    result = chat(rules_server.base_url, PROPOSER_MARKER, user)
    assert result.text == f"```\n{INSTRUCTION}\n```"


def test_stats_count_requests_per_role() -> None:
    with ScriptedModelThread("rules") as server:
        chat(server.base_url, "Answer.", "x")
        chat(server.base_url, "Answer.", "y")
        chat(server.base_url, PROPOSER_MARKER, "z")
        assert stats(server)["requests"] == {"policy": 2, "proposer": 1}
        models = httpx.get(f"{server.base_url}/models", timeout=5.0).json()
        assert models["data"][0]["id"] == "scripted-rules"


def test_queue_replies_in_order_and_cycles() -> None:
    with ScriptedModelServer("queue", replies=["first", "second reply", "three words here"]) as server:
        texts = [chat(server.base_url, "s", "u").text for _ in range(4)]
        assert texts == ["first", "second reply", "three words here", "first"]
        truncated = chat(server.base_url, "s", "u", max_tokens=1)
        assert (truncated.text, truncated.finish_reason) == ("second", "length")


def test_fail_is_transient_after_retries() -> None:
    with ScriptedModelThread("fail") as server:
        with pytest.raises(ServiceError) as info:
            chat(server.base_url, "s", "u")
        assert info.value.kind is FailureKind.TRANSIENT
        assert stats(server)["requests"]["policy"] == FAST_RETRY.attempts


def test_fail_429_is_rate_limited_and_honours_retry_after() -> None:
    # Retry-After: 0 overrides the (long) backoff, so this finishes at once
    slow_backoff = RetryPolicy(attempts=3, base_delay_s=30.0, max_delay_s=60.0)
    with ScriptedModelThread("fail_429") as server:
        with pytest.raises(ServiceError) as info:
            chat(server.base_url, "s", "u", retry=slow_backoff)
        assert info.value.kind is FailureKind.RATE_LIMITED
        assert stats(server)["total"] == 3


def test_registry_and_bad_arguments() -> None:
    assert {"rules", "queue", "fail", "fail_429"} <= set(SCRIPTS)
    with pytest.raises(ValueError, match="unknown script"):
        ScriptedModelServer("nope")
    with pytest.raises(ValueError, match="replies"):
        ScriptedModelThread("queue")


def test_policy_with_labels_before_the_message(rules_server: ScriptedModelServer) -> None:
    # the banking77 container's layout: label list first, then the customer message
    user = ("Intent labels:\ncard_arrival\nrefund_not_showing_up\n\nCustomer message:\n{q}\n\n"
            "Answer with the intent label only.")
    system = 'Classify.\n- If the message mentions "refund", answer: refund_not_showing_up'
    assert chat(rules_server.base_url, system, user.format(q="Where is my refund?")).text == "refund_not_showing_up"
    assert chat(rules_server.base_url, system, user.format(q="Has my card shipped?")).text == "card_arrival"


def test_proposer_understands_the_optimizers_prompt(rules_server: ScriptedModelServer) -> None:
    # the real GEPA proposer prompt (JSON rows with the label, Reward lines) and reply parsing
    from algorithms.gepa.proposer import build_messages
    from algorithms.gepa.optimizer import GepaParams
    from algorithms.gepa.reflect import apply
    from harness.candidates import RolloutResult

    seed = "You are a banking intent classifier. Reply with the label only."
    examples = [
        RolloutResult(candidate_id="c0", task_id="t1", reward=1.0, status="ok", output="card_arrival",
                      feedback="Correct: `card_arrival`.", task={"text": "my card has not come", "label": "card_arrival"}),
        RolloutResult(candidate_id="c0", task_id="t2", reward=0.0, status="ok", output="card_arrival",
                      feedback="Wrong: expected intent `exchange_rate`, the answer was `card_arrival`.",
                      task={"text": "What exchange rate do you use?", "label": "exchange_rate"}),
    ]
    for edit_format in ("rules", "rewrite"):
        messages = build_messages(seed, examples, edit_format, {"description": "banking77"})
        result = chat(rules_server.base_url, messages[0].content, messages[1].content)
        settings = GepaParams().edit_settings()
        proposal = apply(seed, messages, [result], edit_format, examples, None, settings)
        assert proposal.status == "changed"
        assert rules_in(proposal.text) == [("exchange", "exchange_rate")]


def test_chat_clients_on_a_callers_session_leave_it_open(rules_server: ScriptedModelServer) -> None:
    """A container builds a ChatClient per rollout on the app's one session: closing such a
    client leaves the session to its owner (the next rollout uses it), while a client that
    opened its own session closes it."""
    messages = [ChatMessage(role="system", content=INSTRUCTION), ChatMessage(role="user", content=f"a refund\n{LABELS}")]

    async def go() -> tuple[list[str], bool, bool]:
        shared = SharedSession(timeout_s=10.0)
        try:
            texts = []
            for _ in range(3):
                client = ChatClient(rules_server.base_url, "scripted", client=shared)
                texts += [r.text for r in await asyncio.gather(*(client.complete(messages) for _ in range(3)))]
                await client.aclose()
            session = shared.get()
            own = ChatClient(rules_server.base_url, "scripted")
            texts.append((await own.complete(messages)).text)
            opened = own._session.get()
            await own.aclose()
            return texts, not session.closed and shared.get() is session, opened.closed
        finally:
            await shared.aclose()

    texts, shared_open, own_closed = asyncio.run(go())
    assert texts == ["request_refund"] * 10
    assert shared_open and own_closed
