"""The Ray actor that executes runs, one at a time, with per-run log files and
throttled progress reports to the sweep's board."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from harness.container_keeper import RestartHook, RestartOutcome
from harness.context import Progress
from harness.errors import HarnessError
from harness.evidence.writer import EvidenceLocation
from harness.run import RunOutcome, run_sync
from harness.services import Endpoints
from harness.specs import RunSpec
from harness.sweep.limits import shared_gate
from harness.tracking.hooks import export_finished
from harness.tracking.settings import MlflowTarget


@ray.remote(num_cpus=0)
class SweepBoard:
    """Live counters for the whole sweep, polled by the driver; and the runs' requests to
    restart a container that died (the driver owns the processes and serves them)."""

    def __init__(self) -> None:
        self._rollouts: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._running: set[str] = set()
        # container restarts asked for by runs, done by the driver (it owns the processes)
        self._restart_asked: dict[str, int] = {}  # url -> last ticket handed out
        self._restart_taken: dict[str, int] = {}  # url -> newest ticket the driver took to serve
        # url -> (ticket served, RestartOutcome JSON) of each restart, in order: a ticket's
        # answer is that of the first restart served at or after it (the one that covered it)
        self._restart_done: dict[str, list[tuple[int, str]]] = {}

    def started(self, run_id: str) -> None:
        self._running.add(run_id)

    def update(self, run_id: str, rollouts: int, tokens: int) -> None:
        self._rollouts[run_id] = rollouts
        self._tokens[run_id] = tokens

    def finished(self, run_id: str) -> None:
        self._running.discard(run_id)

    def request_restart(self, url: str) -> int:
        """A run found the container at `url` not answering; returns a ticket to wait on."""
        self._restart_asked[url] = self._restart_asked.get(url, 0) + 1
        return self._restart_asked[url]

    def take_restarts(self) -> list[tuple[str, int]]:
        """(url, newest ticket) of every container asked for since the driver last took it:
        each request is handed out once, so one the driver is still serving, or has served
        and not yet answered here, is not served twice (a later request is: it may find the
        restarted container answering)."""
        taken = [(url, ticket) for url, ticket in self._restart_asked.items()
                 if ticket > self._restart_taken.get(url, 0)]
        self._restart_taken.update(taken)
        return taken

    def restart_done(self, url: str, ticket: int, outcome_json: str) -> None:
        self._restart_done.setdefault(url, []).append((ticket, outcome_json))

    def restart_status(self, url: str, ticket: int) -> str | None:
        """The RestartOutcome (JSON) of the request holding `ticket`; None until it is served.
        Not a later restart's: the run whose request started a new process is told so, even
        if a request made meanwhile found that process answering."""
        return next((outcome for served, outcome in self._restart_done.get(url, ()) if served >= ticket), None)

    def snapshot(self) -> dict[str, Any]:
        return {"running": len(self._running), "rollouts": sum(self._rollouts.values()),
                "tokens": sum(self._tokens.values())}


def board_restarter(board: Any, url: str, timeout_s: float) -> RestartHook:
    """The restart hook of a run on a worker: ask the driver, through the board, to start
    the container at `url` again, and wait for the answer."""

    async def restart() -> bool:
        ticket = await board.request_restart.remote(url)
        deadline = time.monotonic() + timeout_s
        while (outcome := await board.restart_status.remote(url, ticket)) is None:
            if time.monotonic() > deadline:
                raise HarnessError(f"the sweep driver did not restart {url} within {timeout_s:.0f}s")
            await asyncio.sleep(0.25)
        return RestartOutcome.model_validate_json(outcome).restarted_or_raise()

    return restart


def node_restarter(node_services: Any, url: str) -> RestartHook:
    """The restart hook of a run on a cluster: its node's service set owns the container."""

    async def restart() -> bool:
        return RestartOutcome.model_validate_json(await node_services.revive.remote(url)).restarted_or_raise()

    return restart


