"""One run: preflight, optimize, re-score on heldout, write evidence and manifest."""

from __future__ import annotations

import functools
import logging
import platform
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from importlib import metadata as importlib_metadata
from typing import Any, Awaitable, Callable

import uvloop
from pydantic import BaseModel, ConfigDict

from algorithms.registry import build_optimizer
from harness.candidates import Candidate, mean_reward
from harness.checkpoint import CheckpointStore, RunCheckpoint, merge_gateway_summaries
from harness.client import ContainerClient, Gate
from harness.container_keeper import RestartHook
from harness.context import Progress, RunContext, RunFailed
from harness.contract import PolicyBlock
from harness.errors import HarnessError, PreflightError, Unreachable, hide_capabilities
from harness.evidence.recorder import model_call_rows
from harness.evidence.uri import shown
from harness.evidence.writer import EvidenceLocation
from harness.gateway.session import GatewaySession
from harness.heap import HeapFreeze
from harness.llm import ChatClient
from harness.preflight import PreflightResult, preflight
from harness.pricing import PRICE_TABLE_VERSION
from harness.services import Endpoints
from harness.specs import RunSpec
from harness.tracking.hooks import ExportNote

_log = logging.getLogger(__name__)

VERSIONED_PACKAGES = ("gepa-harness", "pydantic", "httpx", "pyarrow", "polars", "ray", "hydra-core", "gepa")


class HeldoutScore(BaseModel):
    """A candidate's scores; each mean rests on the rows with a reward (`*_n` of them)."""

    model_config = ConfigDict(frozen=True)
    candidate_id: str
    pareto_score: float | None
    heldout_score: float | None
    pareto_n: int | None = None
    heldout_n: int = 0
    heldout_failed: int = 0


class RunOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)
    run_id: str
    status: str  # "done" or "failed"
    evidence_dir: str
    stop_reason: str | None = None
    error: str | None = None
    seed_candidate_id: str | None = None
    best_candidate_id: str | None = None
    seed_heldout: float | None = None
    best_heldout: float | None = None
    seed_texts: dict[str, str] | None = None
    best_texts: dict[str, str] | None = None
    rollouts: int = 0
    heldout_rollouts: int = 0
    failed_rollouts: int = 0  # error rows (no reward), not averaged into any score
    seed_heldout_n: int | None = None  # heldout rows the seed's score rests on
    best_heldout_n: int | None = None
    tokens: int = 0
    cost_usd: float | None = 0.0
    wall_s: float = 0.0
    proposals: int = 0
    proposals_changed: int = 0  # the proposed text differs from the parent's
    proposals_accepted: int = 0
    logs: tuple[str, ...] = ()  # the run's service logs that have content
    tracking: ExportNote | None = None  # the export to a tracker, when one is configured (after the evidence)


def package_versions() -> dict[str, str]:
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> tuple[tuple[str, str], ...]:
    """Read once per process: the metadata scan was a tenth of a short sweep run's CPU, and a
    Ray worker runs many runs."""
    versions = [("python", platform.python_version())]
    for name in VERSIONED_PACKAGES:
        try:
            versions.append((name, importlib_metadata.version(name)))
        except importlib_metadata.PackageNotFoundError:
            versions.append((name, "not installed"))
    return tuple(versions)


def _pareto_score(ctx: RunContext, candidate: Candidate) -> float | None:
    results = [ctx.cached_result(candidate, t) for t in ctx.pools.pareto]
    if any(r is None for r in results):
        return None
    return mean_reward([r for r in results if r is not None])


def _pareto_n(ctx: RunContext, candidate: Candidate) -> int | None:
    results = [ctx.cached_result(candidate, t) for t in ctx.pools.pareto]
    if any(r is None for r in results):
        return None
    return sum(r is not None and r.reward is not None for r in results)


def heldout_candidates(ctx: RunContext, best_id: str) -> list[Candidate]:
    """Which candidates to judge on heldout: seed and best; every candidate the algorithm
    produced (also those rejected on their minibatch); or the top-K by pareto score."""
    choice = ctx.spec.heldout_candidates
    seed = ctx.seed_candidate
    if choice == "best":
        picked = [seed] + ([ctx.candidate(best_id)] if best_id != seed.candidate_id else [])
        return picked
    if choice == "all":
        return sorted(ctx.candidates, key=lambda c: c.index)
    scored = [(c, _pareto_score(ctx, c)) for c in ctx.candidates]
    ranked = [c for c, score in sorted((p for p in scored if p[1] is not None), key=lambda p: (-p[1], p[0].index))]
    ranked = ranked[:choice]
    ids = {c.candidate_id for c in ranked}
    return sorted(ranked + ([seed] if seed.candidate_id not in ids else []) + (
        [ctx.candidate(best_id)] if best_id not in ids and best_id != seed.candidate_id else []), key=lambda c: c.index)


