"""Security: keys, binding, and candidate text as data.

- a container started with a key answers 401 without it (also before any fault or body
  parsing), compares it in constant time, and binds to loopback unless told otherwise;
- no key, bearer token or Authorization header value reaches a log, evidence file, manifest
  or error message, even when every service echoes the header back in its error bodies;
- a candidate prompt is data: hostile proposer output (shell, Python, Hydra/OmegaConf,
  Jinja, printf, rich markup) round-trips byte-exactly into candidates.parquet, into the
  rollout request the container receives and into the policy's messages, and runs nothing.

Already covered elsewhere: 401 on every route of a keyed Banking77 and a key inside a policy
block (test_contract_client.py, test_containers_unit.py); one CLI run with two keys and no
faults (test_evidence.py)."""

from __future__ import annotations

import hmac
import io
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from rich.console import Console

import benchmarks.containers.kit as kit
from algorithms.gepa.optimizer import GepaParams
from algorithms.gepa.reflect import apply
from harness.llm import ChatResult
from benchmarks.containers.banking77 import SEED_SYSTEM
from benchmarks.containers.chaos import Chaos, FaultPlan
from conftest import REPO, container_spec, execute, run_cli
from servers import ScriptedModelThread, ServerThread
from faults import assert_no_secret, check_rows_exactly_once, chaos_spec, small_spec
from harness.candidates import digest_of
from harness.console import print_outcome
from harness.processes import ManagedProcess, free_port
from harness.run import RunOutcome
from harness.scripted_server import ScriptedModelServer
from harness.services import Services
from harness.specs import ModelSpec
from harness.sweep.driver import print_table

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------- the container's key


