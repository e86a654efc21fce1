"""Container faults, injected by the chaos container (benchmarks/containers/chaos.py: a real
Banking77 child process with faults chosen per rollout id), through whole runs
(`harness.run.execute_run`) with the scripted model.

Each fault: transient ones (500, a hang past the timeout) are retried with backoff up to a
cap and the row ends ok; answers that break the contract (a cut-off JSON body, no reward,
another rollout id) are failed rows with their error and no reward (never a zero); a run whose
failed share passes its tolerance stops as failed (stop reason `error_rate`); a container
process killed mid-run is restarted (test_faults_restart.py). The client-level behaviour
of each fault (one request at a time) is in test_contract_client.py."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException

from benchmarks.containers.chaos import FAULT_KINDS, Chaos, FaultPlan
from benchmarks.containers.kit import RolloutEnv
from conftest import execute
from faults import (
    chaos_spec,
    check_rows_exactly_once,
    container_log,
    injected_faults,
    small_spec,
    stats,
)
from harness.http_pool import SharedSession
from harness.contract import PolicyBlock, RolloutRequest, RolloutResponse
from harness.services import Services

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def chaos(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start chaos containers (one per flag set) for this module; stopped at its end."""
    log_dir = tmp_path_factory.mktemp("chaos-logs")
    with Services(log_dir) as services:

        def start(*flags: str, timeout_s: float = 2.0) -> tuple[Any, str]:
            spec = chaos_spec(data_dir, *flags, timeout_s=timeout_s)
            return spec, services.container_url(spec)

        start.services = services  # type: ignore[attr-defined]
        yield start