async def _score_heldout(ctx: RunContext, best_id: str, done: list[HeldoutScore],
                         checkpoint: Callable[[list[HeldoutScore]], Awaitable[None]]) -> list[HeldoutScore]:
    """Re-score the chosen candidates on heldout, in chunks, checkpointing at most every
    `checkpoint_every_s`; candidates in `done` (from a checkpoint) are not scored again."""
    finished = {score.candidate_id: score for score in done}
    scores: list[HeldoutScore] = []
    chunk = max(8, 4 * ctx.spec.concurrency)
    last_saved = time.monotonic()
    for candidate in heldout_candidates(ctx, best_id):
        if candidate.candidate_id in finished:
            scores.append(finished[candidate.candidate_id])
            continue
        task_ids = list(ctx.pools.heldout)
        for start in range(0, len(task_ids), chunk):
            await ctx.evaluate(candidate, task_ids[start:start + chunk], "heldout")
            if time.monotonic() - last_saved >= ctx.spec.checkpoint_every_s:
                await checkpoint(scores)
                last_saved = time.monotonic()
        results = await ctx.evaluate(candidate, task_ids, "heldout")  # every pair is cached by now
        rewarded = sum(r.reward is not None for r in results)
        scores.append(HeldoutScore(candidate_id=candidate.candidate_id, pareto_score=_pareto_score(ctx, candidate),
                                   heldout_score=mean_reward(results), pareto_n=_pareto_n(ctx, candidate),
                                   heldout_n=rewarded, heldout_failed=len(results) - rewarded))
    return scores