_watched: set[int] = set()


def watch_driver(host: str, pid: int, every_s: float = 0.5) -> None:
    """End this worker process when the sweep's driver (on this host) is gone: a driver
    killed with SIGKILL cannot stop Ray's workers, and one left behind would go on
    finishing a run whose gateway and containers died with the driver. Its run's
    evidence stays unfinished (staged, no manifest), so the next invocation redoes it."""
    if host != socket.gethostname() or pid in _watched:
        return
    _watched.add(pid)

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass  # alive (a process we may not signal)
            time.sleep(every_s)

    threading.Thread(target=watch, name="driver-watch", daemon=True).start()


def _run_logger(log_path: Path) -> logging.Logger:
    logger = logging.getLogger(f"harness.run.{log_path.stem}")
    _close_handlers(logger)  # an earlier attempt's, in this process
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def _close_handlers(logger: logging.Logger) -> None:
    """Close the run log: a long-lived worker runs many runs, each with its own open file."""
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)


@ray.remote
class RunWorker:
    def run(self, spec_json: str, endpoints_json: str, limiter: Any, board: Any, log_dir: str,
            max_error_rate: float, holder: str | None = None, force: bool = False,
            driver: tuple[str, int] | None = None, tracking: str | None = None,
            node_services: Any = None) -> str:
        if driver is not None:
            watch_driver(*driver)
        spec = RunSpec.model_validate_json(spec_json)
        run_log = Path(log_dir) / f"{spec.run_id}.log"
        endpoints = Endpoints.model_validate_json(endpoints_json)
        endpoints = endpoints.model_copy(update={"logs": (str(run_log), *endpoints.logs)})
        logger = _run_logger(run_log)
        logger.info("run %s start: axes %s, worker pid %d", spec.run_id, spec.axes, os.getpid())
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
        rollout_gate = shared_gate(limiter, endpoints.limit_key(endpoints.container_url),
                                   endpoints.limit_key(endpoints.policy_url), holder=holder)
        proposer_gate = shared_gate(limiter, endpoints.limit_key(endpoints.proposer_url), holder=holder)
        try:
            # the driver may wait out a live but silent process, then start a new one
            revive_s = 2 * spec.container.startup_timeout_s + 60
            restart = (node_restarter(node_services, endpoints.container_url) if node_services is not None
                       else board_restarter(board, endpoints.container_url, revive_s))
            outcome = run_sync(spec, endpoints, observer=observe, max_error_rate=max_error_rate,
                               rollout_gate=rollout_gate, proposer_gate=proposer_gate,
                               restart_container=restart, force=force)
        except Exception as exc:  # recorded in the index; the sweep goes on
            logger.exception("run %s failed before it could write evidence", spec.run_id)
            outcome = RunOutcome(run_id=spec.run_id, status="failed", evidence_dir="", error=f"{type(exc).__name__}: {exc}")
        finally:
            board.finished.remote(spec.run_id)
            # a gate cancelled while it waited (the run's loop cancels what is left) may still
            # get its slot in the limiter afterwards: give back whatever this attempt holds
            try:
                ray.get(limiter.release_holder.remote(holder))
            except ray.exceptions.RayError:
                logger.warning("run %s: could not release its endpoint slots", spec.run_id)
        logger.info("run %s %s: %s", spec.run_id, outcome.status, outcome.error or outcome.stop_reason)
        if tracking is not None and outcome.evidence_dir:  # the evidence is final: this process exports it
            # the evidence in place: a redo that failed left the previous, done, evidence there
            in_place = EvidenceLocation(spec.evidence_root, spec.sweep, spec.run_id).run_dir
            note = export_finished(MlflowTarget.model_validate_json(tracking), in_place)
            (logger.info if note.ok else logger.warning)("%s", note.message)
            outcome = outcome.model_copy(update={"tracking": note})
        _close_handlers(logger)
        return outcome.model_dump_json()
