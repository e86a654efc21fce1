"""Places a sweep's runs on Ray: where each run goes (one machine, or the node with room
on a cluster, each node with its own service set), a bounded number in flight, a run whose
worker dies retried once, a run whose node is lost moved to a live node, and the index row
that records each. A run whose worker died after its evidence was in place is done, from
its manifest."""

from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console

from harness.config import HarnessConfig
from harness.console import SweepStatus
from harness.container_keeper import RestartOutcome
from harness.errors import HarnessError
from harness.evidence.writer import EvidenceLocation
from harness.run import RunOutcome
from harness.services import Endpoints, Services
from harness.specs import RunSpec
from harness.sweep.store import SweepStore
from harness.tracking.hooks import ExportNote
from harness.tracking.settings import MlflowTarget


class PlannedRun(BaseModel):
    model_config = ConfigDict(frozen=True)
    spec: RunSpec
    max_error_rate: float


def index_row(spec: RunSpec, status: str, outcome: RunOutcome | None, attempts: int) -> dict[str, Any]:
    axes = spec.axes
    return {
        "run_id": spec.run_id, "status": status, "error": outcome.error if outcome else None,
        "evidence_dir": outcome.evidence_dir if outcome and outcome.evidence_dir else None,
        "axes_json": json.dumps(axes, sort_keys=True), "container": spec.container.name,
        "policy": axes.get("policy", spec.policy.model), "proposer": axes.get("proposer", spec.proposer.model),
        "algorithm": spec.algorithm.name, "seed": spec.seed, "attempts": attempts,
        "rollouts": outcome.rollouts if outcome else None,
        "failed_rollouts": outcome.failed_rollouts if outcome else None, "wall_s": outcome.wall_s if outcome else None,
        "seed_heldout": outcome.seed_heldout if outcome else None,
        "best_heldout": outcome.best_heldout if outcome else None,
        "identity_json": json.dumps(spec.identity(), sort_keys=True, default=str),
    }


def recorded_results(manifest: dict[str, Any]) -> dict[str, Any]:
    """The index columns of a run done earlier, from its manifest, so a resumed sweep's
    table shows every run's results, not blanks for those it skipped."""
    heldout = {h["candidate_id"]: h["heldout_score"] for h in manifest.get("heldout") or []}
    return {"rollouts": (manifest.get("totals") or {}).get("rollouts"),
            "failed_rollouts": (manifest.get("totals") or {}).get("failed_rollouts"),
            "wall_s": (manifest.get("timings") or {}).get("wall_s"),
            "seed_heldout": heldout.get(manifest.get("seed_candidate_id")),
            "best_heldout": heldout.get(manifest.get("best_candidate_id"))}


def done_manifest(location: EvidenceLocation) -> dict[str, Any] | None:
    """The run's manifest if its evidence in place is done (unreadable: not done)."""
    try:
        manifest = location.read_manifest()
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("status") == "done" else None


def manifest_row(run_id: str, manifest: dict[str, Any], evidence_dir: str) -> dict[str, Any] | None:
    """The index row of a run an earlier invocation finished, from its manifest alone: for
    an index that has no row of it (one written before indexes kept earlier runs' rows).
    None when the manifest records no spec that reads as a RunSpec today."""
    try:
        spec = RunSpec.model_validate(manifest.get("spec") or {})
    except ValidationError:
        return None
    return index_row(spec, str(manifest.get("status") or "failed"), None, 0) | recorded_results(manifest) | {
        "run_id": run_id, "evidence_dir": evidence_dir, "error": manifest.get("error"), "attempts": None,
        "identity_json": json.dumps(manifest.get("identity") or spec.identity(), sort_keys=True, default=str)}