def test_the_key_is_compared_in_constant_time_before_anything_else(data_dir, monkeypatch) -> None:
    """Every keyed request goes through hmac.compare_digest; a fault-injecting container
    answers 401, not its fault, to a caller without the key."""
    key = f"ck-{uuid.uuid4().hex}"
    monkeypatch.setenv("HARNESS_TEST_CONTAINER_KEY", key)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # the module attribute the kit calls
    chaos = Chaos(str(data_dir), FaultPlan(rate=1.0, kinds=("500",), attempts=0))
    with TestClient(kit.build_app(chaos, api_key_env="HARNESS_TEST_CONTAINER_KEY")) as client:
        assert client.get("/health").status_code == 200  # liveness stays open
        body = {"rollout_id": "r", "task_id": "train:0", "candidate": {"stage2_system": "x"}, "task": {},
                "policy": {"provider": "scripted", "model": "m", "base_url": "http://127.0.0.1:9/v1"}}
        for headers in ({}, {"Authorization": f"Bearer {key[:-1]}"}, {"Authorization": f"Bearer {key}x"},
                        {"Authorization": f"Basic {key}"}, {"Authorization": key}):
            refused = client.post("/rollout", json=body, headers=headers)
            assert refused.status_code == 401 and key not in refused.text
        assert chaos.received == 0  # nothing behind the check ran
        assert client.get("/chaos/stats", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        faulted = client.post("/rollout", json=body, headers={"Authorization": f"Bearer {key}"})
        assert faulted.status_code == 500 and chaos.received == 1  # with the key: the fault
    assert (key.encode(), key.encode()) in compared
    assert all(expected == key.encode() for _, expected in compared)
    assert len(compared) == 4  # the bearer-scheme attempts and the right key, each via compare_digest


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # LISTEN
                found.add(address)
    return found


LOOPBACK = "0100007F"  # 127.0.0.1


def test_services_bind_to_loopback_unless_told_otherwise(data_dir, tmp_path) -> None:
    with Services(tmp_path / "logs") as services, ScriptedModelServer("rules", log_dir=tmp_path) as model:
        url = services.container_url(chaos_spec(data_dir))
        assert listening_addresses(int(url.rsplit(":", 1)[1])) == {LOOPBACK}
        assert listening_addresses(model.port) == {LOOPBACK}
    # a container's own default, and what `--host` changes
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.containers.chaos", "--port", str(port), "--data-dir", str(data_dir)]
    help_text = subprocess.run(command[:3] + ["--help"], cwd=REPO, capture_output=True, text=True).stdout
    assert "bind address (default loopback)" in help_text
    with ManagedProcess("chaos", command, health_url=f"http://127.0.0.1:{port}/health", log_path=tmp_path / "a.log"):
        assert listening_addresses(port) == {LOOPBACK}
    port = free_port()
    told = command[:3] + ["--port", str(port), "--data-dir", str(data_dir), "--host", "0.0.0.0"]
    with ManagedProcess("chaos", told, health_url=f"http://127.0.0.1:{port}/health", log_path=tmp_path / "b.log"):
        assert listening_addresses(port) == {"00000000"}


# ---------------------------------------------------------------- keys never leak, even echoed


class EchoingModel:
    """A hosted-like OpenAI endpoint that wants its bearer key and, like some proxies, puts
    the request's Authorization header into every error body. Requests whose last user
    message contains one of `fail_on` (or every request, with fail_on=None) fail with
    `status` (503: retried by the clients; 400: not retried)."""

    def __init__(self, key: str, answer: str, fail_on: tuple[str, ...] | None = (), status: int = 503):
        self.calls = {"ok": 0, "failed": 0, "refused": 0}
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {key}":
                self.calls["refused"] += 1
                return JSONResponse({"error": {"message": f"bad key in {auth!r}"}}, status_code=401)
            messages = (await request.json())["messages"]
            user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
            if fail_on is None or any(word in user for word in fail_on):
                self.calls["failed"] += 1
                return JSONResponse({"error": {"message": f"overloaded; you sent Authorization: {auth}"}},
                                    status_code=status)
            self.calls["ok"] += 1
            return JSONResponse({"choices": [{"message": {"role": "assistant", "content": answer},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": 1}})


def echoing_proxy(upstream: str, echo_task_ids: set[str]) -> FastAPI:
    """In front of a keyed container: passes everything on with its headers, except the
    rollouts of `echo_task_ids`, answered 500 with the caller's Authorization header."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=upstream, timeout=60.0) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        auth = request.headers.get("authorization", "")
        if path == "rollout" and json.loads(body).get("task_id") in echo_task_ids:
            return JSONResponse({"detail": f"crashed serving a request with Authorization: {auth}"}, status_code=500)
        headers = {"content-type": "application/json", **({"authorization": auth} if auth else {})}
        answer = await request.app.state.client.request(request.method, f"/{path}", content=body, headers=headers)
        return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))

    return app


def test_no_key_in_any_file_or_error_when_services_echo_it(data_dir, tmp_path, monkeypatch) -> None:
    keys = {"HARNESS_TEST_CONTAINER_KEY": f"ck-{uuid.uuid4().hex}", "HARNESS_TEST_POLICY_KEY": f"pk-{uuid.uuid4().hex}",
            "HARNESS_TEST_PROPOSER_KEY": f"xk-{uuid.uuid4().hex}"}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    policy_model = EchoingModel(keys["HARNESS_TEST_POLICY_KEY"], "card_arrival", fail_on=("card",))
    proposer_model = EchoingModel(keys["HARNESS_TEST_PROPOSER_KEY"], "", fail_on=None)
    logs, evidence = tmp_path / "logs", tmp_path / "evidence"
    with ServerThread(policy_model.app) as policy_server, ServerThread(proposer_model.app) as proposer_server, \
            Services(logs) as services:
        policy = ModelSpec(provider="openai_compatible", model="hosted-policy", base_url=f"{policy_server.url}/v1",
                           api_key_env="HARNESS_TEST_POLICY_KEY", max_tokens=16)
        proposer = ModelSpec(provider="openai_compatible", model="hosted-proposer",
                             base_url=f"{proposer_server.url}/v1", api_key_env="HARNESS_TEST_PROPOSER_KEY")
        container = container_spec("banking77", data_dir, api_key_env="HARNESS_TEST_CONTAINER_KEY")
        endpoints = services.endpoints(container, policy, proposer)
        spec = small_spec(container, evidence, budget=30).model_copy(update={"policy": policy, "proposer": proposer})
        with ServerThread(echoing_proxy(endpoints.container_url, {"train:9"})) as proxy:
            outcome = execute(spec, proxy.url, endpoints.policy_url, endpoints.proposer_url)
    # every service really did echo the header, and every one of those errors was kept ...
    assert policy_model.calls["failed"] and proposer_model.calls["failed"] and not policy_model.calls["refused"]
    assert outcome.status == "failed" and outcome.error is not None
    assert "HTTP 503" in outcome.error and "Authorization: Bearer ***" in outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    errors = [r["error"] for r in ev["rollouts"] if r["error"]]
    assert any("HTTP 500" in e and "Bearer ***" in e for e in errors)  # the container proxy's echo
    assert any("HTTP 503" in e and "Bearer ***" in e for e in errors)  # the policy's echo, via the container
    # ... with the key taken out: no file under the evidence or service logs holds any key
    scanned = assert_no_secret([evidence, logs], *keys.values(), texts=(outcome.model_dump_json(),))
    assert scanned >= 6


def test_no_key_anywhere_through_the_cli(data_dir, tmp_path, monkeypatch) -> None:
    """The same echoing services, driven as a user does (`python -m harness`, whatever path
    model calls take by default): no key in stdout, evidence, manifest or any log."""
    keys = {"HARNESS_TEST_CONTAINER_KEY": f"ck-{uuid.uuid4().hex}", "HARNESS_TEST_POLICY_KEY": f"pk-{uuid.uuid4().hex}",
            "HARNESS_TEST_PROPOSER_KEY": f"xk-{uuid.uuid4().hex}"}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    # 400s (not retried) keep this run short whatever retries the default path adds
    policy_model = EchoingModel(keys["HARNESS_TEST_POLICY_KEY"], "card_arrival", fail_on=("card",), status=400)
    proposer_model = EchoingModel(keys["HARNESS_TEST_PROPOSER_KEY"], "", fail_on=None, status=400)
    evidence = tmp_path / "evidence"
    with ServerThread(policy_model.app) as policy_server, ServerThread(proposer_model.app) as proposer_server:
        result = run_cli(
            "models=scripted", f"evidence_root={evidence}", f"data_dir={data_dir}",
            "container.api_key_env=HARNESS_TEST_CONTAINER_KEY",
            "policy.provider=openai_compatible", f"+policy.base_url={policy_server.url}/v1",
            "+policy.api_key_env=HARNESS_TEST_POLICY_KEY",
            "proposer.provider=openai_compatible", f"+proposer.base_url={proposer_server.url}/v1",
            "+proposer.api_key_env=HARNESS_TEST_PROPOSER_KEY", "budget.max_rollouts=20",
            "pools.train.count=8", "pools.pareto.count=4", "pools.heldout.count=4", timeout=240)
    assert policy_model.calls["failed"] and proposer_model.calls["failed"], result.stdout[-2000:]
    assert "Traceback" not in result.stdout
    assert list(evidence.rglob("manifest.json")), result.stdout[-2000:]
    assert_no_secret([evidence], *keys.values(), texts=(result.stdout,))


# ---------------------------------------------------------------- candidate text is data


def hostile_text(canaries: list[Path]) -> str:
    return "\n".join([
        "Classify the customer's message.",
        f"$(touch {canaries[0]}) && $(rm -rf /)",
        f"`touch {canaries[1]}`",
        "{__import__('os').system('touch " + str(canaries[2]) + "')}",
        "${oc.env:HOME} ${env:HOME} $HOME",
        "{{7*7}} {% for x in y %}{{x}}{% endfor %}",
        "%s %d %(name)s {0} {} {name!r}",
        "[bold red]markup[/] [/] [link=file:///etc/passwd]x[/link]",
        "\ttab, unicode é ü 😀 — “quotes” \\n '; DROP TABLE candidates; --",
    ])


def recording_proxy(upstream: str, seen: list[dict[str, Any]]) -> FastAPI:
    """Passes every request to `upstream` and keeps (path, parsed JSON body) of each POST."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=upstream, timeout=60.0) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        if request.method == "POST":
            seen.append({"path": path, "body": json.loads(body.decode("utf-8"))})
        answer = await request.app.state.client.request(request.method, f"/{path}", content=body,
                                                        headers={"content-type": "application/json"})
        return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))

    return app


def test_hostile_proposer_output_round_trips_byte_exactly(data_dir, tmp_path, banking77_url, scripted_policy) -> None:
    canaries = [tmp_path / f"pwned-{i}" for i in range(3)]
    hostile = hostile_text(canaries)
    reply = f"Here is the new instruction:\n```\n{hostile}\n```\n"
    parsed = apply(SEED_SYSTEM, [], [ChatResult(text=reply, prompt_tokens=0, completion_tokens=0, latency_s=0.0)],
                   "rewrite", [], None, GepaParams().edit_settings())
    assert parsed.text == hostile  # the reply parser keeps it whole
    container_seen: list[dict[str, Any]] = []
    policy_seen: list[dict[str, Any]] = []
    spec = small_spec(container_spec("banking77", data_dir), tmp_path / "evidence", budget=20,
                      params={"edit_formats": ["rewrite"], "proposal_attempts": 1, "skip_perfect_minibatch": False},
                      proposer_script="queue")
    with ScriptedModelThread("queue", [reply]) as proposer, \
            ServerThread(recording_proxy(banking77_url, container_seen)) as container, \
            ServerThread(recording_proxy(scripted_policy.base_url.removesuffix("/v1"), policy_seen)) as policy:
        outcome = execute(spec, container.url, f"{policy.url}/v1", proposer.base_url)
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    children = [c for c in ev["candidates"] if c["origin"] != "seed"]
    assert children, "the proposer's reply made no candidate"
    for child in children:
        texts = json.loads(child["modules_json"])
        assert texts["stage2_system"].encode("utf-8") == hostile.encode("utf-8")  # candidates.parquet
        assert child["digest"] == digest_of({"stage2_system": hostile})
    child_ids = {c["candidate_id"] for c in children}
    sent = [s["body"] for s in container_seen if s["path"] == "rollout" and s["body"]["metadata"]["candidate_id"] in child_ids]
    assert sent and all(b["candidate"]["stage2_system"].encode("utf-8") == hostile.encode("utf-8") for b in sent)
    systems = [m["content"] for s in policy_seen for m in s["body"]["messages"] if m["role"] == "system"]
    assert systems.count(hostile) == len(sent)  # the policy got it verbatim, once per child rollout
    assert not any(p.exists() for p in canaries)  # nothing ran
    # and it prints as itself, never as markup or a template
    out = io.StringIO()
    print_outcome(Console(file=out, width=400, color_system=None), RunOutcome.model_validate(
        {**outcome.model_dump(), "best_texts": {"stage2_system": hostile}}), 4)
    printed = out.getvalue()
    for line in hostile.splitlines()[1:]:
        assert f"+{line}".expandtabs(8) in printed  # a terminal shows a tab as spaces


def test_error_text_is_printed_as_text_not_markup(tmp_path) -> None:
    """An error quoting a service body with rich markup is printed, not interpreted (the
    run's result and the sweep's table of runs)."""
    error = "HTTP 500: [/] closing nothing [bold]{{7*7}}[/bold] ${oc.env:HOME}"
    outcome = RunOutcome(run_id="r1", status="failed", evidence_dir=str(tmp_path), error=error)
    out = io.StringIO()
    print_outcome(Console(file=out, width=400, color_system=None), outcome, 4)
    assert f"error: {error}" in out.getvalue()
    row = {"run_id": "r1", "status": "failed", "container": "[red]c", "policy": "p", "proposer": "q",
           "algorithm": "gepa", "seed": 0, "seed_heldout": None, "best_heldout": None, "error": error,
           "evidence_dir": None}
    out = io.StringIO()
    print_table(Console(file=out, width=400, color_system=None), {"r1": row}, str(tmp_path), tmp_path / "logs")
    assert error in out.getvalue() and "[red]c" in out.getvalue()
