"""What a page shows, as typed models: the JSON embedded once in the page is a dump of these.
Scores are means over rows with a reward; rows without one (errors) are counted apart, never
averaged in as zeros, so every score comes with the number of rows it rests on."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

NodeStatus = Literal["seed", "accepted", "rejected", "merged", "merge rejected"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Score(Frozen):
    mean: float | None  # None: no row with a reward
    n: int  # rows with a reward
    errors: int = 0  # rows without one (status error or refused)
    expected: int | None = None  # rows of the pool, when the pool is known


class CandidateNode(Frozen):
    candidate_id: str
    index: int
    parent_ids: list[str]
    generation: int
    origin: str
    status: NodeStatus
    is_pick: bool  # the run's own pick (best pareto mean)
    pareto: Score
    heldout: Score | None  # None: not scored on heldout
    minibatch: float | None  # the child's minibatch score when it was judged
    parent_minibatch: float | None
    edit_format: str | None
    rollouts_at_creation: int | None
    modules: dict[str, str]
    diff_vs_parent: list[str]  # keys into RunPayload.diffs, one per parent
    diff_vs_seed: str | None
    proposal_id: str | None
    x: float  # lineage layout: position in its generation's row
    y: int
    label: str  # id, pareto (P) and heldout (H) scores, drawn under the node


class LineageEdge(Frozen):
    edge_id: str
    parent_id: str
    child_id: str
    primary: bool  # the tree edge (first parent); a merge's second parent is not
    x: float
    y: int
    end: int  # 0: the parent's end, 1: the child's


class TracePoint(Frozen):
    rollouts: int  # optimization rollouts spent by then
    score: float
    kind: Literal["minibatch", "pareto", "best so far"]
    series: str  # the legend entry: minibatch points split by accepted or rejected
    candidate_id: str


class ProposalView(Frozen):
    proposal_id: str
    iteration: int | None
    parent_id: str | None
    child_id: str | None
    module: str | None
    edit_format: str | None
    status: str | None
    accepted: bool | None
    changed: bool | None
    parent_minibatch: float | None
    child_minibatch: float | None
    attempts: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    latency_s: float | None
    error: str | None
    screened_out: dict[str, Any]  # reason -> lines dropped by the free screen
    proposer_prompt: list[dict[str, Any]]  # chat messages as sent
    proposer_replies: list[str]
    truncated_replies: int | None
    learned_lines: int | None
    merged_from: list[str]


class HeldoutCell(Frozen):
    reward: float | None  # None: an error row, shown as an error
    status: str
    output: str | None
    feedback: str | None
    error: str | None


class HeldoutRow(Frozen):
    task_id: str
    inputs: str | None
    cells: dict[str, HeldoutCell]  # candidate id -> its rollout on this row


class RunSummary(Frozen):
    run_id: str
    sweep: str | None
    status: str
    stop_reason: str | None
    error: str | None
    container: str | None
    algorithm: str | None
    policy_model: str | None
    proposer_model: str | None
    seed: int | None
    axes: dict[str, str]
    seed_candidate_id: str | None
    pick_candidate_id: str | None
    seed_heldout: Score | None
    pick_heldout: Score | None
    rollouts: int | None  # optimization rollouts
    heldout_rollouts: int | None
    failed_rollouts: int
    cost_usd: float | None  # None: unknown (a model without a price), never zero
    wall_s: float | None
    started_at: str | None
    solved_threshold: float


class RunPayload(Frozen):
    summary: RunSummary
    candidates: list[CandidateNode]
    edges: list[LineageEdge]
    trace: list[TracePoint]
    proposals: list[ProposalView]
    heldout_candidates: list[str]
    heldout_rows: list[HeldoutRow]
    diffs: dict[str, str]  # key -> side-by-side HTML table (difflib)
    manifest: dict[str, Any]  # the manifest as written, less the file digests
    sweep_link: str | None  # relative link back to the sweep page


class SweepRunRow(Frozen):
    run_id: str
    axes: dict[str, str]
    status: str
    error: str | None
    seed_heldout: Score | None
    pick_heldout: Score | None
    best_heldout: Score | None  # best heldout of any scored candidate: test-set selection
    rollouts: int | None
    heldout_rollouts: int | None
    failed_rollouts: int | None
    cost_usd: float | None
    wall_s: float | None
    page: str | None  # relative link to the run's page


class ReportChart(Frozen):
    name: str
    data_uri: str


class SweepPayload(Frozen):
    sweep: str
    path: str
    axes: list[str]
    runs: list[SweepRunRow]
    charts: list[ReportChart]
    summary_md: str | None
