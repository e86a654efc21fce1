"""The inference gateway against a fake OpenAI-compatible upstream (real HTTP on loopback):
attribution, cost, key handling, cache and replay, 429/503 with Retry-After, concurrency
caps under 200 concurrent requests, the USD budget and the prompt check."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from servers import GatewayThread, ServerThread
from gateway_fakes import FakeUpstream, chat_body
from harness.retry import retry_after_s
from harness.gateway.models import GatewaySettings, LimitSettings, RunSpend, Upstream
from harness.gateway.service import upstream_name
from harness.contract import role_url
from harness.gateway.store import ResponseStore, request_digest, sample_digest
from harness.specs import ModelSpec

KEY_ENV = "HARNESS_TEST_GATEWAY_KEY"


def upstream(url: str, *, key_env: str | None = None, provider: str = "openai_compatible") -> Upstream:
    return Upstream(name="fake", base_url=f"{url}/v1", provider=provider, api_key_env=key_env)


_RUN_TOKENS: dict[tuple[str, str], str] = {}


def admin(gw: GatewayThread) -> dict[str, str]:
    return gw.admin_headers


def register_run(gw: GatewayThread, run_id: str, budget: float | None = None, **roles: str) -> None:
    body = {"upstreams": {"policy": "fake", "proposer": "fake", **roles}, "budget_usd": budget}
    answer = httpx.post(f"{gw.url}/runs/{run_id}", json=body, headers=admin(gw))
    assert answer.status_code == 200, answer.text
    _RUN_TOKENS[(gw.url, run_id)] = answer.json()["token"]


def run_url(gw: GatewayThread, run_id: str) -> str:
    """The run's capability URL prefix (the run's token: any scope, any role)."""
    return f"{gw.url}/c/{_RUN_TOKENS[(gw.url, run_id)]}/r/{run_id}"


def post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=30.0)


def spend(gw: GatewayThread, run_id: str) -> RunSpend:
    return RunSpend.model_validate_json(httpx.get(f"{gw.url}/runs/{run_id}/spend", headers=admin(gw)).content)


def calls(gw: GatewayThread, run_id: str) -> list[dict[str, Any]]:
    return httpx.get(f"{gw.url}/runs/{run_id}/calls", headers=admin(gw)).json()


def test_attribution_cost_and_the_key_stay_in_the_gateway(monkeypatch) -> None:
    key = "sk-test-" + "7" * 24
    monkeypatch.setenv(KEY_ENV, key)
    fake = FakeUpstream(key=key, echo_auth=True)
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(), [upstream(up.url, key_env=KEY_ENV)]) as gw:
        register_run(gw, "run1")
        base = run_url(gw, "run1")
        # the caller sends no key (or a wrong one, which is dropped): the gateway adds its own
        answer = post(f"{base}/run1-c0000-train:0/policy/v1", chat_body("hello"), authorization="Bearer junk")
        assert answer.status_code == 200, answer.text
        assert key not in answer.text and "[redacted]" in answer.text  # the upstream echoed it; the caller never sees it
        assert answer.headers["x-gateway-call-id"] == "run1-c0000-train:0#0"
        assert post(f"{base}/proposer-0000/proposer/v1", chat_body("improve", max_tokens=40)).status_code == 200
        assert post(f"{base}/run1-c0000-train:0/grader/v1", chat_body("grade it")).status_code == 200
        unknown = post(f"{base}/run1-c0000-train:1/policy/v1", chat_body("hi", model="mystery-model-9"))
        assert unknown.status_code == 200
        routed = post(f"{base}/run1-c0000-train:2/policy/v1", chat_body("hi", model="openai/gpt-4.1-mini"))
        assert routed.status_code == 200
        assert fake.refused == 0 and fake.completions == 5
        rows = {r["call_id"]: r for r in calls(gw, "run1")}
    policy = rows["run1-c0000-train:0#0"]
    assert (policy["role"], policy["scope"], policy["upstream"], policy["model"]) == (
        "policy", "run1-c0000-train:0", "fake", "gpt-4.1-mini")
    assert policy["prompt_tokens"] > 0 and policy["completion_tokens"] > 0 and policy["latency_s"] > 0
    # gpt-4.1-mini: $0.40 / $1.60 per million input / output tokens (harness/pricing.py)
    expected = (policy["prompt_tokens"] * 0.40 + policy["completion_tokens"] * 1.60) / 1e6
    assert policy["cost_usd"] == pytest.approx(expected)
    assert rows["proposer-0000#0"]["role"] == "proposer" and rows["proposer-0000#0"]["prompt_check"] is None
    assert rows["run1-c0000-train:0#1"]["role"] == "grader"  # same rollout, second call
    assert rows["run1-c0000-train:1#0"]["cost_usd"] is None  # unknown model: unknown cost, not zero
    assert rows["run1-c0000-train:2#0"]["cost_usd"] > 0  # a router's vendor/model name is priced as the model
    assert all(key not in str(r) for r in rows.values())


def test_cache_read_write_hits_and_samples(tmp_path) -> None:
    fake = FakeUpstream()
    settings = GatewaySettings(cache="read_write", cache_path=str(tmp_path / "store.sqlite"))
    with ServerThread(fake.app()) as up, GatewayThread(settings, [upstream(up.url)]) as gw:
        register_run(gw, "r")
        first = post(f"{run_url(gw, 'r')}/a/policy/v1", chat_body("same question"))
        again = post(f"{run_url(gw, 'r')}/b/policy/v1", chat_body("same question"))  # another rollout: the same sample
        second_sample = post(f"{run_url(gw, 'r')}/a/policy/v1", chat_body("same question"))  # asked twice in one rollout
        volatile = post(f"{run_url(gw, 'r')}/c/policy/v1", {**chat_body("same question"), "user": "someone"})
        assert [r.headers["x-gateway-cache"] for r in (first, again, second_sample, volatile)] == [
            "miss", "hit", "miss", "hit"]
        assert again.content == first.content and fake.completions == 2
        models = httpx.get(f"{gw.url}/u/fake/v1/models", headers=admin(gw))
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "fake"
        assert spend(gw, "r").cache == {"miss": 2, "hit": 2}


def test_replay_serves_the_store_and_a_miss_names_its_digest(tmp_path) -> None:
    fake = FakeUpstream()
    path = str(tmp_path / "store.sqlite")
    with ServerThread(fake.app()) as up:
        with GatewayThread(GatewaySettings(cache="read_write", cache_path=path), [upstream(up.url)]) as gw:
            register_run(gw, "r")
            recorded = post(f"{run_url(gw, 'r')}/a/policy/v1", chat_body("recorded"))
        live = fake.requests
        with GatewayThread(GatewaySettings(cache="replay", cache_path=path), [upstream(up.url)]) as gw:
            register_run(gw, "r")
            replayed = post(f"{run_url(gw, 'r')}/a/policy/v1", chat_body("recorded"))
            missing = post(f"{run_url(gw, 'r')}/a/policy/v1", chat_body("never asked"))
            rows = calls(gw, "r")
        assert fake.requests == live  # no live call at all
    assert replayed.status_code == 200 and replayed.content == recorded.content
    assert replayed.headers["x-gateway-cache"] == "replay"
    digest = sample_digest(request_digest("fake", "chat/completions", "gpt-4.1-mini", chat_body("never asked")), 0)
    assert missing.status_code == 404 and digest in missing.json()["error"]["message"]
    assert [r["status"] for r in rows] == ["ok", "replay_miss"] and rows[1]["digest"] == digest


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_honours_retry_after_and_lowers_the_cap(status) -> None:
    fake = FakeUpstream(throttle_first=2, throttle_status=status, retry_after="1")
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(), [upstream(up.url)]) as gw:
        started = time.monotonic()
        answer = post(f"{gw.url}/u/fake/v1", chat_body("hello"), **admin(gw))
        waited = time.monotonic() - started
        limit = httpx.get(f"{gw.url}/limits").json()["fake/gpt-4.1-mini"]
    assert answer.status_code == 200 and fake.requests == 3
    assert waited >= 1.0  # Retry-After honoured (the second 429 came within the cut interval: one cut)
    assert limit["cuts"] >= 1 and limit["limit"] < limit["max"]


def test_a_retry_after_of_hours_fails_the_call_instead_of_pausing() -> None:
    fake = FakeUpstream(throttle_first=5, retry_after="7200")
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(), [upstream(up.url)]) as gw:
        started = time.monotonic()
        answer = post(f"{gw.url}/u/fake/v1", chat_body("hello"), **admin(gw))
        waited = time.monotonic() - started
        limit = httpx.get(f"{gw.url}/limits").json()["fake/gpt-4.1-mini"]
    assert answer.status_code == 429 and answer.headers["retry-after"] == "7200" and fake.requests == 1
    assert waited < 5 and limit["paused_s"] == 0  # nobody else on that model is held for two hours


def test_retry_after_as_http_date() -> None:
    now = time.time()
    assert retry_after_s(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now + 30)), now) == \
        pytest.approx(30, abs=1)
    assert retry_after_s("2.5") == 2.5 and retry_after_s("soon") is None


async def _burst(url: str, n: int, headers: dict[str, str]) -> list[int]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        answers = await asyncio.gather(*(client.post(f"{url}/chat/completions", json=chat_body(f"q{i}"), headers=headers)
                                         for i in range(n)))
    return [a.status_code for a in answers]


def test_concurrency_cap_holds_under_200_concurrent_requests() -> None:
    fake = FakeUpstream(delay_s=0.05, hold_until_peak=8)
    settings = GatewaySettings(limits=LimitSettings(max_concurrency=8))
    with ServerThread(fake.app()) as up, GatewayThread(settings, [upstream(up.url)]) as gw:
        statuses = asyncio.run(_burst(f"{gw.url}/u/fake/v1", 200, admin(gw)))
    assert statuses == [200] * 200
    assert fake.peak == 8  # reached, never passed


def test_cap_adapts_down_to_what_the_upstream_allows_and_back_up() -> None:
    # calls last long enough that more than 4 are in flight at once whatever the machine's load
    fake = FakeUpstream(delay_s=0.1, throttle_above=4, retry_after="0")
    settings = GatewaySettings(limits=LimitSettings(max_concurrency=32), max_attempts=20, max_backoff_s=0.2)
    with ServerThread(fake.app()) as up, GatewayThread(settings, [upstream(up.url)]) as gw:
        statuses = asyncio.run(_burst(f"{gw.url}/u/fake/v1", 200, admin(gw)))
        after_burst = httpx.get(f"{gw.url}/limits").json()["fake/gpt-4.1-mini"]
        fake.throttle_above = None
        asyncio.run(_burst(f"{gw.url}/u/fake/v1", 100, admin(gw)))
        recovered = httpx.get(f"{gw.url}/limits").json()["fake/gpt-4.1-mini"]
    assert statuses == [200] * 200
    assert after_burst["cuts"] >= 2 and after_burst["low"] <= 8  # halved towards what the upstream takes
    assert fake.throttled < 100, fake.throttled  # a fixed cap of 32 would draw a 429 for most of the 200
    assert recovered["limit"] > after_burst["limit"]  # and raised again while calls succeed


def test_budget_refuses_the_call_that_would_cross_it() -> None:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(), [upstream(up.url)]) as gw:
        register_run(gw, "b", budget=0.0005)
        statuses = [post(f"{run_url(gw, 'b')}/s{i}/policy/v1", chat_body("x " * 200, max_tokens=50)).status_code
                    for i in range(12)]
        refused = post(f"{run_url(gw, 'b')}/s99/policy/v1", chat_body("x " * 200, max_tokens=50))
        state = spend(gw, "b")
    assert 0 < statuses.index(402) < 12 and set(statuses[statuses.index(402):]) == {402}
    assert "budget" in refused.json()["error"]["message"] and refused.json()["error"]["type"] == "budget_exhausted"
    assert 0 < state.cost_usd <= 0.0005  # stopped before crossing, not after
    assert fake.completions == statuses.index(402)
    assert "s99" in state.refused_scopes


def test_prompt_check_per_policy_call() -> None:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(), [upstream(up.url)]) as gw:
        register_run(gw, "p")
        text = "You classify intents.\n- If the message mentions \"card\", answer: card_arrival"
        httpx.post(f"{gw.url}/runs/p/scopes", json={
            "scopes": {"ok": "c1", "lost": "c1"}, "candidates": {"c1": {"system": text}}, "budgeted": True},
            headers=admin(gw))
        # re-wrapped whitespace still counts as the text reaching the model
        post(f"{run_url(gw, 'p')}/ok/policy/v1", chat_body("where is my card", system=text.replace("\n", "\n\n  ")))
        post(f"{run_url(gw, 'p')}/lost/policy/v1", chat_body("where is my card", system="A container's own prompt."))
        post(f"{run_url(gw, 'p')}/lost/grader/v1", chat_body("grade", system="Grader."))
        post(f"{run_url(gw, 'p')}/unannounced/policy/v1", chat_body("hi"))
        checks = {(r["scope"], r["role"]): r["prompt_check"] for r in calls(gw, "p")}
        assert spend(gw, "p").prompt_check_misses == 1
    assert checks == {("ok", "policy"): True, ("lost", "policy"): False, ("lost", "grader"): None,
                      ("unannounced", "policy"): None}


def test_admin_routes_need_the_token_and_names_are_never_repointed() -> None:
    with GatewayThread(GatewaySettings()) as gw:
        evil = Upstream(name="fake", base_url="http://127.0.0.1:9/v1", provider="openai_compatible",
                        api_key_env="OPENAI_API_KEY").model_dump_json()
        assert httpx.post(f"{gw.url}/admin/upstreams", content=evil).status_code == 401
        good = Upstream(name="fake", base_url="http://127.0.0.1:8/v1", provider="scripted").model_dump_json()
        assert httpx.post(f"{gw.url}/admin/upstreams", content=good,
                          headers=admin(gw)).status_code == 200
        assert httpx.post(f"{gw.url}/admin/upstreams", content=evil,
                          headers=admin(gw)).status_code == 409
        assert httpx.post(f"{gw.url}/c/guess/r/nope/s/policy/v1/chat/completions", json=chat_body("x")).status_code == 403


def test_an_upstream_that_is_down_or_too_slow_is_a_502_or_504_and_a_model_url_takes_only_get_and_post() -> None:
    fake = FakeUpstream(delay_s=2.0)
    down = Upstream(name="down", base_url="http://127.0.0.1:9/v1", provider="openai_compatible")
    with ServerThread(fake.app()) as up, GatewayThread(GatewaySettings(timeout_s=0.3),
                                                       [upstream(up.url), down]) as gw:
        register_run(gw, "slow")
        register_run(gw, "dead", policy="down")
        slow = post(f"{run_url(gw, 'slow')}/s/policy/v1", chat_body("hi"))
        dead = post(f"{run_url(gw, 'dead')}/s/policy/v1", chat_body("hi"))
        put = httpx.put(f"{run_url(gw, 'slow')}/s/policy/v1/chat/completions", json=chat_body("hi"))
        rows = calls(gw, "slow") + calls(gw, "dead")
    assert (slow.status_code, slow.json()["error"]["type"]) == (504, "upstream_timeout")
    assert (dead.status_code, dead.json()["error"]["type"]) == (502, "upstream_unreachable")
    assert "cannot reach down" in dead.json()["error"]["message"]
    assert put.status_code == 405 and fake.requests == 1  # the PUT never reached the upstream
    assert [(r["http_status"], r["status"], r["cost_usd"]) for r in rows] == [(504, "error", 0.0), (502, "error", 0.0)]


def test_role_url_for_graders_and_simulators() -> None:
    url = "http://127.0.0.1:5/r/run1/run1-c0001-train:3/policy/v1"
    assert role_url(url, "grader") == "http://127.0.0.1:5/r/run1/run1-c0001-train:3/grader/v1"
    assert role_url(url + "/", "user_simulator").endswith("-c0001-train:3/user_simulator/v1")
    assert role_url("https://api.openai.com/v1", "grader") == "https://api.openai.com/v1"


def test_upstream_names_are_stable_and_url_safe() -> None:
    hosted = ModelSpec(provider="openai_compatible", model="gpt-4.1", base_url="https://api.openai.com/v1/",
                       api_key_env="OPENAI_API_KEY")
    assert upstream_name(hosted) == upstream_name(hosted.model_copy(update={"base_url": "https://api.openai.com/v1"}))
    assert upstream_name(hosted).startswith("api.openai.com-")
    local = ModelSpec(provider="local", model="m", source="/models/some dir/Qwen2.5 Q4_K_M.gguf")
    assert upstream_name(local).replace("-", "").replace("_", "").replace(".", "").isalnum()
    assert upstream_name(ModelSpec(provider="scripted", model="s", source="rules")) == "scripted-rules"


def _writer(path: str, worker: int, n: int) -> int:
    store = ResponseStore(path)
    inserted = 0
    for i in range(n):
        # half the digests are shared by every writer: INSERT OR IGNORE keeps the first
        digest = f"shared-{i}" if i % 2 == 0 else f"own-{worker}-{i}"
        inserted += store.put(digest, upstream="u", endpoint="chat/completions", model="m",
                              body=f"{worker}:{i}".encode())
    return inserted


def test_store_is_safe_under_concurrent_writer_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "store.sqlite")
    ResponseStore(path)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        inserted = pool.starmap(_writer, [(path, w, 300) for w in range(4)])
    store = ResponseStore(path)
    assert store.count() == 150 + 4 * 150 == sum(inserted)
    assert store.get("shared-0") is not None and store.get("own-3-1") == b"3:1"
    mode = store._conn().execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


@pytest.mark.parametrize("bypassed", [False, True])
def test_the_environment_proxy_is_honoured_and_no_proxy_bypasses_it(monkeypatch, bypassed: bool) -> None:
    """With HTTP_PROXY set, the gateway calls an upstream through the proxy; a host in
    NO_PROXY it calls directly. The test's own client reaches the gateway on 127.0.0.1,
    which NO_PROXY always lists; the upstream is named `localhost`."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    via_proxy, direct = FakeUpstream(), FakeUpstream()
    with ServerThread(via_proxy.app()) as proxy, ServerThread(direct.app()) as up:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1" + (",localhost" if bypassed else ""))
        named = Upstream(name="fake", base_url=f"http://localhost:{up.port}/v1", provider="openai_compatible")
        with GatewayThread(GatewaySettings(), [named]) as gw:
            register_run(gw, "proxied")
            answer = post(f"{run_url(gw, 'proxied')}/proxied-c0000-train:0/policy/v1", chat_body("hello"))
    assert answer.status_code == 200, answer.text
    assert (via_proxy.completions, direct.completions) == ((0, 1) if bypassed else (1, 0))
