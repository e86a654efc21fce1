"""Model endpoint faults, injected by the scripted model's `flaky` script (a real HTTP
server; `flaky?rate=..&kinds=..` picks the faults per request body): 429 with and without
Retry-After, 503, a hang past the timeout, an empty completion, a garbled body, and a
connection refused. First one call through the real client (harness.llm.ChatClient), then
whole runs where the policy (called by the container) or the proposer (called by the
optimizer) misbehaves. An always-429 proposer is in test_algorithm_contract.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import container_spec, execute, scripted_spec
from faults import check_rows_exactly_once, small_cli_run, small_spec
from harness.errors import FailureKind, ServiceError
from harness.llm import ChatClient, ChatMessage, ChatResult
from harness.retry import RetryPolicy
from harness.processes import free_port
from harness.scripted_faults import FLAKY_KINDS
from servers import ScriptedModelThread

pytestmark = pytest.mark.timeout(300)

FAST = RetryPolicy(attempts=4, base_delay_s=0.05, max_delay_s=0.2)


def complete(url: str, *, retry: RetryPolicy = FAST, timeout_s: float = 10.0, text: str = "hello") -> ChatResult:
    async def go() -> ChatResult:
        client = ChatClient(url, "scripted", retry=retry, timeout_s=timeout_s)
        try:
            return await client.complete([ChatMessage(role="system", content="Answer."),
                                          ChatMessage(role="user", content=f"{text}\nLabels: a, b")])
        finally:
            await client.aclose()

    return asyncio.run(go())


def stats(server: ScriptedModelThread) -> dict[str, Any]:
    return httpx.get(server.stats_url, timeout=5).json()


# ---------------------------------------------------------------- one call


@pytest.mark.parametrize("kind", ["429", "429_bare", "503", "slow", "garbage"])
def test_a_fault_then_an_answer(kind: str) -> None:
    """Each kind once, then the same request is answered: the client retries and succeeds."""
    # a timeout that a healthy answer beats even on a loaded machine (a second timeout
    # would be a third request), and a hang well past it
    with ScriptedModelThread(f"flaky?rate=1&kinds={kind}&attempts=1&retry_after=0.3&slow_s=10") as server:
        started = time.monotonic()
        result = complete(server.base_url, timeout_s=2.0)
        elapsed = time.monotonic() - started
        served = stats(server)
    assert result.text == "a"  # the rules policy's answer: the first label
    assert served["faults"] == {kind: 1} and served["total"] == 2
    if kind == "429":
        assert elapsed >= 0.3  # Retry-After honoured
    if kind == "slow":
        assert 2.0 <= elapsed < 10.0  # gave up on the hung attempt at the timeout, not after 10 s


def test_retry_after_is_capped() -> None:
    """A Retry-After far in the future fails the call within the cap, not hours later."""
    with ScriptedModelThread("flaky?rate=1&kinds=429&attempts=0&retry_after=3600") as server:
        started = time.monotonic()
        with pytest.raises(ServiceError) as caught:
            complete(server.base_url, retry=RetryPolicy(attempts=3, base_delay_s=0.05, max_retry_after_s=0.2))
        assert time.monotonic() - started < 5.0
        assert stats(server)["total"] == 3
    assert caught.value.kind is FailureKind.RATE_LIMITED


@pytest.mark.parametrize("kind, failure, needle", [
    ("503", FailureKind.TRANSIENT, "HTTP 503"),
    ("429_bare", FailureKind.RATE_LIMITED, "HTTP 429"),
    ("garbage", FailureKind.TRANSIENT, "malformed completion"),
    ("slow", FailureKind.TRANSIENT, "ReadTimeout"),
])
def test_a_persistent_fault_gives_up_after_the_cap(kind: str, failure: FailureKind, needle: str) -> None:
    with ScriptedModelThread(f"flaky?rate=1&kinds={kind}&attempts=0&slow_s=5") as server:
        with pytest.raises(ServiceError) as caught:
            complete(server.base_url, timeout_s=0.3)
        served = stats(server)
    assert caught.value.kind is failure and needle in str(caught.value)
    assert served["faults"] == {kind: FAST.attempts}  # every attempt, and not one more


def test_an_empty_completion_is_an_answer_not_an_error() -> None:
    with ScriptedModelThread("flaky?rate=1&kinds=empty&attempts=0") as server:
        result = complete(server.base_url)
        assert stats(server)["total"] == 1
    assert result.text == "" and result.finish_reason == "stop"


def test_a_refused_connection_is_transient_and_retried() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ServiceError) as caught:
        complete(url)
    assert caught.value.kind is FailureKind.TRANSIENT
    assert str(caught.value) == f"model call failed (transient): ConnectError calling {url}/chat/completions"
    assert time.monotonic() - started >= 0.5 * (0.05 + 0.1 + 0.2)  # it backed off between attempts


# ---------------------------------------------------------------- whole runs


def test_a_flaky_policy_behind_the_container(tmp_path, data_dir, banking77_url) -> None:
    """The container calls the policy; every faulted call is retried by its client, so every
    row ends ok; an empty completion is the model's answer (reward 0, feedback says so)."""
    kinds = ",".join(FLAKY_KINDS)
    with ScriptedModelThread(f"flaky?rate=0.5&kinds={kinds}&retry_after=0.1&slow_s=0.3&seed=3") as policy, \
            ScriptedModelThread("rules") as proposer:
        outcome = execute(small_spec(container_spec("banking77", data_dir), tmp_path, budget=30), banking77_url,
                         policy.base_url, proposer.base_url)
        faults = stats(policy)["faults"]
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    assert set(faults) == set(FLAKY_KINDS), faults  # each kind happened at least once
    assert {r["status"] for r in ev["rollouts"]} == {"ok"}
    empty = [r for r in ev["rollouts"] if r["output"] == ""]
    assert len(empty) == faults["empty"]
    assert all(r["reward"] == 0.0 and "the answer was empty" in r["feedback"] for r in empty)


