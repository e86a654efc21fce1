"""Evidence integrity and input edges, played against real runs (scripted models):

- a done run is never lost on rerun: refused without force; a forced redo that fails leaves
  the old evidence whole; one that finishes replaces it;
- a run whose model calls cannot be recorded (the gateway stops answering /calls) is failed;
- the manifest's sha256 per table catches a 2-byte edit; every malformed input to the report
  (flipped bit, garbage index.parquet, broken sweep.json, renamed column) is one `error:`
  line with exit code 2;
- input edges: a keyless override, an unknown URI scheme, a sweep name outside the evidence
  root, a non-ASCII task index and two bad keys are one line each;
- fuzz: the kit and the contract client with malformed bodies (hypothesis)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI, Request, Response
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.report.__main__ import main as report_main
from conftest import container_spec, execute, run_cli
from servers import GatewayThread, ScriptedModelThread, ServerThread
from faults import small_spec
from harness.client import ContainerClient
from harness.errors import HarnessError
from harness.gateway.models import GatewaySettings, Upstream
from harness.retry import RetryPolicy
from harness.run import run_sync
from harness.services import Endpoints

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def done_run(tmp_path_factory, data_dir, banking77_url) -> Path:
    with ScriptedModelThread("rules") as model:
        outcome = execute(small_spec(container_spec("banking77", data_dir), tmp_path_factory.mktemp("ev"), budget=20),
                      banking77_url, model.base_url)
    assert outcome.status == "done", outcome.error
    return Path(outcome.evidence_dir)


def test_a_done_run_is_never_lost_on_rerun(tmp_path, data_dir, banking77_url) -> None:
    spec = small_spec(container_spec("banking77", data_dir), tmp_path, budget=20)
    with ScriptedModelThread("rules") as model:
        first = execute(spec, banking77_url, model.base_url)
        manifest = Path(first.evidence_dir) / "manifest.json"
        before = manifest.read_bytes()
        with pytest.raises(HarnessError, match="already done"):
            execute(spec, banking77_url, model.base_url)
        with pytest.raises(HarnessError):  # a forced redo that cannot even start: nothing touched
            execute(spec, "http://127.0.0.1:9", model.base_url, force=True)
        assert manifest.read_bytes() == before
        redone = execute(spec, banking77_url, model.base_url, force=True)
    assert redone.status == "done" and redone.evidence_dir == first.evidence_dir
    after = json.loads(manifest.read_text())
    assert after["timings"]["started_at"] != json.loads(before)["timings"]["started_at"]
    assert not list((Path(first.evidence_dir).parent / ".staging").iterdir())  # nothing left aside


def calls_blocking_proxy(gateway: str) -> FastAPI:
    """The gateway, except that reading a run's calls fails (the gateway went away)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=gateway, timeout=60.0) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.api_route("/{path:path}", methods=["GET", "POST", "DELETE"])
    async def forward(path: str, request: Request) -> Response:
        if path.endswith("/calls"):
            return Response(status_code=503)
        answer = await request.app.state.client.request(
            request.method, f"/{path}", content=await request.body(),
            headers={k: v for k, v in request.headers.items() if k in ("authorization", "content-type")})
        return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))

    return app


def test_a_run_whose_model_calls_are_not_recorded_is_not_done(tmp_path, data_dir, banking77_url) -> None:
    spec = small_spec(container_spec("banking77", data_dir), tmp_path, budget=12)
    with ScriptedModelThread("rules") as model, GatewayThread(
            GatewaySettings(), [Upstream(name="scripted-rules", base_url=model.base_url, provider="scripted")]) as gw, \
            ServerThread(calls_blocking_proxy(gw.url)) as proxy:
        endpoints = Endpoints(container_url=banking77_url, policy_url=f"{proxy.url}/u/scripted-rules/v1",
                              proposer_url=f"{proxy.url}/u/scripted-rules/v1", gateway_url=proxy.url,
                              policy_upstream="scripted-rules", proposer_upstream="scripted-rules",
                              gateway_token=gw.admin_token)
        outcome = run_sync(spec, endpoints)
    assert outcome.status == "failed" and "model calls not recorded" in (outcome.error or "")
    manifest = json.loads((Path(outcome.evidence_dir) / "manifest.json").read_text())
    assert manifest["status"] == "failed"


# ------------------------------------------------------------------ tampered evidence


