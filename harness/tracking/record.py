"""A finished run's evidence folder as what a tracker records: parameters, tags, metric
points, candidate texts, files. Read from the evidence files only (manifest.json and the
Parquet tables), so exporting at the end of a run and exporting afterwards are one path.

Metrics (the report's names, benchmarks/report/metrics.py, where they overlap):

- ``pareto_score``: each candidate scored on the whole pareto pool (the seed, then every
  accepted child), its mean reward over the rows with a reward, at step = optimization
  rollouts spent when its last pareto row was started (rows ordered by ``seq``);
  ``best_pareto_score``: the running maximum at the same steps.
- ``minibatch_child_score`` / ``minibatch_parent_score``: each proposal's minibatch means
  (proposals.parquet), at the step its child's minibatch was rolled out.
- at step = the run's optimization rollouts: ``seed_heldout``, ``pick_heldout`` (the run's
  own pick, chosen on pareto), ``pick_lift`` = pick - seed, ``best_heldout`` (max over the
  candidates re-scored on heldout: test-set selection), ``lift`` = best - seed,
  ``pick_pareto_score``, their row counts, and the manifest's totals and timings
  (rollouts, failures, proposals, tokens, ``cost_usd`` when known, ``wall_s``, ...).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict

from harness.errors import HarnessError
from harness.evidence.reader import pools_used
from harness.evidence.writer import MANIFEST
from harness.run_state import OPTIMIZATION_STAGES

# Bumped when what an export records changes, so that re-exporting replaces older exports.
EXPORT_FORMAT = "1"
# a name made of these words holds a secret's value, unless its last word is `env` (it then
# names the variable the value is read from, which is what the spec holds)
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials"})
TOTALS = ("rollouts", "heldout_rollouts", "failed_rollouts", "candidates", "proposals", "proposals_changed",
          "proposals_accepted", "proposer_calls", "model_calls", "policy_prompt_tokens", "policy_completion_tokens",
          "proposer_prompt_tokens", "proposer_completion_tokens", "cost_usd", "prompt_check_misses")
TIMINGS = ("wall_s", "preflight_s", "optimize_s", "heldout_s")


class ExportError(HarnessError):
    """Evidence that cannot be exported, or a tracker that refused it; one line."""


class MetricPoint(BaseModel):
    model_config = ConfigDict(frozen=True)
    key: str
    value: float
    step: int
    timestamp_ms: int


class RunRecord(BaseModel):
    """Everything an export of one run logs, independent of the tracker."""

    model_config = ConfigDict(frozen=True)
    run_id: str
    sweep: str
    status: str  # the harness's: done | failed
    run_name: str
    run_dir: str
    started_ms: int
    finished_ms: int
    params: dict[str, str]
    tags: dict[str, str]
    metrics: tuple[MetricPoint, ...]
    # artifact folder (best_candidate, seed_candidate) -> module id -> text
    candidate_texts: dict[str, dict[str, str]]
    description: str  # markdown, shown on the tracker's run page
    evidence_files: tuple[str, ...]  # manifest.json and the tables, as the run wrote them
    log_files: tuple[str, ...]  # the run's logs that still exist
    digest: str  # of the manifest (which holds every table's sha256) and EXPORT_FORMAT


def run_dirs(path: str | Path) -> list[Path]:
    """The run folders under `path`: the run itself (it holds manifest.json), or every run
    of a sweep folder. Unfinished runs (no manifest) are not runs yet."""
    root = Path(path)
    if (root / MANIFEST).is_file():
        return [root]
    if not root.is_dir():
        raise ExportError(f"{root}: no such run or sweep folder")
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file())
    if not found:
        raise ExportError(f"{root}: neither a run folder (manifest.json) nor a sweep folder with finished runs")
    return found


def read_run(run_dir: str | Path) -> RunRecord:
    """The record of one run; ExportError when its evidence is unreadable or was changed
    after the run wrote it (the tables' sha256 against the manifest's)."""
    from harness.evidence.reader import EvidenceError, read_manifest, verify_files

    folder = Path(run_dir).resolve()
    try:
        manifest = read_manifest(folder)
        if manifest is None:
            raise ExportError(f"{folder}: no manifest.json: the run has not finished")
        verify_files(folder, manifest)
        rollouts = pl.read_parquet(folder / "rollouts.parquet",
                                   columns=["seq", "candidate_id", "task_id", "stage", "reward", "status", "elapsed_s"])
        candidates = pl.read_parquet(folder / "candidates.parquet", columns=["candidate_id", "modules_json"])
        proposals = pl.read_parquet(folder / "proposals.parquet", columns=[
            "proposal_id", "child_id", "parent_minibatch_score", "child_minibatch_score"])
    except EvidenceError as exc:
        raise ExportError(str(exc)) from exc
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise ExportError(f"{folder}: unreadable evidence: {str(exc).splitlines()[0]}") from exc
    try:
        return _record(folder, manifest, rollouts, candidates, proposals)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a manifest that is JSON but not a run's
        raise ExportError(f"{folder}: malformed evidence: {type(exc).__name__}: {exc}") from exc


def _record(folder: Path, manifest: dict[str, Any], rollouts: pl.DataFrame, candidates: pl.DataFrame,
            proposals: pl.DataFrame) -> RunRecord:
    spec = manifest.get("spec") or {}
    timings = manifest.get("timings") or {}
    started_ms = _ms(timings.get("started_at"))
    finished_ms = _ms(timings.get("finished_at"), default=started_ms)
    texts = _texts(candidates)
    picks = {"best_candidate": manifest.get("best_candidate_id"), "seed_candidate": manifest.get("seed_candidate_id")}
    return RunRecord(
        run_id=str(manifest["run_id"]), sweep=str(manifest.get("sweep") or folder.parent.name),
        status=str(manifest.get("status")), run_name=_run_name(manifest), run_dir=str(folder),
        started_ms=started_ms, finished_ms=finished_ms,
        params=spec_params(spec, pools_used(manifest)) | {f"versions.{k}": str(v) for k, v in (manifest.get("versions") or {}).items()},
        tags=_tags(manifest, folder),
        metrics=tuple(progress_points(rollouts, proposals, tuple(pools_used(manifest).get("pareto") or ()),
                                      started_ms) + summary_points(manifest, finished_ms)),
        candidate_texts={folder_name: texts[cid] for folder_name, cid in picks.items() if cid in texts},
        description=_description(manifest, folder),
        evidence_files=tuple(str(folder / name) for name in [MANIFEST, *sorted(manifest.get("files") or {})]),
        log_files=tuple(p for p in manifest.get("logs") or [] if Path(p).is_file()),
        digest=hashlib.sha256((folder / MANIFEST).read_bytes() + EXPORT_FORMAT.encode()).hexdigest(),
    )


# ---------------------------------------------------------------- parameters


def spec_params(spec: dict[str, Any], used: dict[str, list[str]] | None = None) -> dict[str, str]:
    """The resolved spec, flattened to dotted keys. Pools are long id lists: each is logged
    compactly (`train:0-59`) with its size, as the run used it (`used`: `pools_used`; a
    stratified pool's spec holds the window it was chosen from, logged beside it). The spec
    holds key variable *names* only; any other value under a secret-sounding key, or after
    such a command-line flag, is redacted."""
    spec = dict(spec)
    pools = spec.pop("pools", None) or {}
    params = _flatten(spec, "")
    for name in ("train", "pareto", "heldout"):
        ids = (used or pools).get(name) or []
        params[f"pools.{name}"] = compact_ids(ids)
        params[f"pools.{name}_count"] = str(len(ids))
    for name, strata in (pools.get("stratify") or {}).items():
        params[f"pools.{name}_stratified_by"] = str(strata.get("field"))
        params[f"pools.{name}_window"] = compact_ids(pools.get(name) or [])
    if "allow_overlap" in pools:
        params["pools.allow_overlap"] = _text(pools["allow_overlap"])
    return params


def _flatten(value: Any, prefix: str) -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            leaf = str(key)
            if _secret_name(leaf) and not isinstance(item, (dict, type(None))):
                out[name] = "<redacted>"
            elif leaf == "command" and isinstance(item, list):
                out[name] = json.dumps(_redact_command([str(a) for a in item]))
            else:
                out.update(_flatten(item, name))
        return out
    return {prefix: _text(value)}


def _redact_command(args: list[str]) -> list[str]:
    """`--api-key VALUE` / `--token=VALUE` -> redacted; `--api-key-env NAME` names a variable and stays."""
    out: list[str] = []
    redact_next = False
    for arg in args:
        flag, eq, _ = arg.partition("=")
        secret_flag = arg.startswith("-") and _secret_name(flag)
        if redact_next and not arg.startswith("-"):
            out.append("<redacted>")
        elif secret_flag and eq:
            out.append(f"{flag}=<redacted>")
        else:
            out.append(arg)
        redact_next = secret_flag and not eq
    return out


def _secret_name(name: str) -> bool:
    words = re.split(r"[-_.]+", name.lower().strip("-"))
    return bool(SECRET_WORDS.intersection(words)) and words[-1] != "env"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def compact_ids(ids: list[str]) -> str:
    """`train:0..59` style ranges of consecutive indexes, in the pool's order."""
    parts: list[str] = []
    run: list[tuple[str, int]] = []

    def close() -> None:
        if run:
            split, first = run[0]
            parts.append(f"{split}:{first}" if len(run) == 1 else f"{split}:{first}-{run[-1][1]}")
            run.clear()

    for task_id in ids:
        split, _, index = str(task_id).rpartition(":")
        if not index.isdigit():
            close()
            parts.append(str(task_id))
            continue
        if run and (run[-1][0] != split or run[-1][1] + 1 != int(index)):
            close()
        run.append((split, int(index)))
    close()
    return ",".join(parts)


# ---------------------------------------------------------------- metrics


def progress_points(rollouts: pl.DataFrame, proposals: pl.DataFrame, pareto_ids: tuple[str, ...],
                    started_ms: int) -> list[MetricPoint]:
    """The run's curves, at step = optimization rollouts spent (rows in `seq` order):
    `pareto_score` of each candidate scored on the whole pareto pool (as run.py's
    _pareto_score: every pareto row present, mean over the rows with a reward) and the
    running `best_pareto_score`, when its last pareto row started; and each proposal's
    `minibatch_child_score` / `minibatch_parent_score` when the child's minibatch started."""
    optimization = (rollouts.sort("seq").filter(pl.col("stage").is_in(sorted(OPTIMIZATION_STAGES)))
                    .with_columns(spent=pl.int_range(1, pl.len() + 1, dtype=pl.Int64)))
    points: list[MetricPoint] = []

    def point(key: str, value: float, step: int, elapsed_s: float | None) -> None:
        at = started_ms + int(round((elapsed_s or 0.0) * 1000))
        points.append(MetricPoint(key=key, value=value, step=step, timestamp_ms=at))

    if pareto_ids:
        scored = (optimization.filter(pl.col("task_id").is_in(list(pareto_ids)))
                  .group_by("candidate_id")
                  .agg(tasks=pl.col("task_id").n_unique(), step=pl.col("spent").max(),
                       elapsed_s=pl.col("elapsed_s").max(), score=pl.col("reward").filter(pl.col("status") == "ok").mean())
                  .filter(pl.col("tasks") == len(set(pareto_ids)), pl.col("score").is_not_null())
                  .sort("step", "candidate_id")
                  .with_columns(best=pl.col("score").cum_max()))
        for row in scored.iter_rows(named=True):
            point("pareto_score", row["score"], row["step"], row["elapsed_s"])
            point("best_pareto_score", row["best"], row["step"], row["elapsed_s"])
    minibatches = (optimization.filter(pl.col("stage") == "minibatch")
                   .group_by("candidate_id").agg(step=pl.col("spent").max(), elapsed_s=pl.col("elapsed_s").max()))
    judged = (proposals.join(minibatches, left_on="child_id", right_on="candidate_id")
              .sort("step", "proposal_id"))
    for row in judged.iter_rows(named=True):
        for key, column in (("minibatch_child_score", "child_minibatch_score"),
                            ("minibatch_parent_score", "parent_minibatch_score")):
            if row[column] is not None:
                point(key, row[column], row["step"], row["elapsed_s"])
    return points


def summary_points(manifest: dict[str, Any], at_ms: int) -> list[MetricPoint]:
    """One value each, at step = the run's optimization rollouts; a value the run does not
    have (no heldout score for a failed run, an unknown cost) is left out, never zero."""
    totals = manifest.get("totals") or {}
    timings = manifest.get("timings") or {}
    heldout = {h.get("candidate_id"): h for h in manifest.get("heldout") or []}
    seed = heldout.get(manifest.get("seed_candidate_id")) or {}
    pick = heldout.get(manifest.get("best_candidate_id")) or {}
    scores = [h["heldout_score"] for h in heldout.values() if h.get("heldout_score") is not None]
    values: dict[str, Any] = {
        "seed_heldout": seed.get("heldout_score"), "seed_heldout_n": seed.get("heldout_n"),
        "pick_heldout": pick.get("heldout_score"), "pick_heldout_n": pick.get("heldout_n"),
        "pick_pareto_score": pick.get("pareto_score"), "best_heldout": max(scores) if scores else None,
    }
    if values["seed_heldout"] is not None and values["pick_heldout"] is not None:
        values["pick_lift"] = values["pick_heldout"] - values["seed_heldout"]
    if values["seed_heldout"] is not None and values["best_heldout"] is not None:
        values["lift"] = values["best_heldout"] - values["seed_heldout"]
    values.update({name: totals.get(name) for name in TOTALS})
    values.update({name: timings.get(name) for name in TIMINGS})
    step = int(totals.get("rollouts") or 0)
    return [MetricPoint(key=k, value=float(v), step=step, timestamp_ms=at_ms) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]


# ---------------------------------------------------------------- tags, texts, names


def _tags(manifest: dict[str, Any], folder: Path) -> dict[str, str]:
    spec = manifest.get("spec") or {}
    tags = {
        "harness.run_id": str(manifest["run_id"]), "harness.sweep": str(manifest.get("sweep")),
        "harness.status": str(manifest.get("status")), "harness.stop_reason": str(manifest.get("stop_reason")),
        "harness.container": str((spec.get("container") or {}).get("name")),
        "harness.algorithm": str((spec.get("algorithm") or {}).get("name")),
        "harness.policy_model": str((spec.get("policy") or {}).get("model")),
        "harness.proposer_model": str((spec.get("proposer") or {}).get("model")),
        "harness.seed": str(spec.get("seed")), "harness.evidence_dir": str(folder),
        "harness.seed_candidate_id": str(manifest.get("seed_candidate_id")),
        "harness.best_candidate_id": str(manifest.get("best_candidate_id")),
        **{f"axis.{k}": str(v) for k, v in sorted((manifest.get("axes") or {}).items())},
    }
    if manifest.get("error"):
        tags["harness.error"] = str(manifest["error"])[:4000]
    return tags


def _texts(candidates: pl.DataFrame) -> dict[str, dict[str, str]]:
    return {row["candidate_id"]: json.loads(row["modules_json"]) for row in candidates.iter_rows(named=True)}


def _run_name(manifest: dict[str, Any]) -> str:
    """Container, algorithm, the sweep's other axis values, seed, and the id's head."""
    spec = manifest.get("spec") or {}
    axes = manifest.get("axes") or {}
    parts = [str(axes.get("container") or (spec.get("container") or {}).get("name")),
             str(axes.get("algorithm") or (spec.get("algorithm") or {}).get("name"))]
    parts += [str(v) for k, v in sorted(axes.items()) if k not in ("container", "algorithm", "seed")]
    return "-".join([*parts, f"seed{spec.get('seed')}", str(manifest["run_id"])[:8]])


def _description(manifest: dict[str, Any], folder: Path) -> str:
    spec = manifest.get("spec") or {}
    totals = manifest.get("totals") or {}
    heldout = {h.get("candidate_id"): h for h in manifest.get("heldout") or []}
    seed = heldout.get(manifest.get("seed_candidate_id")) or {}
    pick = heldout.get(manifest.get("best_candidate_id")) or {}

    def score(h: dict[str, Any]) -> str:
        value = h.get("heldout_score")
        return "n/a" if value is None else f"{value:.3f}"

    lines = [
        f"**{manifest.get('status')}** (stop: {manifest.get('stop_reason')}): "
        f"{(spec.get('algorithm') or {}).get('name')} on {(spec.get('container') or {}).get('name')}, "
        f"policy {(spec.get('policy') or {}).get('model')}, proposer {(spec.get('proposer') or {}).get('model')}, "
        f"seed {spec.get('seed')}",
        f"heldout: seed {score(seed)} -> run's pick {score(pick)} ({pick.get('heldout_n', 0)} rows); "
        f"{totals.get('rollouts')} optimization + {totals.get('heldout_rollouts')} heldout rollouts, "
        f"{totals.get('failed_rollouts')} failed; {totals.get('proposals')} proposals, "
        f"{totals.get('proposals_accepted')} accepted",
        f"evidence: `{folder}` (harness run `{manifest.get('run_id')}`)",
    ]
    if manifest.get("error"):
        lines.append(f"error: {str(manifest['error'])[:500]}")
    return "\n\n".join(lines)


def _ms(iso: Any, default: int = 0) -> int:
    try:
        return int(datetime.fromisoformat(str(iso)).timestamp() * 1000)
    except ValueError:
        return default