def ray_address(address: str | None) -> str | None:
    """`ray.address: null` starts a local Ray for this sweep. Left to Ray, None would join
    whatever cluster `ray start` last recorded on this machine; RAY_ADDRESS still wins."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        return "local"
    return address


def start_services(services: Services, todo: list[PlannedRun], rows: dict[str, dict[str, Any]]) -> dict[str, Endpoints]:
    """Endpoints of every run whose services start; a run whose container or model cannot
    start is recorded failed with the cause (each broken combination is tried once)."""
    broken: dict[tuple[str, ...], str] = {}
    endpoints: dict[str, Endpoints] = {}
    for run in todo:
        spec = run.spec
        key = tuple(s.model_dump_json() for s in (spec.container, spec.policy, spec.proposer))
        if key not in broken:
            try:
                endpoints[spec.run_id] = services.endpoints(spec.container, spec.policy, spec.proposer)
                continue
            except Exception as exc:  # noqa: BLE001 - recorded in the index, the sweep goes on
                broken[key] = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
        outcome = RunOutcome(run_id=spec.run_id, status="failed", evidence_dir="", error=broken[key])
        rows[spec.run_id] = index_row(spec, "failed", outcome, 0)
    return endpoints


def run_on_cluster(todo: list[PlannedRun], base: HarnessConfig, store: SweepStore, rows: dict[str, dict[str, Any]],
                   console: Console, worker_cls: Any, **scheduling: Any) -> None:
    """Start a service set on every node, then run `todo` on the nodes whose services started."""
    import ray

    from harness.sweep.limits import EndpointLimiter
    from harness.sweep.nodes import ClusterPlacement, ServiceSetOptions, pinned
    from harness.sweep.worker import SweepBoard

    options = ServiceSetOptions(evidence_root=base.evidence_root, sweep=store.sweep, local_server=base.local_server,
                                gateway=base.gateway if base.gateway.enabled else None)
    placement = ClusterPlacement(options, base.ray.cpus_per_run)
    try:
        console.print(f"starting a service set on each of {len(placement.places)} nodes: "
                      f"{', '.join(p.label for p in placement.places.values())} ...", highlight=False)
        for run_id, error in placement.start([r.spec for r in todo]).items():
            spec = next(r.spec for r in todo if r.spec.run_id == run_id)
            rows[run_id] = index_row(spec, "failed", RunOutcome(run_id=run_id, status="failed", evidence_dir="",
                                                                 error=error), 0)
        store.write_index(list(rows.values()))
        todo = [r for r in todo if rows[r.spec.run_id]["status"] != "failed"]
        if todo:
            # the sweep's own actors stay on the driver's node: they must outlive any other node
            here = pinned(ray.get_runtime_context().get_node_id())
            limiter = EndpointLimiter.options(**here).remote(endpoint_limits(base, placement.endpoints()))
            board = SweepBoard.options(**here).remote()
            schedule(todo, placement, limiter, board, base, store, rows, store.log_dir, console, worker_cls,
                     **scheduling)
    finally:
        placement.close()


def endpoint_limits(base: HarnessConfig, endpoints: Any) -> dict[str, int]:
    limits: dict[str, int] = {}
    for e in endpoints:
        limits[e.limit_key(e.container_url)] = base.ray.container_concurrency
        limits[e.limit_key(e.policy_url)] = base.ray.model_concurrency
        limits[e.limit_key(e.proposer_url)] = base.ray.model_concurrency
    return limits


def schedule(todo: list[PlannedRun], placement: Any, limiter: Any, board: Any,
              base: HarnessConfig, store: SweepStore, rows: dict[str, dict[str, Any]], log_dir: Path,
              console: Console, worker_cls: Any, revive: Callable[[str], bool] | None = None,
              live_usage: Callable[[], str] | None = None, tracking: MlflowTarget | None = None,
              notes: dict[str, ExportNote] | None = None) -> None:
    """Run `todo` on actors of `worker_cls`, a bounded number in flight, each where
    `placement` puts it (a ClusterPlacement, or on one machine the endpoints per run id).
    A run whose worker dies is retried once on a fresh actor; a run whose node is lost
    moves to a live node without using up that retry. Between waits, restart the
    containers that runs found dead (`revive`, from the Services that started them)."""
    import ray
    from ray.exceptions import RayActorError, RayError, WorkerCrashedError

    from harness.sweep.nodes import LocalPlacement, Slot

    if isinstance(placement, Mapping):
        placement = LocalPlacement(placement, log_dir, int(ray.cluster_resources().get("CPU", 0)
                                                            // base.ray.cpus_per_run))
    queue = list(todo)
    driver = (socket.gethostname(), os.getpid())  # workers on this host stop when this process is gone
    attempts: dict[str, int] = {}
    # a run's done evidence before its first attempt (a forced redo's), told apart from
    # what an attempt of this sweep swapped in by the manifest's list of file digests
    files_before: dict[str, Any] = {}
    crashes: dict[str, int] = {}
    moved: dict[str, list[str]] = {}  # run id -> nodes it was lost on
    in_flight: dict[Any, tuple[PlannedRun, Any, Slot]] = {}
    idle: dict[str, list[Any]] = {}
    width = min(base.ray.max_runs_in_flight, len(todo))
    started = time.monotonic()

    def holder(run_id: str) -> str:
        return f"{run_id}#{attempts[run_id]}"

    def submit(run: PlannedRun) -> bool:
        busy = Counter(slot.node for _, _, slot in in_flight.values())
        slot = placement.assign(run.spec, busy)
        if slot is None:
            return False
        pool = idle.setdefault(slot.node, [])
        actor = pool.pop() if pool else worker_cls.options(num_cpus=base.ray.cpus_per_run,
                                                           **slot.actor_options).remote()
        attempts[run.spec.run_id] = attempts.get(run.spec.run_id, 0) + 1
        if run.spec.run_id not in files_before:
            files_before[run.spec.run_id] = (done_manifest(store.run_location(run.spec.run_id)) or {}).get("files")
        extra = {"node_services": slot.node_services} if slot.node_services is not None else {}
        ref = actor.run.remote(run.spec.model_dump_json(), slot.endpoints.model_dump_json(), limiter, board,
                               slot.log_dir, run.max_error_rate, holder=holder(run.spec.run_id), force=base.force,
                               driver=driver, tracking=tracking.model_dump_json() if tracking else None, **extra)
        in_flight[ref] = (run, actor, slot)
        rows[run.spec.run_id] |= {"status": "running", **_node_fields(slot, moved.get(run.spec.run_id), placement)}
        return True

    def unplaceable(run: PlannedRun) -> None:
        lost = ", ".join(placement.label(n) for n in moved.get(run.spec.run_id, []))
        error = "no live node has its services" + (f" (lost on {lost})" if lost else "")
        outcome = RunOutcome(run_id=run.spec.run_id, status="failed", evidence_dir="", error=error)
        rows[run.spec.run_id] = index_row(run.spec, "failed", outcome, attempts.get(run.spec.run_id, 0))

    counts = run_counts(rows)
    restarts = RestartDesk(board, revive, console)
    with SweepStatus(console, status_line(counts, {}, started), counts, every_s=base.progress_every_s) as live, \
            restarts:
        while queue or in_flight:
            for run in [r for r in queue if not placement.placeable(r.spec)]:  # its nodes are all gone
                queue.remove(run)
                unplaceable(run)
            submitted = False
            while queue and len(in_flight) < width and submit(queue[0]):
                queue.pop(0)
                submitted = True
            if submitted:
                store.write_index(list(rows.values()))  # who runs where, while it runs
            if not in_flight:
                continue
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            restarts.poll()
            for ref in ready:
                run, actor, slot = in_flight.pop(ref)
                run_id = run.spec.run_id
                try:
                    outcome = RunOutcome.model_validate_json(ray.get(ref))
                    if slot.node in idle:  # else its node was lost after the run finished: the actor went with it
                        idle[slot.node].append(actor)
                except (RayActorError, WorkerCrashedError) as exc:
                    # the worker died holding endpoint slots: give them back, or the limits shrink for good
                    limiter.release_holder.remote(holder(run_id))
                    node_lost = placement.lost(slot.node, exc)  # the whole node went
                    if node_lost:
                        idle.pop(slot.node, None)
                    finished = done_manifest(store.run_location(run_id))
                    if finished is not None and finished.get("files") != files_before[run_id]:
                        # it died after the run's evidence was in place: the run is done, not to redo
                        results = {k: v for k, v in recorded_results(finished).items() if v is not None}
                        outcome = RunOutcome(run_id=run_id, status="done",
                                             evidence_dir=store.run_location(run_id).shown_dir, **results)
                    elif node_lost:  # the run moves
                        moved.setdefault(run_id, []).append(slot.node)
                        queue.insert(0, run)
                        continue
                    else:
                        crashes[run_id] = crashes.get(run_id, 0) + 1
                        if crashes[run_id] < 2:  # the worker died: retry once on a fresh actor
                            queue.insert(0, run)
                            continue
                        outcome = RunOutcome(run_id=run_id, status="failed", evidence_dir="",
                                             error=f"worker died twice: {type(exc).__name__}")
                except RayError as exc:  # the run raised past the worker's own handler: that run fails
                    limiter.release_holder.remote(holder(run_id))
                    outcome = RunOutcome(run_id=run_id, status="failed", evidence_dir="", error=_ray_error(exc))
                rows[run_id] = index_row(run.spec, outcome.status, outcome, attempts[run_id]) | _node_fields(
                    slot, moved.get(run_id), placement)
                store.write_index(list(rows.values()))
                if outcome.tracking is not None and notes is not None:
                    notes[run_id] = outcome.tracking
            counts = run_counts(rows)
            status = status_line(counts, ray.get(board.snapshot.remote()), started)
            live.update(status + (live_usage() if live_usage else ""), counts)


def _node_fields(slot: Any, lost_on: list[str] | None, placement: Any) -> dict[str, Any]:
    """The index's record of where a run ran, and the nodes it was lost on before."""
    node = slot.endpoints.node
    return {"node_id": node.node_id if node else None, "node_host": node.host if node else None,
            "moved_from": ",".join(placement.label(n) for n in lost_on) if lost_on else None}


