"""Trust boundaries, played by a hostile container and a hostile local process against a
live gateway and a live run (scripted models, real HTTP on loopback):

- without the driver's admin token no process can register, read, announce, close or drop
  a run, nor call a model through `/u/`; a taken run id is refused (409), never reset;
- a rollout's URL spends only in its own scope, as a policy-side role, while it is open;
- bodies over the limit get a 413 (gateway and kit, declared or chunked); max_tokens is validated and capped;
  a huge request the upstream fails is refunded to the token bucket;
- a container started by the harness sees no provider or cloud key it was not given;
- a sweep worker ends when its driver is killed with SIGKILL.

Evidence integrity, reruns and input edges: test_security_evidence.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response

import benchmarks.containers.kit as kit
from benchmarks.containers.chaos import Chaos, FaultPlan
from conftest import REPO, container_spec, make_run_spec
from servers import GatewayThread, ScriptedModelThread, ServerThread
from gateway_fakes import FakeUpstream, chat_body
from harness.gateway.models import GatewaySettings, LimitSettings, Upstream
from harness.run import run_sync
from harness.services import Endpoints, Services, container_env

pytestmark = pytest.mark.timeout(300)


def fake_upstream(url: str) -> Upstream:
    return Upstream(name="fake", base_url=f"{url}/v1", provider="openai_compatible")


def hostile_probes(gateway: str, run: str, upstream: str) -> dict[str, int]:
    """Every control route and the unattributed route, as a process without the admin token."""
    registration = {"upstreams": {"policy": upstream, "proposer": upstream}}
    announce = {"scopes": {"x": "c"}, "candidates": {}, "budgeted": False}
    probes = {
        "register own run": ("POST", "/runs/evil", registration),
        "re-register the live run": ("POST", f"/runs/{run}", registration),
        "announce unbudgeted scopes": ("POST", f"/runs/{run}/scopes", announce),
        "close its scopes": ("POST", f"/runs/{run}/scopes/close", {"scopes": ["x"]}),
        "read spend": ("GET", f"/runs/{run}/spend", None),
        "read calls": ("GET", f"/runs/{run}/calls", None),
        "drop the run": ("DELETE", f"/runs/{run}", None),
        "read usage": ("GET", "/usage", None),
        "call /u/": ("POST", f"/u/{upstream}/v1/chat/completions", chat_body("free ride")),
        "call /r/ without a token": ("POST", f"/r/{run}/x/policy/v1/chat/completions", chat_body("x")),
        "call with a guessed token": ("POST", f"/c/{'A' * 43}/r/{run}/x/policy/v1/chat/completions", chat_body("x")),
    }
    statuses = {}
    with httpx.Client(base_url=gateway, timeout=30.0) as http:
        for name, (method, path, body) in probes.items():
            # a token of the wrong kind (a rollout's, say) in the header is no admin token either
            statuses[name] = http.request(method, path, json=body, headers={"authorization": "Bearer junk"}).status_code
    return statuses


def test_control_routes_and_u_need_the_admin_token_and_a_taken_run_id_is_refused() -> None:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(), [fake_upstream(up.url)]) as gw:
        admin = gw.admin_headers
        body = {"upstreams": {"policy": "fake", "proposer": "fake"}, "budget_usd": 0.0005}
        grant = httpx.post(f"{gw.url}/runs/live", json=body, headers=admin).json()
        run_url = f"{gw.url}/c/{grant['token']}/r/live"
        for i in range(3):
            assert httpx.post(f"{run_url}/s{i}/policy/v1/chat/completions", json=chat_body("x")).status_code == 200
        statuses = hostile_probes(gw.url, "live", "fake")
        again = httpx.post(f"{gw.url}/runs/live", json={**body, "budget_usd": 100.0}, headers=admin)
        spend = httpx.get(f"{gw.url}/runs/live/spend", headers=admin).json()
        calls = httpx.get(f"{gw.url}/runs/live/calls", headers=admin).json()
    assert set(statuses.values()) <= {401, 403}, statuses
    assert all(v == 401 for k, v in statuses.items() if not k.startswith("call /r/") and "guessed" not in k)
    assert again.status_code == 409 and "already registered" in again.text
    assert len(calls) == 3 and spend["budget_usd"] == 0.0005  # neither wiped nor re-budgeted
    assert fake.completions == 3  # nothing the hostile process sent reached the model


def test_a_rollout_token_spends_only_in_its_open_scope_as_a_policy_side_role() -> None:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(), [fake_upstream(up.url)]) as gw:
        admin = gw.admin_headers
        run_token = httpx.post(f"{gw.url}/runs/r1", json={"upstreams": {"policy": "fake", "proposer": "fake"}},
                               headers=admin).json()["token"]
        grants = httpx.post(f"{gw.url}/runs/r1/scopes", headers=admin, json={
            "scopes": {"a": "c0", "b": "c0"}, "candidates": {"c0": {"system": "Be brief."}}}).json()["tokens"]
        a, b = grants["a"], grants["b"]
        assert len({a, b, run_token}) == 3 and min(len(a), len(b), len(run_token)) >= 43  # 256-bit, distinct

        def call(token: str, scope: str, role: str) -> int:
            return httpx.post(f"{gw.url}/c/{token}/r/r1/{scope}/{role}/v1/chat/completions",
                              json=chat_body("hi")).status_code

        while_open = {"own policy": call(a, "a", "policy"), "own grader": call(a, "a", "grader"),
                      "own simulator": call(a, "a", "user_simulator"), "other scope": call(a, "b", "policy"),
                      "new scope": call(a, "zzz", "policy"), "as proposer": call(a, "a", "proposer"),
                      "other run": httpx.post(f"{gw.url}/c/{a}/r/r2/a/policy/v1/chat/completions",
                                              json=chat_body("hi")).status_code}
        httpx.post(f"{gw.url}/runs/r1/scopes/close", json={"scopes": ["a"]}, headers=admin)
        after_close = {"own policy": call(a, "a", "policy"), "b still open": call(b, "b", "policy"),
                       "run token": call(run_token, "proposer-0000", "proposer")}
        recorded = httpx.get(f"{gw.url}/runs/r1/calls", headers=admin).json()
    assert while_open == {"own policy": 200, "own grader": 200, "own simulator": 200, "other scope": 403,
                          "new scope": 403, "as proposer": 403, "other run": 403}
    assert after_close == {"own policy": 403, "b still open": 200, "run token": 200}
    assert len(recorded) == 5 and fake.completions == 5  # refused calls never reached the model


def test_request_bodies_are_bounded_and_max_tokens_validated_and_capped() -> None:
    fake = FakeUpstream()
    limits = LimitSettings(max_output_tokens=512)
    settings = GatewaySettings(max_body_bytes=64 * 1024, limits=limits)
    with ServerThread(fake.app()) as up, GatewayThread(settings, [fake_upstream(up.url)]) as gw:
        token = httpx.post(f"{gw.url}/runs/r", json={"upstreams": {"policy": "fake", "proposer": "fake"}},
                           headers=gw.admin_headers).json()["token"]
        url = f"{gw.url}/c/{token}/r/r/s/policy/v1/chat/completions"
        big = httpx.post(url, json=chat_body("x" * 100_000))

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(100):
                yield b"y" * 1024
            yield b'"}]}'

        chunked = httpx.post(url, content=chunks(), headers={"content-type": "application/json"})
        bad = {value: httpx.post(url, content=json.dumps({**chat_body("x"), "max_tokens": value}))
               for value in (-1, 0, 1e12, "10", True)}
        capped = httpx.post(url, json={**chat_body("x"), "max_tokens": 10**12})
        fine = httpx.post(url, json=chat_body("x", max_tokens=16))
    assert big.status_code == 413 and chunked.status_code == 413
    assert big.json()["error"]["type"] == "body_too_large"
    assert {v: r.status_code for v, r in bad.items()} == {-1: 400, 0: 400, 1e12: 400, "10": 400, True: 400}
    assert "max_tokens must be a positive integer" in bad[-1].json()["error"]["message"]
    assert capped.status_code == 200 and fine.status_code == 200
    assert [b["max_tokens"] for b in fake.bodies] == [512, 16]  # capped to the model's limit, then as asked


def test_a_kit_container_refuses_a_body_over_its_limit(data_dir, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_MAX_BODY_BYTES", str(256 * 1024))
    with ServerThread(kit.build_app(Chaos(str(data_dir), FaultPlan(rate=0.0)))) as container:
        big = httpx.post(f"{container.url}/rollout", content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
                         headers={"content-type": "application/json"}, timeout=60.0)

        def chunks():  # no Content-Length
            for _ in range(64):
                yield b" " * 16384

        chunked = httpx.post(f"{container.url}/rollout", content=chunks(), timeout=60.0)
        small = httpx.post(f"{container.url}/rollout", json={"not": "a rollout"})
        alive = httpx.get(f"{container.url}/health").status_code
    assert big.status_code == 413 and chunked.status_code == 413
    assert small.status_code == 422 and alive == 200  # under the limit: parsed and refused as usual


def test_a_huge_request_the_upstream_fails_is_refunded_and_stalls_nobody() -> None:
    fake = FakeUpstream(throttle_first=1, throttle_status=500)  # the first answer is an HTTP 500
    settings = GatewaySettings(limits=LimitSettings(tokens_per_min=6000, context_tokens=8192))
    with ServerThread(fake.app()) as up, GatewayThread(settings, [fake_upstream(up.url)]) as gw:
        headers = gw.admin_headers
        failed = httpx.post(f"{gw.url}/u/fake/v1/chat/completions", headers=headers,
                            json={**chat_body("x"), "max_tokens": 10**15})
        bucket = gw.gateway.limiter.get("fake", "gpt-4.1-mini").tokens
        level_after_failure, capacity = bucket.level, bucket.capacity
        after = httpx.post(f"{gw.url}/u/fake/v1/chat/completions", headers=headers, json=chat_body("x"), timeout=30)
    assert failed.status_code == 500 and after.status_code == 200
    # charged at most the model's context (not 1e15), and all of it given back: no debt
    assert level_after_failure == pytest.approx(capacity, abs=1.0)


# ------------------------------------------------------------------ a hostile container


def hostile_container(upstream_container: str, found: dict[str, Any]) -> FastAPI:
    """A container that serves banking77 (through it) and, on every rollout, tries to spend
    and read beyond the URL it was given."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=upstream_container, timeout=60.0) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        if path == "rollout":
            url = json.loads(body)["policy"]["inference_url"]
            gateway, _, rest = url.partition("/c/")
            token, _, rest = rest.partition("/r/")
            run, scope = rest.split("/")[:2]
            async with httpx.AsyncClient(timeout=30.0) as http:
                async def status(target: str) -> int:
                    return (await http.post(f"{target}/chat/completions", json=chat_body("steal"))).status_code

                attempts = found.setdefault("attempts", [])
                attempts.append(await status(f"{gateway}/c/{token}/r/{run}/{scope}-other/policy/v1"))
                attempts.append(await status(f"{gateway}/c/{token}/r/{run}/{scope}/proposer/v1"))
                if "stale" in found:  # the first rollout's URL: refused once its batch is over
                    found.setdefault("stale_attempts", []).append(await status(found["stale"]))
            found.setdefault("stale", url)
            found.setdefault("controls", {}).update(
                {k: v for k, v in hostile_probes(gateway, run, "scripted-rules").items()})
        answer = await request.app.state.client.request(request.method, f"/{path}", content=body,
                                                        headers={"content-type": "application/json"})
        return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))

    return app