async def execute_run(
    spec: RunSpec,
    endpoints: Endpoints,
    *,
    observer: Callable[[Progress], None] | None = None,
    max_error_rate: float = 0.5,
    rollout_gate: Gate | None = None,
    proposer_gate: Gate | None = None,
    restart_container: RestartHook | None = None,
    force: bool = False,
) -> RunOutcome:
    """Run one spec to completion and write its evidence. Bad input raises before any
    rollout; failures after that (an unexpected exception too) are recorded in the manifest
    and returned.
    `restart_container` starts the run's container again when it stops answering (its
    process died); without it such a run fails with the reason. A run already done is
    refused unless `force`, which redoes it and replaces its evidence only if it is done again."""
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    final_location = EvidenceLocation(spec.evidence_root, spec.sweep, spec.run_id)
    optimizer = build_optimizer(spec.algorithm.name, spec.algorithm.params)
    final_location.check_writable()
    final_location.recover()
    redo = finished(final_location)
    if redo and not force:
        raise HarnessError(f"run {spec.run_id} is already done (evidence in {final_location.run_dir}); "
                           "force=true redoes it")
    # written aside and swapped in at the end: the previous evidence stays until then, and a
    # finished run's only if this attempt finishes too
    location = final_location.staging()
    checkpoints = CheckpointStore(location, spec.run_id)
    restored = checkpoints.load()
    client = ContainerClient(endpoints.container_url, api_key_env=spec.container.api_key_env,
                             concurrency=spec.concurrency, timeout_s=spec.container.request_timeout_s,
                             gate=rollout_gate)
    # through the gateway the key stays in the gateway: the harness sends none
    gateway = _gateway_session(spec, endpoints)
    proposer = ChatClient(endpoints.proposer_url, spec.proposer.model,
                          api_key_env=None if gateway else spec.proposer.api_key_env,
                          timeout_s=spec.proposer.timeout_s, gate=proposer_gate)
    heap = HeapFreeze()
    try:
        checked, restarted_for = await _preflight(client, spec, restart_container)
        if gateway is not None:
            await gateway.open()
        policy = PolicyBlock(provider=spec.policy.provider, model=spec.policy.model, base_url=endpoints.policy_url,
                             max_tokens=spec.policy.max_tokens, temperature=spec.policy.temperature)
        ctx = RunContext(spec, client, checked.program, policy, proposer, task_info=checked.task_info,
                         rows=checked.rows, observer=observer, max_error_rate=max_error_rate,
                         restart_container=restart_container, gateway=gateway, pools=checked.pools)
        if restored is not None:
            ctx.restore(restored.state)
            started_at = datetime.fromisoformat(restored.started_at)
        else:
            ctx.event("start", f"run {spec.run_id} on {spec.container.name}", algorithm=spec.algorithm.name)
        if restarted_for is not None:
            ctx.restarted_before_start(*restarted_for)
        status, error, stop_reason, best_id, heldout = "done", None, None, ctx.seed_candidate.candidate_id, []
        heap.hold()  # from here the run's own allocations are what the collector walks
        # a fresh run's optimize_s is on the wall budget's clock, which started with the context:
        # a run stopped by max_wall_s records at least max_wall_s
        t_opt = ctx.budget.started if restored is None else time.monotonic()
        t_heldout: float | None = None  # set when heldout re-scoring starts
        timings = {"preflight_s": t_opt - t0, "optimize_s": 0.0}

        async def checkpoint(scores: list[HeldoutScore]) -> None:
            await _save_checkpoint(checkpoints, ctx, restored, RunCheckpoint(
                run_id=spec.run_id, started_at=started_at.isoformat(), stop_reason=stop_reason,
                best_candidate_id=best_id, timings=timings, state={}, heldout=[h.model_dump() for h in scores]))

        try:
            if restored is None:
                result = await optimizer.run(ctx)
                stop_reason, best_id = result.stop_reason, result.best_candidate_id
                timings["optimize_s"] = time.monotonic() - t_opt
                await checkpoint([])
            else:
                stop_reason, best_id, timings = restored.stop_reason, restored.best_candidate_id, dict(restored.timings)
                ctx.event("resumed", f"resumed from its checkpoint: optimization done, {len(restored.heldout)} "
                          "candidate(s) re-scored on heldout", rollouts_recorded=len(ctx.recorder.rollouts))
            t_heldout = time.monotonic()
            heldout = await _score_heldout(ctx, best_id, [HeldoutScore(**h) for h in restored.heldout]
                                           if restored else [], checkpoint)
            ctx.check_error_rate()  # a run whose rows mostly failed is not done, however few it had
        except Exception as exc:  # noqa: BLE001 - whatever ends it, a started run keeps its evidence
            expected = isinstance(exc, (RunFailed, HarnessError))
            if not expected:  # the traceback to the log, with any capability URL in it hidden
                _log.error("run %s raised:\n%s", spec.run_id, hide_capabilities(traceback.format_exc()))
            status, error = "failed", str(exc) if expected else f"{type(exc).__name__}: {exc}"
            if t_heldout is None:  # failed before heldout: it took no time
                t_heldout = time.monotonic()
            if isinstance(exc, RunFailed):
                stop_reason = exc.stop_reason
            if restored is None and not timings["optimize_s"]:  # failed while optimizing
                timings["optimize_s"] = t_heldout - t_opt
            ctx.event("error", str(exc))
        try:
            model_calls, gateway_summary = await _metered_calls(ctx, restored, final=True)
        except HarnessError as exc:  # a run whose calls are not in its evidence is not done
            model_calls, gateway_summary = (restored.model_calls, restored.gateway_summary) if restored else ([], None)
            if status == "done":
                status, error = "failed", f"model calls not recorded: {exc}"
            ctx.event("error", f"model calls not recorded: {exc}")
        ended = time.monotonic()
        error = hide_capabilities(error) if error else error  # it goes to the manifest and the log
        _write(location, ctx, spec, model_calls=model_calls, gateway_summary=gateway_summary, status=status,
               error=error, stop_reason=stop_reason, best_id=best_id,
               heldout=heldout, started_at=started_at, logs=endpoints.logs, node=_node_record(endpoints),
               model_servers=[m.model_dump() for m in endpoints.model_servers],
               timings={**timings, "wall_s": ctx.elapsed() + timings["preflight_s"],
                        "heldout_s": ended - t_heldout})
        if status == "done" or not redo:
            location.swap_into(final_location)
            location = final_location
        if status == "done":
            checkpoints.clear()
    finally:
        heap.release()
        await client.aclose()
        await proposer.aclose()
        if gateway is not None:
            await gateway.close()
    by_id = {h.candidate_id: h for h in heldout}
    seed_id = ctx.seed_candidate.candidate_id
    return RunOutcome(
        run_id=spec.run_id, status=status, evidence_dir=location.shown_dir, stop_reason=stop_reason, error=error,
        seed_candidate_id=seed_id, best_candidate_id=best_id,
        seed_heldout=by_id[seed_id].heldout_score if seed_id in by_id else None,
        best_heldout=by_id[best_id].heldout_score if best_id in by_id else None,
        seed_texts=ctx.seed_candidate.texts, best_texts=ctx.candidate(best_id).texts,
        rollouts=ctx.usage.rollouts, heldout_rollouts=ctx.usage.heldout_rollouts,
        failed_rollouts=ctx.usage.failed_rollouts, seed_heldout_n=by_id[seed_id].heldout_n if seed_id in by_id else None,
        best_heldout_n=by_id[best_id].heldout_n if best_id in by_id else None, tokens=ctx.usage.tokens,
        cost_usd=None if ctx.usage.cost_unknown else ctx.usage.cost_usd, wall_s=time.monotonic() - t0,
        **proposal_counts(ctx.evidence.proposals), logs=tuple(p for p in endpoints.logs if _has_content(p)),
    )


