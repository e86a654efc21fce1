"""A run's checkpoint between and within its stages. After optimization, and as heldout
re-scoring goes on, the run's state is saved to `<sweep>/.checkpoints/<run_id>.json` (whole,
atomically). A run started again with the same id (a resumed sweep, the same command again)
skips optimization and every (candidate, heldout row) pair the checkpoint holds. The file
goes when the run's evidence is written as done."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, ValidationError

from harness.atomic import atomic_write, drop_dead_temporaries
from harness.evidence.writer import EvidenceLocation

CHECKPOINT_VERSION = 1


class RunCheckpoint(BaseModel):
    # NaN and infinities written as json.dumps writes them, so a checkpoint restores what it saved
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")
    version: int = CHECKPOINT_VERSION
    run_id: str
    started_at: str
    stop_reason: str | None
    best_candidate_id: str
    timings: dict[str, float]  # preflight_s and optimize_s of the process that optimized
    state: dict[str, Any]  # RunContext.snapshot(): usage, evidence tables, counters, clock
    heldout: list[dict[str, Any]] = []  # candidates fully re-scored on heldout (HeldoutScore)
    model_calls: list[dict[str, Any]] = []  # metered by the gateway so far
    gateway_summary: dict[str, Any] | None = None


class CheckpointStore:
    def __init__(self, location: EvidenceLocation, run_id: str):
        self.fs = location.fs
        self.dir = f"{location.sweep_dir}/.checkpoints"
        self.path = f"{self.dir}/{run_id}.json"
        self.run_id = run_id

    def load(self) -> RunCheckpoint | None:
        """The run's checkpoint, or None when there is none or it cannot be used (then it is
        removed: the run starts over, as it would have without one). A run loads its
        checkpoint once, as it starts, when no write of it can be live: the temporaries of
        a process killed while it saved go here."""
        drop_dead_temporaries(self.dir, (f"{self.run_id}.json",), self.fs)
        if self.fs.get_file_info(self.path).type != pafs.FileType.File:
            return None
        try:
            with self.fs.open_input_stream(self.path) as stream:
                checkpoint = RunCheckpoint.model_validate_json(stream.read())
        except (OSError, ValidationError, ValueError):
            checkpoint = None
        if checkpoint is None or checkpoint.version != CHECKPOINT_VERSION or checkpoint.run_id != self.run_id:
            self.clear()
            return None
        return checkpoint

    def save(self, checkpoint: RunCheckpoint) -> None:
        """Raises OSError when it cannot be written; the previous checkpoint stays whole."""
        # pydantic's own serializer: a dump to Python objects and then json.dumps cost six
        # times as much with thousands of rollout rows, on every save
        atomic_write(self.path, checkpoint.model_dump_json(fallback=str).encode(), self.fs)

    def clear(self) -> None:
        try:
            if self.fs.get_file_info(self.path).type == pafs.FileType.File:
                self.fs.delete_file(self.path)
        except OSError:
            pass  # the store is gone: nothing left to resume from


def merge_gateway_summaries(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's `gateway` entry of a resumed run: the metered totals of the process
    that checkpointed plus those of this one (a new gateway session knows only its own)."""
    if before is None or after is None:
        return after or before
    merged = dict(after)
    for key in ("cost_usd", "budgeted_cost_usd", "unknown_cost_calls", "refused", "prompt_check_misses",
                "replay_misses"):
        merged[key] = (before.get(key) or 0) + (after.get(key) or 0)
    roles: dict[str, dict[str, Any]] = {}
    for side in (before.get("by_role") or {}, after.get("by_role") or {}):
        for role, totals in side.items():
            into = roles.setdefault(role, {})
            for name, value in totals.items():
                into[name] = (into.get(name) or 0) + (value or 0) if isinstance(value, (int, float)) else value
    merged["by_role"] = dict(sorted(roles.items()))
    return merged