def report(sweep: Path, capsys) -> tuple[int, list[str]]:
    code = report_main([str(sweep), "--no-charts", "--out", str(sweep.parent / "report-out")])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def copy_sweep(done_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    sweep = tmp_path / "sweep"
    shutil.copytree(done_run, sweep / done_run.name)
    return sweep, sweep / done_run.name


def test_the_manifest_digests_every_table_and_the_report_verifies_them(done_run, tmp_path, capsys) -> None:
    manifest = json.loads((done_run / "manifest.json").read_text())
    assert sorted(manifest["files"]) == sorted(p.name for p in done_run.glob("*.parquet"))
    sweep, run_dir = copy_sweep(done_run, tmp_path)
    assert report(sweep, capsys)[0] == 0
    page = run_dir / "rollouts.parquet"
    data = bytearray(page.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in the middle of a data page
    data[len(data) // 2 + 1] ^= 0x01
    page.write_bytes(bytes(data))
    code, lines = report(sweep, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and "rollouts.parquet" in lines[0]
    assert "does not match the manifest" in lines[0]


@pytest.mark.parametrize("damage", ["garbage index", "broken sweep.json", "renamed column", "sweep.json escapes"])
def test_every_malformed_report_input_is_one_error_line(done_run, tmp_path, capsys, damage) -> None:
    sweep, run_dir = copy_sweep(done_run, tmp_path)
    if damage == "garbage index":
        (sweep / "index.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 50 + b"PAR1")
    elif damage == "broken sweep.json":
        (sweep / "sweep.json").write_text('{"grid": [{"run_id": ')
    elif damage == "sweep.json escapes":
        (sweep / "sweep.json").write_text(json.dumps({"grid": [{"run_id": "../../etc"}]}))
    else:  # a renamed column, with the digest made to match: the schema check still names it
        table = pq.read_table(run_dir / "rollouts.parquet")
        renamed = table.rename_columns(["rewardz" if c == "reward" else c for c in table.column_names])
        pq.write_table(renamed.replace_schema_metadata(table.schema.metadata), run_dir / "rollouts.parquet")
        manifest = json.loads((run_dir / "manifest.json").read_text())
        manifest["files"]["rollouts.parquet"]["sha256"] = hashlib.sha256(
            (run_dir / "rollouts.parquet").read_bytes()).hexdigest()
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
    code, lines = report(sweep, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines
    expected = {"garbage index": "index.parquet", "broken sweep.json": "sweep.json",
                "renamed column": "'reward'", "sweep.json escapes": "not a plain directory name"}[damage]
    assert expected in lines[0]


# ------------------------------------------------------------------ input edges


@pytest.mark.parametrize("overrides, expected", [
    (["=5"], "names no key"),
    (["evidence_root=foo://x"], "evidence_root 'foo://x'"),
    (["+sweep=smoke", "sweep.name=.."], "sweep 'name'"),
    (["+pools.train.ids=['train:٣','train:3']"], "ASCII digits"),
    (["policy.foo=1", "policy.bar=2"], "the keys under policy are max_tokens"),
])
def test_input_edges_are_one_line(overrides, expected, tmp_path) -> None:
    result = run_cli("models=scripted", f"evidence_root={tmp_path}", *overrides, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), result.stdout[-2000:]
    assert expected in lines[0]
    assert not list(tmp_path.parent.glob("etc*"))  # nothing written outside evidence_root


# ------------------------------------------------------------------ fuzz

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
BODIES = st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["/rollout", "/tasks", "/task_info", "/metadata", "/program"]), body=BODIES)
def test_fuzz_the_kit_with_malformed_bodies(banking77_url, route, body) -> None:
    answer = httpx.post(f"{banking77_url}{route}", content=body, headers={"content-type": "application/json"},
                        timeout=30.0)
    assert answer.status_code < 500 or answer.status_code == 501, (answer.status_code, answer.text[:200])
    assert httpx.get(f"{banking77_url}/health").status_code == 200


class Hostile:
    """A container whose every answer is `body` with `status`."""

    def __init__(self) -> None:
        self.body, self.status = b"", 200

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.body})


@pytest.fixture(scope="module")
def hostile() -> Any:
    app = Hostile()
    with ServerThread(app) as server:
        yield app, server.url


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES, status=st.sampled_from([200, 200, 400, 404, 422, 500]))
def test_fuzz_the_contract_client_with_malformed_bodies(hostile, body, status) -> None:
    app, url = hostile
    app.body, app.status = body, status

    async def probe() -> None:
        # a 500 is retried once, without the backoff's sleep: under the default policy the 80
        # examples slept minutes, past the test's timeout on a busy machine
        client = ContainerClient(url, concurrency=1, timeout_s=10.0, retry=RetryPolicy(attempts=2, base_delay_s=0.0))
        try:
            for call in (client.metadata, client.program, client.taskset, client.task_info):
                try:
                    await call()
                except HarnessError:
                    pass  # a clear, typed failure: what a malformed answer must give
        finally:
            await client.aclose()

    asyncio.run(probe())