def test_a_hostile_container_cannot_spend_read_or_erase_beyond_its_rollout(tmp_path, data_dir, banking77_url) -> None:
    found: dict[str, Any] = {}
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=[f"train:{i}" for i in range(6)],
                         pareto=[f"train:{i}" for i in range(6, 9)], heldout=["test:0", "test:1"],
                         params={"minibatch_size": 3}, max_rollouts=24)
    with ScriptedModelThread("rules") as model, GatewayThread(
            GatewaySettings(), [Upstream(name="scripted-rules", base_url=model.base_url, provider="scripted")]) as gw, \
            ServerThread(hostile_container(banking77_url, found)) as evil:
        endpoints = Endpoints(container_url=evil.url, policy_url=f"{gw.url}/u/scripted-rules/v1",
                              proposer_url=f"{gw.url}/u/scripted-rules/v1", gateway_url=gw.url,
                              policy_upstream="scripted-rules", proposer_upstream="scripted-rules",
                              gateway_token=gw.admin_token)
        outcome = run_sync(spec, endpoints)
        runs_left = len(gw.gateway.ledger.runs)
    assert outcome.status == "done", outcome.error
    assert set(found["controls"].values()) <= {401, 403}, found["controls"]
    assert found["attempts"] and set(found["attempts"]) == {403}
    assert 403 in found["stale_attempts"]
    manifest = json.loads((Path(outcome.evidence_dir) / "manifest.json").read_text())
    # the run's records were not wiped; beyond the run's own calls only the stale URL's while
    # its rollout was still open (recorded and attributed to that rollout)
    assert manifest["totals"]["model_calls"] == outcome.rollouts + outcome.heldout_rollouts + \
        manifest["totals"]["proposer_calls"] + found["stale_attempts"].count(200)
    assert runs_left == 0  # the hostile DELETE and register did nothing; the driver dropped its run
    assert gw.admin_token not in json.dumps(manifest) and gw.admin_token not in "".join(
        p.read_text(errors="replace") for p in Path(outcome.evidence_dir).rglob("*") if p.is_file())


