"""The task contract through the real client against a misbehaving contract server (a
FastAPI app on loopback): malformed answers, retries, hangs, a process that goes away."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from client_calls import call, request_for
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from servers import ServerThread

from harness.client import ContainerClient
from harness.outcome import judge
from harness.contract import (
    CONTRACT_VERSION,
    PROGRAM_VERSION,
    Usage,
)
from harness.errors import (
    CameBack,
    ContractViolation,
    FailureKind,
    ServiceError,
    Unreachable,
)
from harness.retry import RetryPolicy

# ---------------------------------------------------------------- a misbehaving contract server

Responder = Callable[[Any], Any]


class FakeContainer:
    """Answers each route from a scripted list of responders (the last one repeats) and
    counts the attempts it sees per route."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.plans: dict[str, list[Responder]] = {}
        self.app = FastAPI()

        @self.app.api_route("/{path:path}", methods=["GET", "POST"])
        async def any_route(path: str, request: Request) -> Response:
            route = "/" + path
            attempt = self.hits[route]
            self.hits[route] += 1
            body = await request.json() if request.method == "POST" else None
            plan = self.plans.get(route) or [status(404)]
            result = plan[min(attempt, len(plan) - 1)](body)
            return await result if asyncio.iscoroutine(result) else result


def ok(payload: dict[str, Any]) -> Responder:
    return lambda body: JSONResponse(payload)


def echo(**fields: Any) -> Responder:
    """A rollout answer for the request's own rollout id."""
    return lambda body: JSONResponse({"rollout_id": body["rollout_id"], **fields})


def status(code: int, headers: dict[str, str] | None = None) -> Responder:
    return lambda body: JSONResponse({"detail": f"scripted {code}"}, status_code=code, headers=headers)


def hang(seconds: float) -> Responder:
    async def slow(body: Any) -> Response:
        await asyncio.sleep(seconds)
        return JSONResponse({"status": "ok"})

    return slow


HEALTH = {"status": "ok", "contract_version": CONTRACT_VERSION}
PROGRAM = {"version": PROGRAM_VERSION, "program_id": "fake", "target_modules": ["system"],
           "modules": [{"module_id": "system", "role": "system", "content": "Answer.", "mutable": True}],
           "seed_candidate": {"system": "Answer."}}


@pytest.fixture
def fake() -> Iterator[tuple[FakeContainer, str]]:
    container = FakeContainer()
    with ServerThread(container.app) as server:
        yield container, server.url


def rollout_of(url: str, rollout_id: str = "r-1", **kwargs: Any) -> Any:
    request = request_for(rollout_id, {"system": "Answer."}, {"task_id": "train:0", "x": 1}, "http://127.0.0.1:9/v1")
    return call(url, lambda c: c.rollout(request), **kwargs)