def test_a_flaky_proposer(tmp_path, data_dir, banking77_url, scripted_policy) -> None:
    """Faulted proposer calls are retried; an empty proposal is recorded as such; the run finishes."""
    spec = small_spec(container_spec("banking77", data_dir), tmp_path, budget=40)
    proposer = scripted_spec("flaky?rate=0.5&retry_after=0.1&slow_s=2&seed=1", max_tokens=4000)
    spec = spec.model_copy(update={"proposer": proposer.model_copy(update={"timeout_s": 0.5})})
    with ScriptedModelThread(proposer.source) as server:
        outcome = execute(spec, banking77_url, scripted_policy.base_url, server.base_url)
        served = stats(server)
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    assert sum(served["faults"].values()) >= 2, served
    assert ev["proposals"] and ev["manifest"]["totals"]["proposer_calls"] >= 1
    statuses = {p["status"] for p in ev["proposals"]}
    assert statuses <= {"changed", "unchanged", "empty", "error"}
    if served["faults"].get("empty"):
        assert "empty" in statuses or "changed" in statuses  # a retry on the next format may follow


def test_a_refused_proposer_fails_the_run_cleanly(tmp_path, data_dir, banking77_url, scripted_policy) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    spec = small_spec(container_spec("banking77", data_dir), tmp_path, budget=30, params={"max_proposer_errors": 1})
    outcome = execute(spec, banking77_url, scripted_policy.base_url, dead)
    assert outcome.status == "failed"
    assert outcome.error == f"model call failed (transient): ConnectError calling {dead}/chat/completions"
    ev = check_rows_exactly_once(outcome.evidence_dir)
    assert ev["manifest"]["status"] == "failed" and ev["manifest"]["error"] == outcome.error
    assert {r["status"] for r in ev["rollouts"]} == {"ok"}  # the seed's rows before the failure are kept


def test_a_refused_policy_fails_the_run_at_the_tolerance(tmp_path, data_dir, banking77_url, scripted_policy) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    spec = small_spec(container_spec("banking77", data_dir), tmp_path, budget=30)
    outcome = execute(spec, banking77_url, dead, scripted_policy.base_url)
    assert outcome.status == "failed"
    assert outcome.error is not None and "rollouts failed (tolerance 50%)" in outcome.error
    assert f"ConnectError calling {dead}/chat/completions" in outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    assert {r["status"] for r in ev["rollouts"]} == {"error"}
    # error rows carry no reward (never a zero) and the cause
    assert all(r["reward"] is None and "ConnectError" in r["error"] for r in ev["rollouts"])


def test_the_cli_with_flaky_models(tmp_path: Path, data_dir: Path) -> None:
    """`python -m harness` as a user runs it (the model calls go through whatever path the
    harness takes by default) with both models failing a fifth of their calls once."""
    evidence = tmp_path / "evidence"
    source = "'flaky?rate=0.2&kinds=429,429_bare,503,garbage&retry_after=0.1'"
    ev = small_cli_run(evidence, data_dir, f"policy.source={source}", f"proposer.source={source}")
    assert ev["manifest"]["status"] == "done"
    assert {r["status"] for r in ev["rollouts"]} == {"ok"}