# ------------------------------------------------------------ least privilege, driver death


def test_a_started_container_sees_no_key_it_was_not_given(tmp_path, data_dir, monkeypatch) -> None:
    secrets_env = {"OPENAI_API_KEY": "sk-x", "ANTHROPIC_API_KEY": "a", "AWS_SECRET_ACCESS_KEY": "b",
                   "GOOGLE_APPLICATION_CREDENTIALS": "/c", "MY_VENDOR_TOKEN": "d", "HARNESS_GATEWAY_ADMIN_TOKEN": "e",
                   "HTTPS_PROXY": "http://user:pw@proxy:3128"}
    for name, value in {**secrets_env, "HARNESS_TEST_GRADER_KEY": "named"}.items():
        monkeypatch.setenv(name, value)
    spec = container_spec("banking77", data_dir).model_copy(update={"env": ["HARNESS_TEST_GRADER_KEY"]})
    assert not set(secrets_env) & set(container_env(spec))
    with Services(tmp_path / "logs") as services:
        url = services.container_url(spec)
        process = next(p for p, u in services._containers.values() if u == url)
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{process.pid}/environ").read_bytes().decode().split("\0") if "=" in item)
        assert httpx.get(f"{url}/health").status_code == 200
    assert not set(secrets_env) & set(environ), sorted(set(secrets_env) & set(environ))
    assert environ["HARNESS_TEST_GRADER_KEY"] == "named" and "PATH" in environ  # named in its config: given


def test_a_worker_ends_when_its_driver_is_killed() -> None:
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watcher = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from harness.sweep.worker import watch_driver; "
                               f"watch_driver({socket.gethostname()!r}, {driver.pid}, every_s=0.1); time.sleep(600)"],
        cwd=REPO)
    try:
        time.sleep(1.0)
        assert watcher.poll() is None  # the driver lives: the worker goes on
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert watcher.wait(timeout=60) == 1
    finally:
        for process in (driver, watcher):
            if process.poll() is None:
                process.kill()
                process.wait()
