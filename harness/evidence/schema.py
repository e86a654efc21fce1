"""The evidence schema. Readers check SCHEMA_VERSION (stored in each file's metadata and
in manifest.json) and refuse other versions with a clear message."""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1"
SCHEMA_METADATA_KEY = b"gepa_harness.schema_version"

ROLLOUTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("seq", pa.int64()),
        ("rollout_id", pa.string()),
        ("candidate_id", pa.string()),
        ("task_id", pa.string()),
        ("split", pa.string()),
        ("stage", pa.string()),
        ("reward", pa.float64()),
        ("status", pa.string()),  # "ok" or "error" (and "refused": never ran); reward is null unless "ok"
        ("container_status", pa.string()),  # the status value the container sent, as sent
        ("error", pa.string()),
        ("error_kind", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("latency_s", pa.float64()),
        ("elapsed_s", pa.float64()),
        ("output", pa.string()),
        ("feedback", pa.string()),
        ("feedback_source", pa.string()),  # actionable_side_info, reward_info.details, summary or trace
        ("inputs", pa.string()),  # what the container says the policy saw
        ("answer_examples_json", pa.string()),  # {answer: [inputs]} the container's feedback cites
    ]
)

CANDIDATES = pa.schema(
    [
        ("run_id", pa.string()),
        ("candidate_id", pa.string()),
        ("index", pa.int64()),
        ("parent_ids", pa.list_(pa.string())),
        ("generation", pa.int64()),
        ("origin", pa.string()),
        ("digest", pa.string()),
        ("modules_json", pa.string()),
        ("rollouts_at_creation", pa.int64()),
        ("cost_usd_at_creation", pa.float64()),
        ("elapsed_s_at_creation", pa.float64()),
    ]
)

PROPOSALS = pa.schema(
    [
        ("run_id", pa.string()),
        ("proposal_id", pa.string()),
        ("iteration", pa.int64()),
        ("parent_id", pa.string()),
        ("child_id", pa.string()),
        ("module", pa.string()),
        ("proposer_model", pa.string()),
        ("edit_format", pa.string()),
        ("attempts", pa.int64()),
        ("status", pa.string()),
        ("changed", pa.bool_()),
        ("accepted", pa.bool_()),
        ("parent_minibatch_score", pa.float64()),
        ("child_minibatch_score", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("latency_s", pa.float64()),
        ("error", pa.string()),
        # what the proposer was asked (JSON chat messages) and its raw replies, so a failed
        # proposal can be inspected; what the free screen dropped, by reason
        ("proposer_prompt", pa.string()),
        ("proposer_replies", pa.list_(pa.string())),
        ("screened_out_json", pa.string()),
        ("truncated_replies", pa.int64()),
        ("learned_lines", pa.int64()),  # learned lines in the child's module
        ("merged_from", pa.list_(pa.string())),  # a merge's two parents
    ]
)

EVENTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("seq", pa.int64()),
        ("elapsed_s", pa.float64()),
        ("kind", pa.string()),
        ("message", pa.string()),
        ("data_json", pa.string()),
    ]
)

# One row per model call through the inference gateway (harness/gateway); empty when the
# gateway is off. cost_usd null: the model is not in the price table (unknown, not zero).
MODEL_CALLS = pa.schema(
    [
        ("run_id", pa.string()),
        ("call_id", pa.string()),  # <scope>#<n>: the n-th call of a rollout or proposer call
        ("rollout_id", pa.string()),
        ("proposal_id", pa.string()),
        ("scope", pa.string()),
        ("role", pa.string()),  # policy | proposer | grader | user_simulator
        ("model", pa.string()),
        ("upstream", pa.string()),
        ("endpoint", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("latency_s", pa.float64()),
        ("cache", pa.string()),  # off | hit | miss | replay
        ("status", pa.string()),  # ok | error | refused | replay_miss
        ("http_status", pa.int64()),
        ("attempts", pa.int64()),
        ("prompt_check", pa.bool_()),  # policy calls: a candidate module text reached the model
        ("digest", pa.string()),
        ("error", pa.string()),
    ]
)

TABLES: dict[str, pa.Schema] = {
    "rollouts": ROLLOUTS,
    "candidates": CANDIDATES,
    "proposals": PROPOSALS,
    "events": EVENTS,
    "model_calls": MODEL_CALLS,
}

# Columns that depend on wall-clock time; everything else is a function of config and model outputs.
TIMING_COLUMNS = frozenset({"latency_s", "elapsed_s", "elapsed_s_at_creation"})
# How a call was served (live, from the store, replayed): not a result either.
TRANSPORT_COLUMNS = frozenset({"cache", "attempts"})


def with_version(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({SCHEMA_METADATA_KEY: SCHEMA_VERSION.encode()})
