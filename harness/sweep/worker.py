"""The Ray actor that executes runs, one at a time, with per-run log files and
throttled progress reports to the sweep's board."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from harness.context import Progress
from harness.run import RunOutcome, execute_run
from harness.services import Endpoints
from harness.specs import RunSpec
from harness.sweep.limits import shared_gate


@ray.remote(num_cpus=0)
class SweepBoard:
    """Live counters for the whole sweep, polled by the driver."""

    def __init__(self) -> None:
        self._rollouts: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._running: set[str] = set()

    def started(self, run_id: str) -> None:
        self._running.add(run_id)

    def update(self, run_id: str, rollouts: int, tokens: int) -> None:
        self._rollouts[run_id] = rollouts
        self._tokens[run_id] = tokens

    def finished(self, run_id: str) -> None:
        self._running.discard(run_id)

    def snapshot(self) -> dict[str, Any]:
        return {"running": len(self._running), "rollouts": sum(self._rollouts.values()),
                "tokens": sum(self._tokens.values())}


def _run_logger(log_path: Path) -> logging.Logger:
    logger = logging.getLogger(f"harness.run.{log_path.stem}")
    logger.handlers.clear()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


@ray.remote
class RunWorker:
    def run(self, spec_json: str, endpoints_json: str, limiter: Any, board: Any, log_dir: str,
            max_error_rate: float, holder: str | None = None) -> str:
        spec = RunSpec.model_validate_json(spec_json)
        endpoints = Endpoints.model_validate_json(endpoints_json)
        logger = _run_logger(Path(log_dir) / f"{spec.run_id}.log")
        logger.info("run %s start: axes %s", spec.run_id, spec.axes)
        last = [0.0, ""]

        def observe(progress: Progress) -> None:
            now = time.monotonic()
            if now - last[0] >= 1.0 or progress.stage != last[1]:
                last[0], last[1] = now, progress.stage
                board.update.remote(spec.run_id, progress.rollouts, progress.tokens)
                logger.info("%s: %d/%d rollouts, best %s, %d tokens", progress.stage, progress.rollouts,
                            progress.budget, progress.best_score, progress.tokens)

        board.started.remote(spec.run_id)
        # one holder name for this attempt: the driver frees its slots if this process dies
        holder = holder or f"{spec.run_id}-{uuid.uuid4().hex[:8]}"
        rollout_gate = shared_gate(limiter, endpoints.container_url, endpoints.policy_url, holder=holder)
        proposer_gate = shared_gate(limiter, endpoints.proposer_url, holder=holder)
        try:
            outcome = asyncio.run(execute_run(spec, endpoints, observer=observe, max_error_rate=max_error_rate,
                                              rollout_gate=rollout_gate, proposer_gate=proposer_gate))
        except Exception as exc:  # recorded in the index; the sweep goes on
            logger.exception("run %s failed before it could write evidence", spec.run_id)
            outcome = RunOutcome(run_id=spec.run_id, status="failed", evidence_dir="", error=f"{type(exc).__name__}: {exc}")
        finally:
            board.finished.remote(spec.run_id)
            # a gate cancelled while it waited (asyncio.run cancels what is left) may still
            # get its slot in the limiter afterwards: give back whatever this attempt holds
            try:
                ray.get(limiter.release_holder.remote(holder))
            except ray.exceptions.RayError:
                logger.warning("run %s: could not release its endpoint slots", spec.run_id)
        logger.info("run %s %s: %s", spec.run_id, outcome.status, outcome.error or outcome.stop_reason)
        return outcome.model_dump_json()
