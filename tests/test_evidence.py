"""Evidence: the manifest comes last and whole, every file carries the schema version,
no secret reaches any file a run writes, and an unwritable root fails before any work."""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from conftest import container_spec, execute, make_run_spec, read_evidence, run_cli
from servers import ScriptedModelThread, ServerThread
from harness.errors import HarnessError
from harness.evidence.schema import SCHEMA_METADATA_KEY, SCHEMA_VERSION, TABLES

TABLE_FILES = {f"{name}.parquet" for name in TABLES}


def small_spec(data_dir: Path, root: Path | str, max_rollouts: int = 30) -> Any:
    return make_run_spec(container_spec("banking77", data_dir), root, train=[f"train:{i}" for i in range(8)],
                         pareto=[f"train:{i}" for i in range(8, 12)], heldout=["test:0", "test:1"],
                         max_rollouts=max_rollouts, params={"minibatch_size": 3})


class DirectoryWatcher(threading.Thread):
    """Lists a directory as fast as it can; whenever manifest.json is there, reads it."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()
        self.listings: list[frozenset[str]] = []
        self.manifest_reads: list[str] = []  # "ok" or the reason a read failed

    def run(self) -> None:
        # one listing after `stop` too: a starved thread still sees the finished directory
        while True:
            stopping = self.stop.is_set()
            try:
                names = frozenset(os.listdir(self.path))
            except FileNotFoundError:
                if stopping:
                    return
                continue
            self.listings.append(names)
            if "manifest.json" in names:
                try:
                    json.loads((self.path / "manifest.json").read_text())
                    self.manifest_reads.append("ok")
                except (OSError, ValueError) as exc:
                    self.manifest_reads.append(repr(exc))
            if stopping:
                return


def test_manifest_is_written_last_and_whole(tmp_path, data_dir, banking77_url, scripted_policy) -> None:
    spec = small_spec(data_dir, tmp_path)
    run_dir = tmp_path / spec.sweep / spec.run_id
    watcher = DirectoryWatcher(run_dir)
    watcher.start()
    try:
        outcome = execute(spec, banking77_url, scripted_policy.base_url)
    finally:
        watcher.stop.set()
        watcher.join()
    assert outcome.status == "done" and Path(outcome.evidence_dir) == run_dir
    with_manifest = [names for names in watcher.listings if "manifest.json" in names]
    assert watcher.listings and with_manifest, "the watcher never saw the run directory"
    assert all(TABLE_FILES <= names for names in with_manifest)  # never a manifest before all tables
    assert watcher.manifest_reads and set(watcher.manifest_reads) == {"ok"}  # never a partial manifest
    final = sorted(os.listdir(run_dir))
    assert final == sorted(TABLE_FILES | {"manifest.json"})  # no temporary file left
    newest_table = max((run_dir / name).stat().st_mtime_ns for name in TABLE_FILES)
    assert (run_dir / "manifest.json").stat().st_mtime_ns >= newest_table


def test_a_directory_without_manifest_is_started_over(tmp_path, data_dir, banking77_url, scripted_policy) -> None:
    spec = small_spec(data_dir, tmp_path, max_rollouts=8)
    run_dir = tmp_path / spec.sweep / spec.run_id
    run_dir.mkdir(parents=True)
    (run_dir / "rollouts.parquet").write_bytes(b"half a file from a crashed run")
    (run_dir / ".manifest.json.dead.tmp").write_text("{")
    outcome = execute(spec, banking77_url, scripted_policy.base_url)
    assert sorted(os.listdir(outcome.evidence_dir)) == sorted(TABLE_FILES | {"manifest.json"})
    assert read_evidence(outcome.evidence_dir)["manifest"]["status"] == "done"


def test_schema_version_in_manifest_and_every_table(tmp_path, data_dir, banking77_url, scripted_policy) -> None:
    outcome = execute(small_spec(data_dir, tmp_path), banking77_url, scripted_policy.base_url)
    run_dir = Path(outcome.evidence_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["schema_version"] == SCHEMA_VERSION
    for name, schema in TABLES.items():
        stored = pq.read_schema(run_dir / f"{name}.parquet")
        assert stored.metadata[SCHEMA_METADATA_KEY] == SCHEMA_VERSION.encode(), name
        assert stored.remove_metadata().equals(schema.remove_metadata()), name
    evidence = read_evidence(run_dir)
    totals = manifest["totals"]
    assert len(evidence["rollouts"]) == totals["rollouts"] + totals["heldout_rollouts"]
    assert len(evidence["candidates"]) == totals["candidates"] and len(evidence["proposals"]) == totals["proposals"]
    proposals = evidence["proposals"]
    assert totals["proposals_changed"] == sum(proposals["changed"]) and totals["proposals_accepted"] == sum(
        proposals["accepted"])


# ---------------------------------------------------------------- secrets


class KeyedModel:
    """An OpenAI-compatible stand-in for a hosted policy: answers only with the right bearer key."""

    def __init__(self, key: str):
        self.seen = {"authorized": 0, "refused": 0}
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            if request.headers.get("authorization") != f"Bearer {key}":
                self.seen["refused"] += 1
                return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
            self.seen["authorized"] += 1
            return JSONResponse({"choices": [{"message": {"role": "assistant", "content": "card_arrival"},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 7, "completion_tokens": 1}})


def string_cells(path: Path) -> str:
    """Every value of a Parquet file as text (the raw bytes may be compressed)."""
    table = pq.read_table(path)
    return json.dumps(table.to_pylist(), default=str) + str(table.schema.metadata)


def test_no_secret_in_any_file_a_run_writes(tmp_path, data_dir, monkeypatch) -> None:
    container_key, policy_key = f"ck-{uuid.uuid4().hex}", f"pk-{uuid.uuid4().hex}"
    monkeypatch.setenv("HARNESS_TEST_CONTAINER_KEY", container_key)
    monkeypatch.setenv("HARNESS_TEST_POLICY_KEY", policy_key)
    hosted = KeyedModel(policy_key)
    evidence = tmp_path / "evidence"
    with ServerThread(hosted.app) as policy:
        result = run_cli(
            "models=scripted", f"evidence_root={evidence}", f"data_dir={data_dir}",
            "container.api_key_env=HARNESS_TEST_CONTAINER_KEY",
            "policy.provider=openai_compatible", f"+policy.base_url={policy.url}/v1",
            "+policy.api_key_env=HARNESS_TEST_POLICY_KEY", "budget.max_rollouts=12",
            "pools.train.count=8", "pools.pareto.count=4", "pools.heldout.count=4",
        )
    assert result.returncode == 0, result.stdout
    # both keys were really in use: the container demanded one, the policy the other
    assert hosted.seen["authorized"] > 0 and hosted.seen["refused"] == 0
    (run_dir,) = [p.parent for p in evidence.rglob("manifest.json")]
    ev = read_evidence(run_dir)
    assert set(ev["rollouts"]["status"]) == {"ok"} and ev["manifest"]["status"] == "done"
    # the one model server the harness started (the scripted proposer; the hosted policy is not
    # ours) with its build, behind the gateway
    (server,) = ev["manifest"]["model_servers"]
    assert server["build"].startswith("harness.scripted_server, script ") and server["url"].startswith("http://127.")
    written = [p for p in evidence.rglob("*") if p.is_file()]
    # logs that stayed empty are removed; those the manifest lists are among the files scanned
    assert any(p.suffix == ".parquet" for p in written)
    assert {Path(p) for p in ev["manifest"]["logs"]} <= set(written)
    for secret in (container_key, policy_key):
        assert secret not in result.stdout
        for path in written:
            assert secret.encode() not in path.read_bytes(), path
            if path.suffix == ".parquet":
                assert secret not in string_cells(path), path
    # what the manifest does hold is the variable's name
    assert ev["manifest"]["spec"]["container"]["api_key_env"] == "HARNESS_TEST_CONTAINER_KEY"


# ---------------------------------------------------------------- unwritable root


def test_unwritable_evidence_root_fails_before_any_rollout(tmp_path, data_dir, banking77_url) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("evidence cannot go under a file")
    with ScriptedModelThread("rules") as policy:
        with pytest.raises(HarnessError, match=r"evidence directory .*a-file/evidence/local is not writable"):
            execute(small_spec(data_dir, blocker / "evidence"), banking77_url, policy.base_url)
        served = httpx.get(policy.stats_url, timeout=5).json()
    assert served["total"] == 0  # no rollout (each calls the policy) and no proposal
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert blocker.read_text() == "evidence cannot go under a file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_read_only_evidence_root_fails_before_any_rollout(tmp_path, data_dir, banking77_url, scripted_policy) -> None:
    root = tmp_path / "read-only"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(HarnessError, match="is not writable"):
            execute(small_spec(data_dir, root), banking77_url, scripted_policy.base_url)
        assert list(root.iterdir()) == []
    finally:
        root.chmod(0o700)
