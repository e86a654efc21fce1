"""The evidence recorder: its typed rows agree with harness/evidence/schema.py column for
column, what it records is a valid table of that schema, a row with a wrong column or
value is refused with a one-line error, and the changes it makes after the fact (refusal,
origin, a library's lineage, metered cost) are the only ones."""

from __future__ import annotations

import types
import typing
from typing import Any

import pyarrow as pa
import pytest

from harness.candidates import Candidate
from harness.evidence.recorder import Recorder, model_call_rows
from harness.evidence.rows import ROW_MODELS, RowError
from harness.evidence.schema import TABLES

ARROW_OF = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type a row field's annotation stands for (optional: the same type, nullable)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        assert len(args) == 1, annotation
        return arrow_type(args[0])
    if origin is typing.Annotated:  # a checked or cleaned type (ErrorText): its base type
        return arrow_type(args[0])
    if origin is typing.Literal:
        return ARROW_OF[type(args[0])]
    if origin is list:
        return pa.list_(arrow_type(args[0]))
    return ARROW_OF[annotation]


@pytest.mark.parametrize("table", sorted(TABLES))
def test_row_models_agree_with_the_schema(table: str) -> None:
    fields = ROW_MODELS[table].model_fields
    assert list(fields) == TABLES[table].names
    for name, info in fields.items():
        assert arrow_type(info.annotation) == TABLES[table].field(name).type, f"{table}.{name}"


def candidate(index: int, parents: tuple[str, ...] = (), generation: int = 0) -> Candidate:
    return Candidate(candidate_id=f"c{index:04d}", index=index, texts={"system": f"text {index}"},
                     parent_ids=parents, generation=generation, origin="proposal" if parents else "seed")


def rollout_fields(seq: int, status: str = "ok", **changes: Any) -> dict[str, Any]:
    return {"seq": seq, "rollout_id": f"r-c0000-train:{seq}", "candidate_id": "c0000", "task_id": f"train:{seq}",
            "split": "train", "stage": "seed", "reward": 1.0 if status == "ok" else None, "status": status,
            "container_status": "ok", "error": None if status == "ok" else "boom", "error_kind": None,
            "prompt_tokens": 10, "completion_tokens": 2, "cost_usd": 0.001, "latency_s": 0.1, "elapsed_s": 1.0,
            "output": "x", "feedback": "", "feedback_source": None, "inputs": None, **changes}


def filled_recorder(metered: bool = False) -> Recorder:
    recorder = Recorder("run1", metered=metered)
    recorder.candidate(candidate(0), rollouts=0, cost_usd=0.0, elapsed_s=0.0)
    recorder.candidate(candidate(1, ("c0000",), 1), rollouts=2, cost_usd=None, elapsed_s=1.5)
    recorder.rollout(**rollout_fields(0))
    recorder.rollout(**rollout_fields(1, status="error"))
    recorder.proposal({"iteration": 0, "parent_id": "c0000", "child_id": "c0001", "status": "changed",
                       "changed": True, "accepted": False, "cost_usd": 0.002, "proposer_replies": ["a"]})
    recorder.event("start", "run run1", 0.0, {"algorithm": "gepa"})
    return recorder


def test_recorded_rows_make_tables_of_the_schema() -> None:
    evidence = filled_recorder().evidence()
    for table, rows in (("rollouts", evidence.rollouts), ("candidates", evidence.candidates),
                        ("proposals", evidence.proposals), ("events", evidence.events)):
        written = pa.Table.from_pylist(rows, schema=TABLES[table])
        assert written.num_rows == len(rows) > 0 and written.to_pylist() == rows
    assert evidence.proposals[0]["proposal_id"] == "p0000" and evidence.proposals[0]["module"] is None
    assert evidence.events[0]["data_json"] == '{"algorithm": "gepa"}'


