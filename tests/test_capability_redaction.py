"""A gateway capability URL (`/c/<token>/r/...`) is the run's key to the gateway: error text
that names it (a model call that timed out, an endpoint that answered 500, a container's own
error) keeps the URL but never the token, in the exception, the evidence rows and the manifest."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from harness.errors import ServiceError, hide_capabilities
from harness.evidence.rows import EventRow, RolloutRow
from harness.llm import ChatClient, ChatMessage
from harness.processes import free_port
from harness.retry import RetryPolicy
from servers import ServerThread

TOKEN = "k3Y-capability-token_0123456789abcdef"
PATH = f"/c/{TOKEN}/r/run1~abc/run1-c0000-train:0/policy/v1"


def _call(base_url: str) -> str:
    client = ChatClient(base_url, "m", timeout_s=5.0, retry=RetryPolicy(attempts=1))

    async def go() -> None:
        try:
            await client.complete([ChatMessage(role="user", content="hi")])
        finally:
            await client.aclose()

    with pytest.raises(ServiceError) as caught:
        asyncio.run(go())
    return str(caught.value)


def test_a_call_nobody_answers_names_the_url_without_its_token() -> None:
    message = _call(f"http://127.0.0.1:{free_port()}{PATH}")
    assert TOKEN not in message and "ConnectError calling http://127.0.0.1:" in message
    assert "/c/***/r/run1~abc/run1-c0000-train:0/policy/v1/chat/completions" in message


def test_an_error_status_names_the_url_without_its_token() -> None:
    async def fail(request):  # an endpoint that echoes the URL it was called on
        return JSONResponse({"error": f"broken at {request.url}"}, status_code=500)

    app = Starlette(routes=[Route("/{path:path}", fail, methods=["POST"])])
    with ServerThread(app) as server:
        message = _call(f"{server.url}{PATH}")
    assert message.startswith("model call failed (transient): HTTP 500 from ") and TOKEN not in message


def test_evidence_rows_keep_no_token_whoever_wrote_the_error() -> None:
    text = f"policy call failed: ReadTimeout calling http://127.0.0.1:9{PATH}/chat/completions"
    row = RolloutRow(run_id="r", seq=0, rollout_id="x", candidate_id="c0000", task_id="train:0", split="train",
                     stage="seed", reward=None, status="error", error=text, error_kind="transient",
                     prompt_tokens=0, completion_tokens=0, cost_usd=None, latency_s=0.0, elapsed_s=0.0)
    event = EventRow(run_id="r", seq=0, elapsed_s=0.0, kind="error", message=text, data_json="{}")
    for stored in (row.error, event.message):
        assert stored is not None and TOKEN not in stored and "/c/***/r/run1~abc/" in stored
    assert hide_capabilities("no URL here /c/ alone") == "no URL here /c/ alone"