def finished(location: EvidenceLocation) -> bool:
    """Whether the run's directory holds the evidence of a run that is done."""
    try:
        manifest = location.read_manifest()
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("status") == "done"


def proposal_counts(proposals: list[dict[str, Any]]) -> dict[str, int]:
    """Proposals made, those whose text differs from the parent's, and those accepted."""
    return {"proposals": len(proposals), "proposals_changed": sum(bool(p["changed"]) for p in proposals),
            "proposals_accepted": sum(bool(p["accepted"]) for p in proposals)}


async def _preflight(client: ContainerClient, spec: RunSpec, restart: RestartHook | None,
                     ) -> tuple[PreflightResult, tuple[str, bool] | None]:
    """Preflight. A container that refuses the connection (its process died since it was
    started, e.g. while another run of the sweep used it) is restarted through the hook and
    checked again; returns the result and, if the hook was called, the error that called for
    it and whether a new process was started."""
    try:
        return await preflight(client, spec, spec.container.target_modules), None
    except PreflightError as exc:
        if restart is None or not isinstance(exc.__cause__, Unreachable):
            raise
        try:
            restarted = await restart()
        except HarnessError as failed:
            raise PreflightError(f"{exc}; restarting it failed: {failed}") from failed
        return await preflight(client, spec, spec.container.target_modules), (str(exc), restarted)


def _gateway_session(spec: RunSpec, endpoints: Endpoints) -> GatewaySession | None:
    if not (endpoints.gateway_url and endpoints.policy_upstream and endpoints.proposer_upstream):
        return None
    return GatewaySession(endpoints.gateway_url, spec.run_id, policy_upstream=endpoints.policy_upstream,
                          proposer_upstream=endpoints.proposer_upstream, budget_usd=spec.budget.max_cost_usd,
                          admin_token=endpoints.gateway_token)