def test_a_wrong_column_is_refused_with_one_line() -> None:
    recorder = Recorder("run1")
    with pytest.raises(RowError) as unknown:
        recorder.rollout(**rollout_fields(0), rewrd=1.0)
    with pytest.raises(RowError) as wrong_type:
        recorder.rollout(**rollout_fields(0, prompt_tokens="many"))
    with pytest.raises(RowError) as bad_status:
        recorder.rollout(**rollout_fields(0, status="done"))
    for exc, column in ((unknown, "rewrd"), (wrong_type, "prompt_tokens"), (bad_status, "status")):
        message = str(exc.value)
        assert "\n" not in message and message.startswith("rollouts row refused") and repr(column) in message
    with pytest.raises(RowError, match="proposals row refused: column 'acepted'"):
        recorder.proposal({"acepted": True})
    with pytest.raises(RowError, match="model_calls row refused"):
        model_call_rows([{"call_id": "x#0"}])
    assert recorder.rollouts == [] and recorder.proposals == []


def test_a_row_cannot_be_changed_to_a_wrong_value() -> None:
    recorder = filled_recorder()
    with pytest.raises(ValueError):
        recorder.rollouts[0].status = "maybe"  # type: ignore[assignment]


def test_a_refused_rollout_is_neither_result_nor_failure() -> None:
    recorder = filled_recorder()
    assert recorder.refuse("r-c0000-train:1") is True  # it had been recorded as failed
    assert recorder.refuse("r-c0000-train:0") is False
    rows = recorder.evidence().rollouts
    assert [(r["status"], r["error_kind"], r["reward"]) for r in rows] == [("refused", "budget", None)] * 2


def test_a_librarys_lineage_is_adopted_and_generations_follow() -> None:
    recorder = filled_recorder()
    recorder.candidate(candidate(2, ("c0001",), 2), rollouts=4, cost_usd=0.0, elapsed_s=2.0)
    recorder.set_origin("c0001", "rejected")
    changed = recorder.adopt_lineage({"c0001": ["c0000"], "c0002": ["c0000"]}, origin="library")
    assert changed == [{"candidate": "c0002", "was": ["c0001"], "now": ["c0000"]}]
    rows = {r["candidate_id"]: r for r in recorder.evidence().candidates}
    assert [(rows[c]["origin"], rows[c]["generation"]) for c in ("c0000", "c0001", "c0002")] == [
        ("seed", 0), ("library", 1), ("library", 1)]


def test_metered_cost_comes_from_the_gateways_calls_once() -> None:
    recorder = filled_recorder(metered=True)
    assert [r.cost_usd for r in recorder.rollouts] == [None, None]  # not priced by the run
    assert recorder.proposals[0].cost_usd is None
    recorder.settle_costs([
        {"rollout_id": "r-c0000-train:0", "proposal_id": None, "cost_usd": 0.25},
        {"rollout_id": "r-c0000-train:0", "proposal_id": None, "cost_usd": 0.5},  # e.g. a grader's call
        {"rollout_id": "r-c0000-train:1", "proposal_id": None, "cost_usd": None},  # unknown model
        {"rollout_id": None, "proposal_id": "p0000", "cost_usd": 0.125},
    ])
    assert [r.cost_usd for r in recorder.rollouts] == [0.75, None]
    assert recorder.proposals[0].cost_usd == 0.125


def test_unmetered_rows_keep_the_runs_cost() -> None:
    recorder = filled_recorder(metered=False)
    recorder.settle_costs([{"rollout_id": "r-c0000-train:0", "proposal_id": "p0000", "cost_usd": 9.0}])
    assert [r.cost_usd for r in recorder.rollouts] == [0.001, 0.001] and recorder.proposals[0].cost_usd == 0.002


def test_restore_takes_up_a_snapshot() -> None:
    recorder = filled_recorder()
    restored = Recorder("run1")
    restored.restore(recorder.evidence(), recorder.proposal_seq)
    assert restored.evidence() == recorder.evidence()
    assert restored.proposal({}) == "p0001"