def faulted_rows(rollouts: list[dict[str, Any]], plan: FaultPlan) -> dict[str, list[dict[str, Any]]]:
    """Rows by the fault their rollout id was given (recomputed: faults depend on seed and id only)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rollouts:
        kind = plan.fault_for(row["rollout_id"])
        by_kind.setdefault(kind or "none", []).append(row)
    return by_kind


# ---------------------------------------------------------------- the chaos container itself


def test_faults_are_a_function_of_seed_and_rollout_id() -> None:
    plan = FaultPlan(rate=0.3, seed=7)
    ids = [f"run-c{c:04d}-train:{i}" for c in range(20) for i in range(50)]
    first = [plan.fault_for(i) for i in ids]
    assert first == [FaultPlan(rate=0.3, seed=7).fault_for(i) for i in ids]  # reproducible
    assert first != [FaultPlan(rate=0.3, seed=8).fault_for(i) for i in ids]  # the seed matters
    share = sum(k is not None for k in first) / len(first)
    assert 0.25 < share < 0.35
    assert set(first) - {None} == set(FAULT_KINDS)  # every kind is drawn
    assert all(FaultPlan(rate=0.0).fault_for(i) is None for i in ids[:100])
    with pytest.raises(ValueError, match="fault kinds"):
        FaultPlan(kinds=("500", "fire"))


def test_the_journal_keeps_attempt_counts_across_a_restart(data_dir: Path, tmp_path: Path) -> None:
    """A faulted rollout retried against a restarted chaos process is served, not faulted anew."""
    parser = argparse.ArgumentParser()
    Chaos.add_arguments(parser)
    flags = ["--fault-rate", "1", "--fault-kinds", "500"]
    request = RolloutRequest(rollout_id="r-c0000-train:0", task_id="train:0", candidate={}, task={},
                             policy=PolicyBlock(provider="scripted", model="m", base_url="http://127.0.0.1:9/v1"))

    def lifetime(*extra: str) -> Chaos:
        container = Chaos(str(data_dir))
        container.configure(parser.parse_args([*flags, *extra]))
        return container

    async def rollout(container: Chaos) -> RolloutResponse:
        session = SharedSession(timeout_s=10.0)
        try:
            return await container.rollout(request, {"text": "x", "label": "y"}, RolloutEnv(http=session))
        finally:
            await session.aclose()

    journal = str(tmp_path / "journal.txt")
    with pytest.raises(HTTPException):
        asyncio.run(rollout(lifetime("--journal", journal)))
    restarted = lifetime("--journal", journal)
    served = asyncio.run(rollout(restarted))
    # Banking77's own rollout answered: the candidate lacks its field, so an error row, no fault
    assert not restarted.injected and served.status == "error" and "stage2_system" in (served.error or "")
    with pytest.raises(HTTPException):  # without a journal a new process faults it again
        asyncio.run(rollout(lifetime()))


# ---------------------------------------------------------------- transient: retried, capped


def test_a_500_on_some_rollouts_is_retried_and_every_row_ends_ok(chaos, tmp_path, scripted_policy) -> None:
    spec_c, url = chaos("--fault-rate", "0.3", "--fault-kinds", "500", "--seed", "1")
    outcome = execute(small_spec(spec_c, tmp_path), url, scripted_policy.base_url)
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    plan = FaultPlan(rate=0.3, kinds=("500",), seed=1)
    rows = faulted_rows(ev["rollouts"], plan)
    assert len(rows.get("500", [])) >= 3, "too few rows drew a fault to show anything"
    assert {r["status"] for r in ev["rollouts"]} == {"ok"}  # each faulted row survived its retry
    injected = stats(url)["injected"]
    assert injected["500"] >= len(rows["500"])


def test_a_persistent_500_is_retried_up_to_the_cap_then_a_failed_row(chaos, tmp_path, scripted_policy) -> None:
    spec_c, url = chaos("--fault-rate", "0.2", "--fault-kinds", "500", "--fault-attempts", "0", "--seed", "2")
    started = time.monotonic()
    outcome = execute(small_spec(spec_c, tmp_path, budget=20), url, scripted_policy.base_url)
    assert outcome.status == "done", outcome.error  # under the 50% tolerance: the run goes on
    ev = check_rows_exactly_once(outcome.evidence_dir)
    failed = [r for r in ev["rollouts"] if r["status"] != "ok"]
    plan = FaultPlan(rate=0.2, kinds=("500",), seed=2, attempts=0)
    assert failed and {r["rollout_id"] for r in failed} == {r["rollout_id"] for r in faulted_rows(ev["rollouts"], plan)["500"]}
    for row in failed:
        assert row["reward"] is None and row["error_kind"] == "transient"
        assert row["error"].startswith("POST /rollout failed (transient): HTTP 500")
    # the cap: each failed row was tried exactly RetryPolicy().attempts times, with backoff between
    attempts = Counter(f["rollout"] for f in injected_faults(container_log(chaos.services, url).read_text()))
    assert {attempts[r["rollout_id"]] for r in failed} == {4}
    assert min(r["latency_s"] for r in failed) > 0.5 * (0.5 + 1 + 2) * 0.9  # jittered 0.5x..1.5x backoff
    assert time.monotonic() - started < 120


def test_a_hang_past_the_timeout_is_retried(chaos, tmp_path, scripted_policy) -> None:
    spec_c, url = chaos("--fault-rate", "0.25", "--fault-kinds", "hang", "--hang-s", "60", "--seed", "3",
                        timeout_s=1.0)
    started = time.monotonic()
    outcome = execute(small_spec(spec_c, tmp_path, budget=20), url, scripted_policy.base_url)
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    hung = faulted_rows(ev["rollouts"], FaultPlan(rate=0.25, kinds=("hang",), seed=3)).get("hang", [])
    assert hung and all(r["status"] == "ok" for r in hung)
    assert all(r["latency_s"] >= 1.0 for r in hung)  # each waited out one timeout, then got its answer
    assert time.monotonic() - started < 60  # a hang costs the timeout, not the 60 s the container holds it


# ---------------------------------------------------------------- broken answers: failed rows, no reward


ERRORS = {
    "malformed": "/rollout: response is not JSON",
    "no_reward": "no reward in response",
    "wrong_id": "/rollout: answered rollout_id",
}


def test_malformed_unrewarded_and_misaddressed_answers_are_failed_rows(chaos, tmp_path, scripted_policy) -> None:
    spec_c, url = chaos("--fault-rate", "0.25", "--fault-kinds", "malformed,no_reward,wrong_id", "--seed", "4")
    spec = small_spec(spec_c, tmp_path, budget=30).model_copy(update={"heldout_candidates": "all"})
    outcome = execute(spec, url, scripted_policy.base_url)
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    plan = FaultPlan(rate=0.25, kinds=("malformed", "no_reward", "wrong_id"), seed=4)
    by_kind = faulted_rows(ev["rollouts"], plan)
    assert set(by_kind) >= {"malformed", "no_reward", "wrong_id"}, {k: len(v) for k, v in by_kind.items()}
    for kind, needle in ERRORS.items():
        for row in by_kind[kind]:
            assert row["status"] == "error" and row["reward"] is None and needle in row["error"], row
    assert all(r["status"] == "ok" for r in by_kind.get("none", []))
    # not retried: a contract violation is not transient (one attempt per faulted id)
    attempts = Counter(f["rollout"] for f in injected_faults(container_log(chaos.services, url).read_text()))
    assert set(attempts.values()) == {1}
    # failures are left out of scores: every score in the manifest is the mean of the rows with a reward
    rewards: dict[tuple[str, str], float | None] = {(r["candidate_id"], r["task_id"]): r["reward"]
                                                    for r in ev["rollouts"]}
    checked = 0
    for scored in ev["manifest"]["heldout"]:
        cid = scored["candidate_id"]
        heldout = [rewards[(cid, t)] for t in spec.pools.heldout if (cid, t) in rewards]
        if len(heldout) == len(spec.pools.heldout):
            rewarded = [r for r in heldout if r is not None]
            assert (scored["heldout_n"], scored["heldout_failed"]) == (len(rewarded), len(heldout) - len(rewarded))
            assert scored["heldout_score"] == pytest.approx(sum(rewarded) / len(rewarded))
            checked += 1
    assert checked


# a container of its own for each case (a fault seed each): a faulted id fails its first
# attempt only, so a container shared with the other case would fault nothing in the second
@pytest.mark.parametrize("tolerance, status, fault_seed", [(0.5, "failed", "5"), (0.95, "done", "6")])
def test_a_failure_rate_past_the_tolerance_stops_the_run(chaos, tmp_path, scripted_policy, tolerance, status,
                                                         fault_seed) -> None:
    spec_c, url = chaos("--fault-rate", "0.7", "--fault-kinds", "no_reward", "--seed", fault_seed)
    outcome = execute(small_spec(spec_c, tmp_path, budget=20), url, scripted_policy.base_url, max_error_rate=tolerance)
    assert outcome.status == status
    ev = check_rows_exactly_once(outcome.evidence_dir)
    assert ev["manifest"]["status"] == status
    if status == "failed":
        assert outcome.error is not None
        assert "rollouts failed (tolerance 50%); last error: no reward in response" in outcome.error
        assert outcome.stop_reason == ev["manifest"]["stop_reason"] == "error_rate"
        assert ev["manifest"]["error"] == outcome.error
        assert [e["message"] for e in ev["events"] if e["kind"] == "error"] == [outcome.error]
