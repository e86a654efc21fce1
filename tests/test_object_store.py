"""Evidence on an object store, against a real S3 server on loopback (moto's): a run and a
sweep write there, print where with the `s3://` scheme and never the URI's query, and the
report reads the evidence back through a local mirror and writes itself beside it, the same
report a local copy of the evidence gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
BUCKET = "evidence-bucket"

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def s3_root() -> Iterator[str]:
    """An empty bucket on a loopback S3 server; the URI of its `evidence` folder."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    query = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    try:
        fs, _ = pafs.FileSystem.from_uri(f"s3://{BUCKET}?{query}&allow_bucket_creation=true")
        fs.create_dir(BUCKET)
        yield f"s3://{BUCKET}/evidence?{query}"
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
        server.stop()


# test credentials for the loopback server; no instance-metadata probe for others
S3_ENV = {"AWS_ACCESS_KEY_ID": "test-key-id", "AWS_SECRET_ACCESS_KEY": "test-secret",
          "AWS_EC2_METADATA_DISABLED": "true"}


def under(root: str, path: str) -> str:
    base, _, query = root.partition("?")
    return f"{base}/{path}?{query}"


def files(uri: str) -> dict[str, bytes]:
    fs, path = pafs.FileSystem.from_uri(uri)
    found = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    out = {}
    for info in found:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as stream:
                out[info.path[len(path) + 1:]] = stream.read()
    return out


def report(path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.report", path, "--no-charts", *args], cwd=REPO,
                          env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True, timeout=300)


def test_a_run_on_s3_is_reported_beside_its_evidence_as_from_a_local_copy(s3_root, data_dir, tmp_path) -> None:
    result = run_cli("models=scripted", f"evidence_root='{s3_root}'", f"data_dir={data_dir}", "budget.max_rollouts=40")
    assert result.returncode == 0, result.stdout[-3000:]
    shown = [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("evidence: ")]
    assert shown and shown[0].startswith(f"s3://{BUCKET}/evidence/local/"), result.stdout[-2000:]
    assert "endpoint_override" not in result.stdout  # the query (it may hold keys) is never printed
    run_id = shown[0].rsplit("/", 1)[1]
    run_uri = under(s3_root, f"local/{run_id}")
    evidence = files(run_uri)
    assert {"manifest.json", "rollouts.parquet", "candidates.parquet"} <= set(evidence)
    recorded_root = json.loads(evidence["manifest.json"])["spec"]["evidence_root"]
    assert recorded_root == f"s3://{BUCKET}/evidence"  # the query is not kept in the evidence either
    again = run_cli("models=scripted", f"evidence_root='{s3_root}'", f"data_dir={data_dir}", "budget.max_rollouts=40")
    assert again.returncode == 0 and f"run {run_id} is already done" in again.stdout, again.stdout[-2000:]

    remote = report(run_uri)
    assert remote.returncode == 0, remote.stderr[-2000:]
    assert f"report: s3://{BUCKET}/evidence/local/{run_id}/report" in remote.stdout
    written = files(under(s3_root, f"local/{run_id}/report"))
    # the same evidence copied to local disk gives the same report
    local = tmp_path / "local" / run_id
    for name, data in evidence.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    assert report(str(local)).returncode == 0
    assert written["summary.md"] == (local / "report" / "summary.md").read_bytes()
    assert written["runs.parquet"] == (local / "report" / "runs.parquet").read_bytes()


def test_a_sweep_on_s3_ends_with_its_summary_beside_its_evidence(s3_root, data_dir) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    command = [sys.executable, "-m", "harness", "+sweep=smoke", "models=scripted", f"evidence_root='{s3_root}'",
               f"data_dir={data_dir}", "sweep.containers=[heart_disease]", "budget.max_rollouts=30"]
    first = subprocess.run(command, cwd=REPO, env={**env, "COLUMNS": "250"}, capture_output=True, text=True,
                           timeout=300, start_new_session=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"summary: s3://{BUCKET}/evidence/smoke/report/summary.md" in first.stdout, first.stdout[-2000:]
    assert "endpoint_override" not in first.stdout + first.stderr
    summary = files(under(s3_root, "smoke/report"))["summary.md"].decode()
    assert "| heart_disease | gepa |" in summary
    index = files(under(s3_root, "smoke"))
    runs = {name.split("/")[0] for name in index if name.endswith("/manifest.json")}
    assert len(runs) == 2  # the smoke sweep's two seeds


def test_a_forced_redo_on_s3_replaces_done_evidence_only_when_done(s3_root, data_dir, banking77_url) -> None:
    """As on local disk: a redo that fails leaves the done evidence whole; one that is done
    replaces it. A swap cut short (tables copied, the manifest not yet) is finished by the
    next start, which then finds the run done."""
    from conftest import container_spec, execute
    from faults import small_spec
    from harness.evidence.writer import STAGING
    from servers import ScriptedModelThread

    spec = small_spec(container_spec("banking77", data_dir), s3_root, budget=20)
    with ScriptedModelThread("rules") as model:
        first = execute(spec, banking77_url, model.base_url)
        assert first.status == "done", first.error
        run_uri = under(s3_root, f"{spec.sweep}/{spec.run_id}")
        before = files(run_uri)
        # the policy is gone: every rollout fails and the redo ends failed, its evidence aside
        failed = execute(spec, banking77_url, "http://127.0.0.1:9", force=True)
        assert failed.status == "failed"
        assert files(run_uri) == before
        redone = execute(spec, banking77_url, model.base_url, force=True)
    assert redone.status == "done" and redone.evidence_dir == first.evidence_dir
    after = files(run_uri)
    assert after["manifest.json"] != before["manifest.json"] and set(after) == set(before)
    assert not files(under(s3_root, f"{spec.sweep}/{STAGING}"))  # nothing left aside

    # a swap cut short: the previous manifest gone, some of the next attempt's tables in
    # place, and the attempt itself still staged
    fs, path = pafs.FileSystem.from_uri(run_uri)
    fs.delete_file(f"{path}/manifest.json")
    staged = f"{path.rsplit('/', 1)[0]}/{STAGING}/{spec.run_id}-0123456789ab"
    for name, data in before.items():
        with fs.open_output_stream(f"{staged}/{name}") as out:
            out.write(data)
        if name != "manifest.json":
            with fs.open_output_stream(f"{path}/{name}") as out:
                out.write(data)
    with pytest.raises(Exception, match="already done"):
        execute(spec, banking77_url, "http://127.0.0.1:9")
    assert files(run_uri) == before  # the copy finished: the staged attempt's files, manifest and all
    assert not files(under(s3_root, f"{spec.sweep}/{STAGING}"))
