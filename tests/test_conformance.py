"""Conformance: containers written from the published contract alone (tests/fixtures, in
Python and in Node.js), in each shape published containers use, run end to end (started by
Services, a seed-only run with the scripted model, real Parquet evidence) and pass the
doctor. Failed rollouts are error rows with the container's reason, left out of scores."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.doctor import diagnose
from harness.run import run_sync
from harness.services import Endpoints, Services
from harness.specs import ContainerSpec

from conftest import make_run_spec, read_evidence, run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHAPES = ("objects", "fallback", "failing", "routes")
# the Python fixture learns its port from $PORT, the Node one from --port
LANGUAGES = {"python": (["python", str(FIXTURES / "contract_container.py")], "env"),
             "node": (["node", str(FIXTURES / "contract_container.js")], "args")}
STATUS = {"objects": "completed", "fallback": "succeeded", "routes": "ok", "failing": "completed"}
SOURCE = {"objects": "summary", "fallback": "reward_info.details", "routes": "summary", "failing": "summary"}
FIRST_REASON = "status failed: stored failure: policy backend overloaded (first answer: HTTP 503: policy backend overloaded)"


def fixture_spec(language: str, shape: str) -> ContainerSpec:
    if language == "node" and shutil.which("node") is None:
        pytest.skip("node is not installed")
    command, port_via = LANGUAGES[language]
    return ContainerSpec(name=f"fixture_{language}_{shape}", command=[*command, "--shape", shape], port_via=port_via,
                         target_modules=["instruction"])


def seed_run(container: ContainerSpec, services: Services, policy_url: str, root: Path,
             max_error_rate: float = 0.5) -> Any:
    # pareto train:2..5 and heldout test:0..3 alternate alpha/beta; the scripted policy answers alpha
    spec = make_run_spec(container, root, train=["train:0", "train:1"], pareto=[f"train:{i}" for i in range(2, 6)],
                         heldout=[f"test:{i}" for i in range(4)], max_rollouts=8, algorithm="seed_only")
    url = services.container_url(container)
    endpoints = Endpoints(container_url=url, policy_url=policy_url, proposer_url=policy_url,
                          logs=services.logs_for(url))
    return run_sync(spec, endpoints, max_error_rate=max_error_rate)


@pytest.mark.parametrize("language", sorted(LANGUAGES))
@pytest.mark.parametrize("shape", SHAPES)
def test_each_published_shape_is_accepted_and_recorded_strictly(language, shape, tmp_path, scripted_policy) -> None:
    container = fixture_spec(language, shape)
    with Services(tmp_path / "logs", label="conformance") as services:
        url = services.container_url(container)
        outcome = seed_run(container, services, scripted_policy.base_url, tmp_path / "evidence")
        findings = asyncio.run(diagnose(url, scripted_policy.base_url))
    assert outcome.status == "done", outcome.error
    ev = read_evidence(outcome.evidence_dir)
    rows = {(r["stage"], r["task_id"]): r for r in ev["rollouts"].to_dicts()}
    assert len(rows) == 8
    for (_, task_id), row in rows.items():
        failing = shape == "failing" and int(task_id.split(":")[1]) % 2 == 1
        if failing:  # no reward, never a zero; the first answer's reason is kept
            assert (row["status"], row["reward"], row["container_status"]) == ("error", None, "failed")
            assert row["error"] == FIRST_REASON and row["error_kind"] == "container"
            continue
        alpha = int(task_id.split(":")[1]) % 2 == 0
        assert (row["status"], row["reward"], row["error"]) == ("ok", 1.0 if alpha else 0.0, None)
        assert row["container_status"] == STATUS[shape] and row["feedback_source"] == SOURCE[shape]
        assert row["output"] == "alpha" and row["inputs"].startswith("Sentence: ")
        expected = "alpha" if alpha else "beta"
        assert (f'"expected": "{expected}"' if shape == "fallback" else f"Expected: {expected}") in row["feedback"]
    failed = 4 if shape == "failing" else 0
    assert ev["manifest"]["totals"]["failed_rollouts"] == outcome.failed_rollouts == failed
    # the alternating rows score 0.5; with the beta rows failed the score rests on the 2 alpha rows
    assert outcome.seed_heldout == (1.0 if shape == "failing" else 0.5)
    assert outcome.seed_heldout_n == (2 if shape == "failing" else 4)
    (heldout,) = ev["manifest"]["heldout"]
    assert (heldout["heldout_failed"], heldout["pareto_score"]) == (failed // 2, heldout["heldout_score"])
    assert [f.line() for f in findings if f.level in ("error", "warn")] == []
    followed = [f.message for f in findings if "advertised routes followed" in f.message]
    assert bool(followed) == (shape == "routes")


def test_a_run_failing_on_its_error_rate_says_so(tmp_path, scripted_policy) -> None:
    container = fixture_spec("python", "failing")
    with Services(tmp_path / "logs") as services:
        outcome = seed_run(container, services, scripted_policy.base_url, tmp_path / "evidence", max_error_rate=0.3)
    assert (outcome.status, outcome.stop_reason) == ("failed", "error_rate")
    assert outcome.error is not None and outcome.error.startswith("4/8 rollouts failed (tolerance 30%)")
    assert FIRST_REASON in outcome.error
    manifest = read_evidence(outcome.evidence_dir)["manifest"]
    assert (manifest["stop_reason"], manifest["totals"]["failed_rollouts"]) == ("error_rate", 4)
    logs = manifest["logs"]
    assert len(logs) == 1 and Path(logs[0]).name == "container-fixture_python_failing.log"


def test_the_cli_run_summary_says_what_failed(tmp_path) -> None:
    """`python -m harness` on the failing fixture, past a 30% tolerance: exit 1, the failed
    count, the stop reason and the container's log in the summary."""
    evidence = tmp_path / "evidence"
    result = run_cli(
        "models=scripted", "algorithm=seed_only", "container.name=fixture",
        "container.command=['python','tests/fixtures/contract_container.py','--shape','failing']",
        "+container.port_via=env", "container.target_modules=[instruction]", f"evidence_root={evidence}",
        "max_error_rate=0.3", "pools.train.count=2", "pools.pareto.start=2", "pools.pareto.count=4",
        "pools.heldout.count=4", timeout=240)
    assert result.returncode == 1, result.stdout[-3000:]
    out = " ".join(result.stdout.split())  # the console wraps at 80 columns
    assert "4 of 8 failed (no reward, left out of every score)" in out and "stop: error_rate" in out
    (run_dir,) = [p.parent for p in evidence.rglob("manifest.json")]
    assert f"logs: {evidence}/local/logs/{run_dir.name}-container-fixture.log" in out