class RestartDesk:
    """The runs' requests to restart a container, served off the driver's loop: a restart
    takes as long as the container's start (for one that hangs, its whole startup wait),
    and meanwhile the loop goes on collecting finished runs and starting new ones. One
    restart at a time (Services.revive takes them in turn anyway); a request made while its
    container restarts is served after that, when revive finds the new process answering.
    Containers it restarts get their parent-death signal from its thread, which lives until
    the desk closes, as the sweep's services do."""

    def __init__(self, board: Any, revive: Callable[[str], bool] | None, console: Console):
        self._board, self._revive, self._console = board, revive, console
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="container-restart")
        self._abandoned = False  # the loop left on an error: nobody waits for an answer (Ray may be down)

    def __enter__(self) -> "RestartDesk":
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        # at the loop's end no run waits on a restart; on Ctrl-C (or an error) what is queued
        # goes, and one under way stops when the services close and its process with them
        self._abandoned = kind is not None
        self._pool.shutdown(wait=kind is None, cancel_futures=kind is not None)

    def poll(self) -> None:
        import ray

        for url, ticket in ray.get(self._board.take_restarts.remote()):  # each request once
            self._pool.submit(self._serve, url, ticket)

    def _serve(self, url: str, ticket: int) -> None:
        import ray

        try:
            if self._revive is None:
                outcome = RestartOutcome(error=f"container at {url} stopped answering; this sweep cannot restart "
                                               "containers")
            else:
                outcome = RestartOutcome.of(self._revive, url)
                if self._abandoned:
                    return
                if outcome.restarted:
                    self._console.print(f"restarted the container at {url}: it had stopped answering",
                                        highlight=False)
            ray.get(self._board.restart_done.remote(url, ticket, outcome.model_dump_json()))
        except Exception as exc:  # noqa: BLE001 - on this thread nobody would see it
            error = f"could not answer the restart request for {url}: {type(exc).__name__}: {exc}"
            self._console.print(error, style="yellow", highlight=False, markup=False)
            # the board hands a request out once: answered with the error, its runs fail now
            # instead of waiting out their restart timeout (unless the board is what failed)
            with suppress(Exception):
                ray.get(self._board.restart_done.remote(url, ticket, RestartOutcome(error=error).model_dump_json()))


def _ray_error(exc: Exception) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def run_counts(rows: dict[str, dict[str, Any]]) -> str:
    """The runs by status, e.g. `3 done, 2 running, 1 pending`."""
    counts = Counter(row["status"] for row in rows.values())
    return ", ".join(f"{counts[s]} {s}" for s in ("done", "running", "failed", "pending", "skipped") if counts[s])


def status_line(counts: str, board: dict[str, Any], started: float) -> str:
    """The sweep's one-line status: the runs by status (`run_counts`), then the board's totals."""
    elapsed = time.monotonic() - started
    rate = board.get("rollouts", 0) / elapsed if elapsed > 0 else 0.0
    return (f"runs: {counts} | {rate:.1f} rollouts/s | {board.get('tokens', 0):,} tokens | "
            f"{time.strftime('%H:%M:%S', time.gmtime(elapsed))}")
