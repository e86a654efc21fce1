"""Typed rows of the evidence tables, one model per table of harness/evidence/schema.py
(tests/test_recorder.py proves the two agree column for column). A row with a column the
schema does not have, or a value of the wrong type, is refused when it is made."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from harness.errors import hide_capabilities

# error text a container or a model endpoint wrote may name a gateway capability URL
ErrorText = Annotated[str, AfterValidator(hide_capabilities)]


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RolloutRow(Row):
    run_id: str
    seq: int
    rollout_id: str
    candidate_id: str
    task_id: str
    split: str
    stage: str
    reward: float | None
    status: Literal["ok", "error", "refused"]  # refused: never ran (budget); reward is null unless ok
    container_status: str | None = None
    error: ErrorText | None
    error_kind: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    latency_s: float
    elapsed_s: float
    output: str | None = None
    feedback: str | None = None
    feedback_source: str | None = None
    inputs: str | None = None
    answer_examples_json: str | None = None


class CandidateRow(Row):
    run_id: str
    candidate_id: str
    index: int
    parent_ids: list[str]
    generation: int
    origin: str
    digest: str
    modules_json: str
    rollouts_at_creation: int
    cost_usd_at_creation: float | None
    elapsed_s_at_creation: float


class ProposalRow(Row):
    run_id: str
    proposal_id: str
    iteration: int | None = None
    parent_id: str | None = None
    child_id: str | None = None
    module: str | None = None
    proposer_model: str | None = None
    edit_format: str | None = None
    attempts: int | None = None
    status: str | None = None
    changed: bool | None = None
    accepted: bool | None = None
    parent_minibatch_score: float | None = None
    child_minibatch_score: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    error: ErrorText | None = None
    proposer_prompt: str | None = None
    proposer_replies: list[str] | None = None
    screened_out_json: str | None = None
    truncated_replies: int | None = None
    learned_lines: int | None = None
    merged_from: list[str] | None = None


class EventRow(Row):
    run_id: str
    seq: int
    elapsed_s: float
    kind: str
    message: ErrorText
    data_json: str


class ModelCallRow(Row):
    run_id: str | None
    call_id: str
    rollout_id: str | None
    proposal_id: str | None
    scope: str | None
    role: str
    model: str | None
    upstream: str | None
    endpoint: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    latency_s: float | None
    cache: str
    status: str
    http_status: int | None
    attempts: int
    prompt_check: bool | None
    digest: str | None
    error: ErrorText | None


ROW_MODELS: dict[str, type[Row]] = {
    "rollouts": RolloutRow,
    "candidates": CandidateRow,
    "proposals": ProposalRow,
    "events": EventRow,
    "model_calls": ModelCallRow,
}


class RowError(ValueError):
    """A row that does not fit its table; the message is one line naming the column."""


def make_row(model: type[Row], fields: dict[str, object]) -> Row:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise RowError(f"{table_of(model)} row refused: {one_line(exc)}") from None


def one_line(exc: ValidationError) -> str:
    first = exc.errors()[0]
    column = ".".join(str(part) for part in first["loc"]) or "row"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"column {column!r}: {first['msg']}{more}"


def table_of(model: type[Row]) -> str:
    return next(name for name, row_model in ROW_MODELS.items() if row_model is model)
