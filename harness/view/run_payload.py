"""One run's evidence -> RunPayload. Only an "ok" row has a reward: error and refused rows
are counted apart and never enter a mean (polars' mean skips nulls)."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from harness.evidence.reader import pools_used
from harness.run_state import OPTIMIZATION_STAGES
from harness.view.diffs import DiffStore
from harness.view.evidence import RunEvidence
from harness.view.lineage import NodeIn, tree_edges, tree_positions
from harness.view.models import (
    CandidateNode,
    HeldoutCell,
    HeldoutRow,
    NodeStatus,
    ProposalView,
    RunPayload,
    RunSummary,
    Score,
    TracePoint,
)

REJECTED_ORIGINS = ("rejected", "library_rejected")


def _rollouts(evidence: RunEvidence) -> pl.DataFrame:
    rows = evidence.tables["rollouts"]
    return rows.with_columns(reward=pl.when(pl.col("status") == "ok").then(pl.col("reward"))).sort("seq")


def _scores(rows: pl.DataFrame, expected: int | None) -> dict[str, Score]:
    """Per candidate: mean reward over rows with one, how many, and how many without."""
    grouped = rows.group_by("candidate_id").agg(
        mean=pl.col("reward").mean(), n=pl.col("reward").is_not_null().sum(), errors=pl.col("reward").is_null().sum())
    return {r["candidate_id"]: Score(mean=r["mean"], n=r["n"], errors=r["errors"], expected=expected)
            for r in grouped.iter_rows(named=True)}


def _status(origin: str, parent_ids: list[str], edit_format: str | None) -> NodeStatus:
    if origin == "seed":
        return "seed"
    rejected = origin in REJECTED_ORIGINS
    if len(parent_ids) > 1 or edit_format == "merge":
        return "merge rejected" if rejected else "merged"
    return "rejected" if rejected else "accepted"


def _json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return default


def _prompt(text: str | None) -> list[dict[str, Any]]:
    """The proposer's chat messages; a prompt that is not a message list is shown as one message."""
    value = _json(text, None)
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return value
    return [{"role": "prompt", "content": text}] if text else []


def proposals(evidence: RunEvidence) -> list[ProposalView]:
    out = []
    for row in evidence.tables["proposals"].iter_rows(named=True):
        screened = _json(row["screened_out_json"], {})
        out.append(ProposalView(
            proposal_id=row["proposal_id"], iteration=row["iteration"], parent_id=row["parent_id"],
            child_id=row["child_id"], module=row["module"], edit_format=row["edit_format"], status=row["status"],
            accepted=row["accepted"], changed=row["changed"], parent_minibatch=row["parent_minibatch_score"],
            child_minibatch=row["child_minibatch_score"], attempts=row["attempts"],
            prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"], cost_usd=row["cost_usd"],
            latency_s=row["latency_s"], error=row["error"],
            screened_out=screened if isinstance(screened, dict) else {"screened": screened},
            proposer_prompt=_prompt(row["proposer_prompt"]), proposer_replies=list(row["proposer_replies"] or []),
            truncated_replies=row["truncated_replies"], learned_lines=row["learned_lines"],
            merged_from=list(row["merged_from"] or [])))
    return out


def _label(candidate_id: str, pareto: Score | None, heldout: Score | None) -> str:
    def fmt(score: Score | None) -> str:
        return "-" if score is None or score.mean is None else f"{score.mean:.2f}"

    return f"{candidate_id}\nP {fmt(pareto)} H {fmt(heldout)}"