async def _metered_calls(ctx: RunContext, restored: RunCheckpoint | None, final: bool,
                         ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The run's model calls as the gateway metered them (empty without a gateway), with
    those an earlier process of the run checkpointed. Raises HarnessError when the gateway
    cannot tell."""
    carried = restored.model_calls if restored else []
    carried_summary = restored.gateway_summary if restored else None
    if ctx.gateway is None:
        return carried, carried_summary
    await ctx.sync_spend()
    if final:
        ctx.notify("done")  # the progress line ends on the metered totals
    rows = ctx.gateway.rows(await ctx.gateway.calls())
    return carried + rows, merge_gateway_summaries(carried_summary, ctx.gateway.summary())


async def _save_checkpoint(store: CheckpointStore, ctx: RunContext, restored: RunCheckpoint | None,
                           partial: RunCheckpoint) -> None:
    """Save the run's state; a checkpoint that cannot be written costs a resume, not the run."""
    try:
        calls, summary = await _metered_calls(ctx, restored, final=False)
        store.save(partial.model_copy(update={"state": ctx.snapshot(), "model_calls": calls,
                                              "gateway_summary": summary}))
    except (OSError, HarnessError) as exc:
        ctx.event("checkpoint", f"checkpoint not written: {exc}")


def _write(location: EvidenceLocation, ctx: RunContext, spec: RunSpec, **fields: Any) -> None:
    """All of the run's evidence, or none: a table that cannot be written (disk full) removes
    what was written of this run, so no directory holds some tables and no manifest."""
    try:
        _write_all(location, ctx, spec, **fields)
    except Exception:  # a disk error (HarnessError), or a row that does not fit its table
        try:
            location.clear_partial()
        except OSError:
            pass
        raise


def _write_all(location: EvidenceLocation, ctx: RunContext, spec: RunSpec, *, status: str, error: str | None,
               stop_reason: str | None, best_id: str, heldout: list[HeldoutScore], started_at: datetime,
               timings: dict[str, float], model_calls: list[dict[str, Any]] | None = None,
               gateway_summary: dict[str, Any] | None = None, logs: tuple[str, ...] = (),
               node: dict[str, Any] | None = None, model_servers: list[dict[str, str]] | None = None) -> None:
    ctx.recorder.settle_costs(model_calls or [])
    evidence = ctx.evidence
    location.write_table("rollouts", sorted(evidence.rollouts, key=lambda r: r["seq"]))
    location.write_table("candidates", evidence.candidates)
    location.write_table("proposals", evidence.proposals)
    location.write_table("events", evidence.events)
    location.write_table("model_calls", model_call_rows(model_calls or []))
    usage = ctx.usage
    manifest: dict[str, Any] = {
        "run_id": spec.run_id, "sweep": spec.sweep, "status": status, "error": error, "stop_reason": stop_reason,
        # an object store's URI without its query, which may hold keys
        "spec": spec.model_dump(mode="json") | {"evidence_root": shown(spec.evidence_root)},
        "identity": spec.identity(), "axes": spec.axes,
        "versions": package_versions(), "model_servers": model_servers or [],
        "price_table_version": PRICE_TABLE_VERSION,
        "seeds": {"run": spec.seed},
        # the rows each pool had: a stratified pool's spec holds the window they were chosen from
        "pools_used": ctx.pools.used(),
        "best_candidate_id": best_id, "seed_candidate_id": ctx.seed_candidate.candidate_id,
        "heldout": [h.model_dump() for h in heldout],
        "totals": {
            "rollouts": usage.rollouts, "heldout_rollouts": usage.heldout_rollouts,
            "failed_rollouts": usage.failed_rollouts, "candidates": len(evidence.candidates),
            **proposal_counts(evidence.proposals), "proposer_calls": usage.proposer_calls,
            "policy_prompt_tokens": usage.policy_prompt_tokens,
            "policy_completion_tokens": usage.policy_completion_tokens,
            "proposer_prompt_tokens": usage.proposer_prompt_tokens,
            "proposer_completion_tokens": usage.proposer_completion_tokens,
            "cost_usd": None if usage.cost_unknown else usage.cost_usd,
            "model_calls": len(model_calls or []),
            "prompt_check_misses": gateway_summary["prompt_check_misses"] if gateway_summary else None,
        },
        "gateway": gateway_summary,
        "logs": [path for path in logs if _has_content(path)],  # empty logs are removed when services stop
        # on a cluster: the node whose services the run used, and their endpoints
        "node": node,
        "timings": {**timings, "started_at": started_at.isoformat(),
                    "finished_at": datetime.now(timezone.utc).isoformat()},
    }
    location.write_manifest(manifest)


def _node_record(endpoints: Endpoints) -> dict[str, Any] | None:
    """On a cluster, the node whose services the run used and where they answered (no token)."""
    if endpoints.node is None:
        return None
    return {**endpoints.node.model_dump(), **endpoints.model_dump(include={
        "container_url", "policy_url", "proposer_url", "gateway_url"})}


def _has_content(path: str) -> bool:
    try:
        return Path(path).stat().st_size > 0
    except OSError:
        return False


def run_sync(spec: RunSpec, endpoints: Endpoints, **kwargs: Any) -> RunOutcome:
    """Run ``execute_run`` to its end on an event loop of its own: uvloop's, which costs the
    run process 7-10% less CPU per rollout than asyncio's (benchmarks.perf.overhead), and on
    2 cores the run's CPU is what the container's is short of. Like ``asyncio.run``, Ctrl-C
    cancels the run and whatever is left is cancelled when it returns."""
    return uvloop.run(execute_run(spec, endpoints, **kwargs))