def test_non_json_body_is_a_contract_violation(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/taskset"] = [lambda body: PlainTextResponse("<html>oops</html>")]
    with pytest.raises(ContractViolation, match=r"^/taskset: response is not JSON$") as caught:
        call(url, lambda c: c.taskset())
    assert caught.value.kind is FailureKind.FATAL and server.hits["/taskset"] == 1


@pytest.mark.parametrize("route, payload, field", [
    ("/program", {k: v for k, v in PROGRAM.items() if k != "target_modules"}, "target_modules"),
    ("/taskset", {"taskset_id": "fake"}, "splits"),
    ("/taskset", {"taskset_id": "fake", "splits": {"train": "many"}}, "splits.train"),
    ("/program", {**PROGRAM, "target_modules": [{"candidate_field": "system"}]}, "target_modules.0"),
    ("/rollout", {"rollout_id": "r-1", "usage": {"prompt_tokens": "many"}}, "usage.prompt_tokens"),
])
def test_missing_or_wrong_field_names_route_and_field(fake: tuple[FakeContainer, str], route: str,
                                                      payload: dict[str, Any], field: str) -> None:
    server, url = fake
    server.plans[route] = [ok(payload)]
    method = {"/program": "program", "/taskset": "taskset", "/health": "health"}.get(route)
    with pytest.raises(ContractViolation) as caught:
        if method:
            call(url, lambda c: getattr(c, method)())
        else:
            rollout_of(url)
    assert str(caught.value).startswith(f"{route}: malformed response, field '{field}'")


def test_published_shapes_are_accepted(fake: tuple[FakeContainer, str]) -> None:
    """Object target modules, a foreign /health, no rollout_id echo, null token counts, a null
    usage block."""
    server, url = fake
    server.plans["/health"] = [ok({"status": "healthy", "contract_version": "2026-05-28"})]
    server.plans["/program"] = [ok({**PROGRAM, "target_modules": [
        {"module_id": "system", "candidate_field": "system", "objective": "accuracy"}]})]
    server.plans["/rollout"] = [ok({"status": "completed", "reward_info": {"outcome_reward": 0.5},
                                    "usage": {"prompt_tokens": None, "completion_tokens": None}}),
                                ok({"status": "ok", "reward_info": {"outcome_reward": 1.0}, "usage": None})]
    assert call(url, lambda c: c.health()).healthy
    program = call(url, lambda c: c.program())
    assert program.target_modules == ["system"] and program.target_specs[0].objective == "accuracy"
    assert program.field_of("system") == "system"
    response = rollout_of(url, "r-no-echo")
    assert response.rollout_id == "r-no-echo" and response.status_ok and response.resolved_reward() == 0.5
    assert response.usage.prompt_tokens == 0
    assert rollout_of(url, "r-null-usage").usage == Usage()


@pytest.mark.parametrize("fields, source, text", [
    ({"actionable_side_info": {"feedback": "say the label"}, "reward_info": {"details": {"x": 1}}},
     "actionable_side_info", "say the label"),
    ({"reward_info": {"outcome_reward": 0.0, "details": "wrong unit"}}, "reward_info.details", "wrong unit"),
    ({"summary": {"expected": "42", "predicted": "41"}}, "summary", "Expected: 42\nPredicted: 41"),
    ({"trace": {"feedback": "loop detected"}}, "trace", "loop detected"),
    ({"reward": 1.0}, None, ""),
])
def test_feedback_comes_from_what_the_container_returns(fake: tuple[FakeContainer, str], fields: dict[str, Any],
                                                       source: str | None, text: str) -> None:
    server, url = fake
    server.plans["/rollout"] = [echo(**fields)]
    assert rollout_of(url).feedback_and_source() == (text, source)


def test_error_bodies_keep_their_reason_and_a_401_names_the_key_setting(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/taskset"] = [lambda body: JSONResponse({"detail": "dataset still loading"}, status_code=400)]
    with pytest.raises(ServiceError, match=r"^GET /taskset failed \(fatal\): HTTP 400: dataset still loading$"):
        call(url, lambda c: c.taskset())
    server.plans["/program"] = [status(401)]
    with pytest.raises(ServiceError, match=r"HTTP 401: scripted 401 \(the container wants a bearer key: set "
                                           r"container.api_key_env to the variable holding it\)"):
        call(url, lambda c: c.program())


def test_a_retry_keeps_the_first_answer(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/rollout"] = [lambda body: JSONResponse({"detail": "policy overloaded"}, status_code=503),
                                echo(status="failed", status_detail="stored: policy overloaded")]
    request = request_for("r-2", {"system": "Answer."}, {"task_id": "train:0"}, "http://127.0.0.1:9/v1")
    answers: list[str] = []
    response = call(url, lambda c: c.rollout(request, answers))
    assert answers == ["HTTP 503: policy overloaded"]
    assert not response.status_ok and response.failure_reason() == "stored: policy overloaded"


def test_advertised_routes_take_precedence(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/metadata"] = [ok({"metadata": {"optimizer_contracts": {"gepa": {
        "version": "synth_optimizers.gepa.v2", "program_route": "/api/program", "rollout_route": "api/run",
        "unknown_route": "/x", "version_route": 3}}}})]
    server.plans["/api/program"] = [ok(PROGRAM)]
    server.plans["/api/run"] = [echo(reward=1.0)]
    request = request_for("r-3", {"system": "Answer."}, {"task_id": "train:0"}, "http://127.0.0.1:9/v1")

    async def drive(client: ContainerClient) -> tuple[Any, Any, dict[str, str]]:
        advertised = client.use_routes(await client.metadata())
        return await client.program(), await client.rollout(request), advertised

    program, response, advertised = call(url, drive)
    assert advertised == {"program": "/api/program", "rollout": "/api/run"}
    assert program.program_id == "fake" and response.resolved_reward() == 1.0
    assert server.hits["/program"] == 0 and server.hits["/rollout"] == 0