def candidates(evidence: RunEvidence, rollouts: pl.DataFrame, by_child: dict[str, ProposalView],
               diffs: DiffStore) -> list[CandidateNode]:
    manifest, pools = evidence.manifest, pools_used(evidence.manifest)
    pareto_pool, heldout_pool = pools.get("pareto"), pools.get("heldout")
    on_pareto = rollouts.filter(pl.col("task_id").is_in(pareto_pool) if pareto_pool is not None
                                else pl.col("stage").is_in(["seed", "pareto"]))
    pareto = _scores(on_pareto, len(pareto_pool) if pareto_pool is not None else None)
    heldout = _scores(rollouts.filter(pl.col("stage") == "heldout"),
                      len(heldout_pool) if heldout_pool is not None else None)
    rows = evidence.tables["candidates"].sort("index").to_dicts()
    nodes_in = [NodeIn(r["candidate_id"], r["index"], list(r["parent_ids"] or []), r["generation"] or 0) for r in rows]
    x = tree_positions(nodes_in)
    texts = {r["candidate_id"]: _json(r["modules_json"], {}) for r in rows}
    seed_id = manifest.get("seed_candidate_id") or (rows[0]["candidate_id"] if rows else None)
    out = []
    for row in rows:
        cid, parents = row["candidate_id"], list(row["parent_ids"] or [])
        proposal = by_child.get(cid)
        vs_parent = [diffs.add(p, texts[p], cid, texts[cid]) for p in parents if p in texts]
        vs_seed = diffs.add(seed_id, texts[seed_id], cid, texts[cid]) if seed_id in texts and cid != seed_id else None
        out.append(CandidateNode(
            candidate_id=cid, index=row["index"], parent_ids=parents, generation=row["generation"] or 0,
            origin=row["origin"], status=_status(row["origin"], parents, proposal.edit_format if proposal else None),
            is_pick=cid == manifest.get("best_candidate_id"),
            pareto=pareto.get(cid, Score(mean=None, n=0, expected=len(pareto_pool) if pareto_pool else None)),
            heldout=heldout.get(cid), minibatch=proposal.child_minibatch if proposal else None,
            parent_minibatch=proposal.parent_minibatch if proposal else None,
            edit_format=proposal.edit_format if proposal else None, rollouts_at_creation=row["rollouts_at_creation"],
            modules=texts[cid], diff_vs_parent=vs_parent, diff_vs_seed=vs_seed,
            proposal_id=proposal.proposal_id if proposal else None, x=x[cid], y=row["generation"] or 0,
            label=_label(cid, pareto.get(cid), heldout.get(cid))))
    return out


def trace(rollouts: pl.DataFrame, nodes: list[CandidateNode]) -> list[TracePoint]:
    """Minibatch scores of children when proposed, pareto scores when a candidate's pareto
    rows were done, and the best pareto mean so far (a step line to the last rollout)."""
    optimizing = rollouts.filter(pl.col("stage").is_in(list(OPTIMIZATION_STAGES))).with_row_index("spent", offset=1)
    spent_at = dict(zip(optimizing["seq"].to_list(), optimizing["spent"].to_list()))
    pareto_stages = optimizing.filter(pl.col("stage").is_in(["seed", "pareto"]))
    last_pareto = dict(pareto_stages.group_by("candidate_id").agg(pl.col("seq").max()).iter_rows())
    points = []
    for node in nodes:
        if node.minibatch is not None and node.rollouts_at_creation is not None:
            verdict = "accepted" if node.status in ("accepted", "merged") else "rejected"
            points.append(TracePoint(rollouts=node.rollouts_at_creation, score=node.minibatch, kind="minibatch",
                                     series=f"minibatch ({verdict})", candidate_id=node.candidate_id))
        if node.pareto.mean is not None and node.candidate_id in last_pareto:
            points.append(TracePoint(rollouts=spent_at[last_pareto[node.candidate_id]], score=node.pareto.mean,
                                     kind="pareto", series="pareto", candidate_id=node.candidate_id))
    best: TracePoint | None = None
    steps = []
    for point in sorted((p for p in points if p.kind == "pareto"), key=lambda p: p.rollouts):
        if best is None or point.score > best.score:
            best = point.model_copy(update={"kind": "best so far", "series": "best so far"})
            steps.append(best)
    if best is not None and optimizing.height > best.rollouts:
        steps.append(best.model_copy(update={"rollouts": optimizing.height}))
    return points + steps


