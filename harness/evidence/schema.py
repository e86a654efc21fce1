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
        ("status", pa.string()),
        ("error", pa.string()),
        ("error_kind", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("latency_s", pa.float64()),
        ("elapsed_s", pa.float64()),
        ("output", pa.string()),
        ("feedback", pa.string()),
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

TABLES: dict[str, pa.Schema] = {
    "rollouts": ROLLOUTS,
    "candidates": CANDIDATES,
    "proposals": PROPOSALS,
    "events": EVENTS,
}

# Columns that depend on wall-clock time; everything else is a function of config and model outputs.
TIMING_COLUMNS = frozenset({"latency_s", "elapsed_s", "elapsed_s_at_creation"})


def with_version(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({SCHEMA_METADATA_KEY: SCHEMA_VERSION.encode()})