def test_rollout_answered_for_another_id(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/rollout"] = [ok({"rollout_id": "someone-else", "reward": 1.0})]
    with pytest.raises(ContractViolation, match=r"/rollout: answered rollout_id 'someone-else' for request 'r-mine'"):
        rollout_of(url, "r-mine")


def test_tasks_answer_missing_an_id(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/taskset/tasks"] = [ok({"tasks": [{"task_id": "train:0", "split": "train"}]})]
    with pytest.raises(ContractViolation, match=r"missing \['train:1'\]"):
        call(url, lambda c: c.tasks("train", ["train:0", "train:1"]))


@pytest.mark.parametrize("fields, expected", [
    ({"reward_info": {"outcome_reward": 0.7, "score": 0.1}, "summary": {"outcome_reward": 0.2}, "reward": 0.3}, 0.7),
    ({"reward_info": {"outcome_reward": 0.0, "score": 0.9}, "reward": 0.3}, 0.0),  # 0 is present, not absent
    ({"reward_info": {"score": 0.6}, "summary": {"outcome_reward": 0.2}, "reward": 0.3}, 0.6),
    ({"reward_info": {}, "summary": {"outcome_reward": 0.5}, "reward": 0.3}, 0.5),
    ({"summary": {"note": "no reward here"}, "reward": 0.4}, 0.4),
    ({"status": "ok"}, None),
])
def test_reward_fallbacks_in_order(fake: tuple[FakeContainer, str], fields: dict[str, Any], expected: float | None) -> None:
    server, url = fake
    server.plans["/rollout"] = [echo(**fields)]
    assert rollout_of(url).resolved_reward() == expected


@pytest.mark.parametrize("sent, shown", [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf")])
def test_a_reward_that_is_not_a_finite_number_is_an_error_row(fake: tuple[FakeContainer, str], sent: str,
                                                              shown: str) -> None:
    # Python's json.dumps writes a grader's 0/0 as NaN; counted as a reward, it would make
    # every mean it joins NaN
    server, url = fake
    server.plans["/rollout"] = [lambda body: Response(
        f'{{"rollout_id": "{body["rollout_id"]}", "status": "ok", "reward_info": {{"outcome_reward": {sent}}}}}',
        media_type="application/json")]
    outcome = judge(rollout_of(url))
    assert outcome.reward is None and outcome.error == f"the reward is {shown}, not a finite number"


@pytest.mark.parametrize("sent, kept", [
    ({"a": ["x y z", ""], "b": ["w"]}, {"a": ["x y z"], "b": ["w"]}),
    ({"a": "x y z", "b": [1, None]}, None),  # no list of strings anywhere: nothing
    (["a", "x"], None),
    (None, None),
])
def test_answer_examples_are_optional_and_a_malformed_value_is_ignored(fake: tuple[FakeContainer, str],
                                                                       sent: Any, kept: Any) -> None:
    server, url = fake
    server.plans["/rollout"] = [echo(status="ok", reward_info={"outcome_reward": 0.0},
                                     actionable_side_info={"feedback": "no", "answer_examples": sent})]
    response = rollout_of(url)
    assert response.resolved_reward() == 0.0 and response.answer_examples == kept


def test_unknown_extra_fields_are_accepted(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/health"] = [ok({**HEALTH, "uptime_s": 12, "build": {"sha": "abc"}})]
    server.plans["/program"] = [ok({**PROGRAM, "vendor": "x", "modules": [{**PROGRAM["modules"][0], "tags": ["a"]}]})]
    server.plans["/rollout"] = [echo(
        status="ok", reward_info={"outcome_reward": 1.0, "rubric": {"a": 1}}, usage={"prompt_tokens": 3,
        "completion_tokens": 2, "reasoning_tokens": 9}, actionable_side_info={"feedback": "fine", "hints": []},
        trace={"output": "yes", "spans": []}, vendor_field=[1, 2, 3])]
    assert call(url, lambda c: c.health()).model_extra == {"uptime_s": 12, "build": {"sha": "abc"}}
    assert call(url, lambda c: c.program()).modules[0].model_extra == {"tags": ["a"]}
    response = rollout_of(url)
    assert response.resolved_reward() == 1.0 and response.feedback == "fine" and response.output_text == "yes"
    assert response.usage.prompt_tokens == 3 and response.model_extra == {"vendor_field": [1, 2, 3]}


@pytest.mark.parametrize("failures", [
    [status(500), status(503)],
    [status(429, {"Retry-After": "0"})],
    [status(429), status(502), status(408)],
])
def test_retries_transient_and_rate_limited_then_succeeds(fake: tuple[FakeContainer, str], failures: list) -> None:
    server, url = fake
    server.plans["/metadata"] = failures + [ok({"metadata": {"optimizer_contracts": {"gepa": {"version": "v"}}}})]
    server.plans["/rollout"] = failures + [echo(reward=1.0)]
    assert call(url, lambda c: c.metadata()).gepa_contract == "v"
    assert rollout_of(url).resolved_reward() == 1.0
    assert server.hits["/metadata"] == server.hits["/rollout"] == len(failures) + 1


@pytest.mark.parametrize("code, kind", [(500, FailureKind.TRANSIENT), (429, FailureKind.RATE_LIMITED)])
def test_gives_up_after_the_retry_budget(fake: tuple[FakeContainer, str], code: int, kind: FailureKind) -> None:
    server, url = fake
    server.plans["/taskset"] = [status(code)]
    with pytest.raises(ServiceError) as caught:
        call(url, lambda c: c.taskset(), retry=RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.01))
    assert caught.value.kind is kind and f"GET /taskset failed ({kind.value})" in str(caught.value)
    assert server.hits["/taskset"] == 3


@pytest.mark.parametrize("code", [400, 401, 403, 404, 422])
def test_fatal_status_is_not_retried(fake: tuple[FakeContainer, str], code: int) -> None:
    server, url = fake
    server.plans["/program"] = [status(code), ok(PROGRAM)]
    with pytest.raises(ServiceError) as caught:
        call(url, lambda c: c.program())
    assert caught.value.kind is FailureKind.FATAL and f"HTTP {code}" in str(caught.value)
    assert server.hits["/program"] == 1


def test_a_hang_past_the_timeout_is_transient(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/health"] = [hang(6.0)]
    started = time.monotonic()
    with pytest.raises(ServiceError) as caught:
        call(url, lambda c: c.health(), timeout_s=1.0, retry=RetryPolicy(attempts=2, base_delay_s=0.01))
    assert time.monotonic() - started < 5.0  # two timeouts, not a hang's end
    assert caught.value.kind is FailureKind.TRANSIENT
    assert "GET /health failed (transient)" in str(caught.value) and "Timeout" in str(caught.value)
    # counted as the server's thread takes each request, which may trail the client's timeout
    deadline = time.monotonic() + 10
    while server.hits["/health"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.hits["/health"] == 2


def test_a_hang_then_an_answer_recovers(fake: tuple[FakeContainer, str]) -> None:
    server, url = fake
    server.plans["/health"] = [hang(6.0), ok(HEALTH)]
    # a timeout that the healthy answer beats even on a loaded machine
    assert call(url, lambda c: c.health(), timeout_s=1.5).status == "ok"
    assert server.hits["/health"] == 2


class RawServer:
    """A loopback TCP server that treats each connection by the next entry of its plan:
    `drop` closes it after reading the request (a process that exits mid-request), `hang`
    never answers, `500` answers HTTP 500, `ok` a rollout with reward 1. Lets a test order
    what no HTTP framework fakes."""

    def __init__(self, plan: list[str]) -> None:
        self.plan = list(plan)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _serve(self) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            action = self.plan.pop(0) if self.plan else "500"
            if action == "hang":
                await asyncio.sleep(30)
            elif action == "500":
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom")
                await writer.drain()
            elif action == "ok":
                body = b'{"status": "ok", "reward_info": {"outcome_reward": 1.0}}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
            writer.close()

        async def main() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self.ready.set()
            async with server:
                await server.serve_forever()

        self.loop.run_until_complete(main())


@pytest.mark.parametrize(("plan", "error"), [
    (["drop", "hang"], Unreachable),  # gone mid-request, then a process that does not answer yet
    (["drop", "drop"], Unreachable),
    (["hang", "hang"], ServiceError),  # alive but slow: a plain transient failure
    (["drop", "500"], CameBack),      # answering again, with an error worth retrying
    (["500", "500"], ServiceError),   # never gone: the attempts were fair ones
])
def test_a_process_seen_gone_is_reported_unreachable(plan: list[str], error: type[ServiceError]) -> None:
    server = RawServer(plan)
    with pytest.raises(ServiceError) as caught:
        call(f"http://127.0.0.1:{server.port}", lambda c: c.health(), timeout_s=0.3,
             retry=RetryPolicy(attempts=2, base_delay_s=0.01, max_delay_s=0.01))
    assert type(caught.value) is error, str(caught.value)
    assert caught.value.kind is FailureKind.TRANSIENT


def test_a_rollout_whose_attempts_met_a_gone_process_is_sent_once_more_to_the_new_one() -> None:
    """Attempts spent on a process that died, the last one answered by the process that
    replaced it with a 500: the keeper sends the rollout once more (no restart asked: another
    run made it), and the new process's answer is the rollout's."""
    from harness.container_keeper import ContainerKeeper

    server = RawServer(["drop", "500", "ok"])
    events: list[str] = []

    answers: list[str] = []

    async def send() -> Any:
        client = ContainerClient(f"http://127.0.0.1:{server.port}", timeout_s=2,
                                 retry=RetryPolicy(attempts=2, base_delay_s=0.01, max_delay_s=0.01))
        keeper = ContainerKeeper(client, "raw", None, lambda kind, message, **data: events.append(kind))
        request = request_for("r-1", {"system": "Answer."}, {"task_id": "train:0", "x": 1}, "http://127.0.0.1:9/v1")
        try:
            return await keeper.send(request, answers)
        finally:
            await client.aclose()

    response = asyncio.run(send())
    assert answers == ["HTTP 500: boom"]
    assert response.status == "ok" and response.reward_info.outcome_reward == 1.0
    assert events == [] and server.plan == []
