"""The run's evidence recorder: the only code that creates or changes rows of the evidence
tables. Rows are typed (harness/evidence/rows.py) and checked when made.

Cost has one source per call: with the inference gateway in the path (`metered`) its
ledger prices every call, so rollout and proposal rows take their cost from the metered
calls once they are known (`settle_costs`, when the run's evidence is written); without
it, the cost the run computed for the call."""

from __future__ import annotations

import json
from typing import Any, Iterable

from harness.candidates import Candidate
from harness.evidence.rows import (
    CandidateRow,
    EventRow,
    ModelCallRow,
    ProposalRow,
    RolloutRow,
    Row,
    make_row,
)
from harness.run_state import Evidence


class Recorder:
    def __init__(self, run_id: str, metered: bool = False):
        self.run_id = run_id
        self.metered = metered
        self.rollouts: list[RolloutRow] = []
        self.candidates: list[CandidateRow] = []
        self.proposals: list[ProposalRow] = []
        self.events: list[EventRow] = []
        self._proposal_seq = 0

    # ---- rows made -------------------------------------------------------------------

    def candidate(self, candidate: Candidate, *, rollouts: int, cost_usd: float | None, elapsed_s: float) -> None:
        self.candidates.append(make_row(CandidateRow, {  # type: ignore[arg-type]
            "run_id": self.run_id, "candidate_id": candidate.candidate_id, "index": candidate.index,
            "parent_ids": list(candidate.parent_ids), "generation": candidate.generation, "origin": candidate.origin,
            "digest": candidate.digest,
            "modules_json": json.dumps(candidate.texts, sort_keys=True, ensure_ascii=False),
            "rollouts_at_creation": rollouts, "cost_usd_at_creation": cost_usd, "elapsed_s_at_creation": elapsed_s,
        }))

    def rollout(self, **fields: Any) -> RolloutRow:
        row = make_row(RolloutRow, {"run_id": self.run_id, **fields,
                                    **({"cost_usd": None} if self.metered else {})})
        self.rollouts.append(row)  # type: ignore[arg-type]
        return row  # type: ignore[return-value]

    def proposal(self, fields: dict[str, Any]) -> str:
        """Add a proposals row; returns its id."""
        proposal_id = f"p{self._proposal_seq:04d}"
        row = make_row(ProposalRow, {**fields, "run_id": self.run_id, "proposal_id": proposal_id,
                                     **({"cost_usd": None} if self.metered else {})})
        self._proposal_seq += 1
        self.proposals.append(row)  # type: ignore[arg-type]
        return proposal_id

    def event(self, kind: str, message: str, elapsed_s: float, data: dict[str, Any]) -> None:
        self.events.append(make_row(EventRow, {  # type: ignore[arg-type]
            "run_id": self.run_id, "seq": len(self.events), "elapsed_s": elapsed_s, "kind": kind,
            "message": message, "data_json": json.dumps(data, sort_keys=True, default=str),
        }))

    # ---- rows changed ----------------------------------------------------------------

    def set_origin(self, candidate_id: str, origin: str) -> None:
        """Mark a candidate after the fact (e.g. a proposal rejected on its minibatch)."""
        self._candidate_row(candidate_id).origin = origin

    def refuse(self, rollout_id: str) -> bool:
        """The gateway refused the rollout's model call (budget): it never ran, so it is
        neither a result nor a failure. Returns whether it had been recorded as failed."""
        row = next(r for r in reversed(self.rollouts) if r.rollout_id == rollout_id)
        failed = row.status != "ok"
        row.status, row.error_kind, row.reward = "refused", "budget", None
        return failed

    def adopt_lineage(self, parents: dict[str, list[str]], origin: str) -> list[dict[str, Any]]:
        """Take another optimizer's candidate tree as the lineage (a library reports its
        parents only at the end): each listed candidate gets `origin` and these parents,
        and every generation follows. Returns the links that changed."""
        changed = []
        for candidate_id, new in parents.items():
            row = self._candidate_row(candidate_id)
            row.origin = origin
            if row.parent_ids != new:
                changed.append({"candidate": candidate_id, "was": list(row.parent_ids), "now": list(new)})
                row.parent_ids = list(new)
        if changed:
            self._recompute_generations()
        return changed

    def settle_costs(self, model_calls: Iterable[dict[str, Any]]) -> None:
        """Cost each rollout and proposal row from the gateway's metered calls (their sum;
        unknown when one of them is). Only under the gateway: otherwise rows have their cost."""
        if not self.metered:
            return
        by_rollout: dict[str, float | None] = {}
        by_proposal: dict[str, float | None] = {}
        for call in model_calls:
            for key, totals in ((call.get("rollout_id"), by_rollout), (call.get("proposal_id"), by_proposal)):
                if key is not None:
                    known = totals.get(key, 0.0)
                    totals[key] = None if known is None or call["cost_usd"] is None else known + call["cost_usd"]
        for rollout in self.rollouts:
            rollout.cost_usd = by_rollout.get(rollout.rollout_id, 0.0)
        for proposal in self.proposals:
            proposal.cost_usd = by_proposal.get(proposal.proposal_id, 0.0)

    def _candidate_row(self, candidate_id: str) -> CandidateRow:
        return next(r for r in self.candidates if r.candidate_id == candidate_id)

    def _recompute_generations(self) -> None:
        by_id = {row.candidate_id: row for row in self.candidates}
        memo: dict[str, int] = {}

        def generation(cid: str, visiting: frozenset[str]) -> int:
            if cid not in memo:
                parents = [p for p in by_id[cid].parent_ids if p in by_id and p not in visiting]
                memo[cid] = 1 + max((generation(p, visiting | {cid}) for p in parents), default=-1)
            return memo[cid]

        for row in self.candidates:
            row.generation = generation(row.candidate_id, frozenset())

    # ---- reading, checkpoint ---------------------------------------------------------

    def last_error(self) -> str:
        return next((r.error for r in reversed(self.rollouts) if r.error), "")

    def evidence(self) -> Evidence:
        """The tables as plain rows, for the writer and the checkpoint."""
        return Evidence(rollouts=_dump(self.rollouts), candidates=_dump(self.candidates),
                        proposals=_dump(self.proposals), events=_dump(self.events))

    def restore(self, evidence: Evidence, proposal_seq: int) -> None:
        self.rollouts = [make_row(RolloutRow, r) for r in evidence.rollouts]  # type: ignore[misc]
        self.candidates = [make_row(CandidateRow, r) for r in evidence.candidates]  # type: ignore[misc]
        self.proposals = [make_row(ProposalRow, r) for r in evidence.proposals]  # type: ignore[misc]
        self.events = [make_row(EventRow, r) for r in evidence.events]  # type: ignore[misc]
        self._proposal_seq = proposal_seq

    @property
    def proposal_seq(self) -> int:
        return self._proposal_seq


def model_call_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gateway's metered calls as checked rows of the model_calls table."""
    return [make_row(ModelCallRow, row).model_dump() for row in rows]


def _dump(rows: list[Any]) -> list[dict[str, Any]]:
    return [row.model_dump() for row in rows]


__all__ = ["Recorder", "Row", "model_call_rows"]