def heldout_rows(evidence: RunEvidence, rollouts: pl.DataFrame) -> tuple[list[str], list[HeldoutRow]]:
    """The heldout-scored candidates (creation order) and one row per heldout task (pool order)."""
    rows = rollouts.filter(pl.col("stage") == "heldout")
    order = {c: i for i, c in enumerate(evidence.tables["candidates"].sort("index")["candidate_id"].to_list())}
    scored = sorted(set(rows["candidate_id"].to_list()), key=lambda c: (order.get(c, len(order)), c))
    pool = pools_used(evidence.manifest).get("heldout") or []
    tasks = list(dict.fromkeys(pool + rows["task_id"].to_list()))
    cells: dict[str, dict[str, HeldoutCell]] = {t: {} for t in tasks}
    inputs: dict[str, str] = {}
    for row in rows.iter_rows(named=True):
        cells[row["task_id"]][row["candidate_id"]] = HeldoutCell(
            reward=row["reward"], status=row["status"], output=row["output"], feedback=row["feedback"],
            error=row["error"])
        if row["inputs"]:
            inputs.setdefault(row["task_id"], row["inputs"])
    return scored, [HeldoutRow(task_id=t, inputs=inputs.get(t), cells=cells[t]) for t in tasks if cells[t]]


def summary(evidence: RunEvidence, nodes: list[CandidateNode]) -> RunSummary:
    manifest = evidence.manifest
    spec, totals, timings = (manifest.get(k) or {} for k in ("spec", "totals", "timings"))
    heldout = {n.candidate_id: n.heldout for n in nodes}
    return RunSummary(
        run_id=str(manifest.get("run_id") or evidence.run_dir.name), sweep=manifest.get("sweep"),
        status=str(manifest.get("status") or "unknown"), stop_reason=manifest.get("stop_reason"),
        error=manifest.get("error"), container=(spec.get("container") or {}).get("name"),
        algorithm=(spec.get("algorithm") or {}).get("name"), policy_model=(spec.get("policy") or {}).get("model"),
        proposer_model=(spec.get("proposer") or {}).get("model"), seed=spec.get("seed"),
        axes={str(k): str(v) for k, v in (manifest.get("axes") or {}).items()},
        seed_candidate_id=manifest.get("seed_candidate_id"), pick_candidate_id=manifest.get("best_candidate_id"),
        seed_heldout=heldout.get(manifest.get("seed_candidate_id")),
        pick_heldout=heldout.get(manifest.get("best_candidate_id")),
        rollouts=totals.get("rollouts"), heldout_rollouts=totals.get("heldout_rollouts"),
        failed_rollouts=int(evidence.tables["rollouts"].filter(pl.col("status") != "ok").height),
        cost_usd=totals.get("cost_usd"), wall_s=timings.get("wall_s"), started_at=timings.get("started_at"),
        solved_threshold=evidence.solved_threshold)


def build_run_payload(evidence: RunEvidence, sweep_link: str | None = None) -> RunPayload:
    rollouts = _rollouts(evidence)
    props = proposals(evidence)
    by_child = {p.child_id: p for p in props if p.child_id}
    diffs = DiffStore()
    nodes = candidates(evidence, rollouts, by_child, diffs)
    edges = tree_edges([NodeIn(n.candidate_id, n.index, n.parent_ids, n.generation) for n in nodes],
                       {n.candidate_id: n.x for n in nodes})
    scored, rows = heldout_rows(evidence, rollouts)
    manifest = {k: v for k, v in evidence.manifest.items() if k != "files"}
    return RunPayload(summary=summary(evidence, nodes), candidates=nodes, edges=edges, trace=trace(rollouts, nodes),
                      proposals=props, heldout_candidates=scored, heldout_rows=rows, diffs=diffs.tables,
                      manifest=manifest, sweep_link=sweep_link)
