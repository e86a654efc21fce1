"""Runs a sweep: start shared services once, skip finished runs, schedule the rest on
Ray actors with a bounded number in flight, record every run in the index, and end with
a table of runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from harness.config import HarnessConfig
from harness.errors import ConfigError, HarnessError
from harness.run import RunOutcome
from harness.services import Endpoints, Services
from harness.specs import RunSpec
from harness.sweep.expand import SweepSpec
from harness.sweep.store import SweepStore
from harness.tracking.hooks import ExportNote, export_finished, open_target, ui_hint
from harness.tracking.settings import MlflowTarget


class PlannedRun(BaseModel):
    model_config = ConfigDict(frozen=True)
    spec: RunSpec
    max_error_rate: float


def _index_row(spec: RunSpec, status: str, outcome: RunOutcome | None, attempts: int) -> dict[str, Any]:
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
    }


def _recorded_results(manifest: dict[str, Any]) -> dict[str, Any]:
    """The index columns of a run done earlier, from its manifest, so a resumed sweep's
    table shows every run's results, not blanks for those it skipped."""
    heldout = {h["candidate_id"]: h["heldout_score"] for h in manifest.get("heldout") or []}
    return {"rollouts": (manifest.get("totals") or {}).get("rollouts"),
            "failed_rollouts": (manifest.get("totals") or {}).get("failed_rollouts"),
            "wall_s": (manifest.get("timings") or {}).get("wall_s"),
            "seed_heldout": heldout.get(manifest.get("seed_candidate_id")),
            "best_heldout": heldout.get(manifest.get("best_candidate_id"))}


def _parity(runs: list[PlannedRun]) -> dict[str, Any]:
    """What a reader needs to check that arms were compared fairly."""
    specs = [r.spec for r in runs]
    return {
        "seeds": sorted({s.seed for s in specs}),
        "budgets": sorted({s.budget.model_dump_json() for s in specs}),
        "policies": sorted({s.policy.model for s in specs}),
        "proposers": sorted({s.proposer.model for s in specs}),
        "heldout_ids": {s.container.name: list(s.pools.heldout) for s in specs},
        "concurrency": sorted({s.concurrency for s in specs}),
        "heldout_candidates": sorted({str(s.heldout_candidates) for s in specs}),
    }


def run_sweep(sweep: SweepSpec, runs: list[PlannedRun], base: HarnessConfig, console: Console) -> int:
    import ray

    from harness.pricing import PRICE_TABLE_VERSION
    from harness.sweep.limits import EndpointLimiter
    from harness.sweep.worker import RunWorker, SweepBoard

    store = SweepStore(base.evidence_root, sweep.name)
    store.check_writable()
    # before any run: a missing extra or a store that does not open is one line; a new SQLite
    # store is created here once, not by several workers at the same time
    tracking = open_target(base.tracking, base.evidence_root, sweep.name)
    if tracking is not None:
        console.print(f"tracking: MLflow experiment {tracking.experiment!r} at {tracking.uri}", highlight=False,
                      markup=False, soft_wrap=True)
    log_dir = store.log_dir
    thresholds = {r.spec.container.name: r.spec.container.solved_threshold for r in runs
                  if r.spec.container.solved_threshold is not None}
    store.write_sweep({"sweep": sweep.model_dump(), "grid": [{"run_id": r.spec.run_id, **r.spec.axes} for r in runs],
                       "parity": _parity(runs), "price_table_version": PRICE_TABLE_VERSION,
                       "solved_thresholds": dict(sorted(thresholds.items()))})
    rows: dict[str, dict[str, Any]] = {}
    todo: list[PlannedRun] = []
    for run in runs:
        manifest = store.run_location(run.spec.run_id).read_manifest()
        if manifest is not None and manifest.get("status") == "done" and not base.force:
            rows[run.spec.run_id] = _index_row(run.spec, "skipped", None, 0) | {
                "evidence_dir": store.run_location(run.spec.run_id).run_dir, **_recorded_results(manifest)}
        else:
            rows[run.spec.run_id] = _index_row(run.spec, "pending", None, 0)
            todo.append(run)
    store.write_index(list(rows.values()))
    console.print(f"sweep {sweep.name}: {len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run",
                  highlight=False)
    notes: dict[str, ExportNote] = {}
    if not todo:
        _print_table(console, rows, store.dir, log_dir)
        _export_skipped(tracking, rows, notes)
        _print_tracking(console, tracking, notes)
        _write_summary(store.dir, console)  # an earlier invocation may have stopped before it
        return 0
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    on_sigterm = signal.getsignal(signal.SIGTERM)
    address = _ray_address(base.ray.address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 ignore_reinit_error=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = "start a local Ray" if address == "local" else f"join the Ray cluster at {address}"
        raise HarnessError(f"cannot {where}: {str(exc).splitlines()[0]}") from exc
    # ray.init installs its own SIGTERM handler (exit with a stack dump); keep the entry
    # point's, which takes the Ctrl-C path and says so
    if on_sigterm is not None:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        cpus = ray.cluster_resources().get("CPU", 0)
        if base.ray.cpus_per_run > cpus:
            raise ConfigError(f"ray.cpus_per_run={base.ray.cpus_per_run} exceeds the cluster's {cpus:g} CPUs: "
                              "no run could ever be scheduled")
        if base.ray.address is not None:  # a cluster: a service set on every node that takes runs
            _run_on_cluster(todo, base, store, rows, console, RunWorker, tracking=tracking, notes=notes)
        else:
            with Services(log_dir, base.local_server, gateway=base.gateway, label=sweep.name) as services:
                console.print("starting shared containers and model servers ...", highlight=False)
                endpoints = _start_services(services, todo, rows)
                if len(endpoints) < len(todo):  # a service that cannot start fails its runs, not the sweep
                    store.write_index(list(rows.values()))
                    todo = [r for r in todo if r.spec.run_id in endpoints]
                if todo:
                    limiter = EndpointLimiter.remote(_limits(base, endpoints.values()))
                    board = SweepBoard.remote()
                    _schedule(todo, endpoints, limiter, board, base, store, rows, log_dir, console, RunWorker,
                              revive=services.revive,
                              live_usage=_live_usage(services) if base.gateway.live_usage else None,
                              tracking=tracking, notes=notes)
    finally:
        ray.shutdown()
    _print_table(console, rows, store.dir, log_dir)
    _export_skipped(tracking, rows, notes)
    _print_tracking(console, tracking, notes)
    _write_summary(store.dir, console)
    return 0 if all(r["status"] in ("done", "skipped") for r in rows.values()) else 1


def _export_skipped(tracking: MlflowTarget | None, rows: dict[str, dict[str, Any]],
                    notes: dict[str, ExportNote]) -> None:
    """Runs skipped as done were finished by an earlier invocation, perhaps without
    tracking: the driver exports them (one exported before is left as it is)."""
    if tracking is None:
        return
    for run_id, row in rows.items():
        if row["status"] == "skipped" and row.get("evidence_dir"):
            notes[run_id] = export_finished(tracking, row["evidence_dir"])


def _print_tracking(console: Console, tracking: MlflowTarget | None, notes: dict[str, ExportNote]) -> None:
    if tracking is None:
        return
    exported = sum(note.ok for note in notes.values())
    for run_id, note in sorted(notes.items()):
        if not note.ok:
            console.print(f"run {run_id[:8]}: {note.message}", style="yellow", highlight=False, markup=False,
                          soft_wrap=True)
    console.print(f"tracking: {exported} of {len(notes)} finished runs in MLflow experiment {tracking.experiment!r} "
                  f"({tracking.uri}); {ui_hint(tracking)}", highlight=False, markup=False, soft_wrap=True)


def _write_summary(sweep_dir: str, console: Console) -> None:
    """Every sweep ends with its summary; a report problem is reported, not fatal."""
    from harness.evidence.reader import EvidenceError
    from harness.evidence.summary import summary_writer

    write_report = summary_writer()
    if write_report is None:
        console.print("report not written: no report is installed (pip install -e .)", style="yellow",
                      highlight=False, markup=False)
        return
    try:
        paths = write_report(sweep_dir)
    except EvidenceError as exc:
        console.print(f"report not written: {exc}", style="yellow", highlight=False)
        return
    except Exception as exc:  # noqa: BLE001 - the runs' evidence is complete; the summary can be regenerated
        console.print(f"report not written: {type(exc).__name__}: {exc} (regenerate: python -m benchmarks.report "
                      f"{sweep_dir})", style="yellow", highlight=False, markup=False)
        return
    console.print(f"summary: {paths.report_dir}/summary.md (regenerate: python -m benchmarks.report {sweep_dir})",
                  highlight=False)


def _ray_address(address: str | None) -> str | None:
    """`ray.address: null` starts a local Ray for this sweep. Left to Ray, None would join
    whatever cluster `ray start` last recorded on this machine; RAY_ADDRESS still wins."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        return "local"
    return address


def _start_services(services: Services, todo: list[PlannedRun], rows: dict[str, dict[str, Any]]) -> dict[str, Endpoints]:
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
        rows[spec.run_id] = _index_row(spec, "failed", outcome, 0)
    return endpoints


def _run_on_cluster(todo: list[PlannedRun], base: HarnessConfig, store: SweepStore, rows: dict[str, dict[str, Any]],
                    console: Console, worker_cls: Any, **schedule: Any) -> None:
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
            rows[run_id] = _index_row(spec, "failed", RunOutcome(run_id=run_id, status="failed", evidence_dir="",
                                                                 error=error), 0)
        store.write_index(list(rows.values()))
        todo = [r for r in todo if rows[r.spec.run_id]["status"] != "failed"]
        if todo:
            # the sweep's own actors stay on the driver's node: they must outlive any other node
            here = pinned(ray.get_runtime_context().get_node_id())
            limiter = EndpointLimiter.options(**here).remote(_limits(base, placement.endpoints()))
            board = SweepBoard.options(**here).remote()
            _schedule(todo, placement, limiter, board, base, store, rows, store.log_dir, console, worker_cls,
                      **schedule)
    finally:
        placement.close()


def _limits(base: HarnessConfig, endpoints: Any) -> dict[str, int]:
    limits: dict[str, int] = {}
    for e in endpoints:
        limits[e.limit_key(e.container_url)] = base.ray.container_concurrency
        limits[e.limit_key(e.policy_url)] = base.ray.model_concurrency
        limits[e.limit_key(e.proposer_url)] = base.ray.model_concurrency
    return limits


def _schedule(todo: list[PlannedRun], placement: Any, limiter: Any, board: Any,
              base: HarnessConfig, store: SweepStore, rows: dict[str, dict[str, Any]], log_dir: Path,
              console: Console, worker_cls: Any, revive: Callable[[str], None] | None = None,
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
        rows[run.spec.run_id] = _index_row(run.spec, "failed", outcome, attempts.get(run.spec.run_id, 0))

    with Live(_status_line(rows, {}, started), console=console, refresh_per_second=2, transient=False) as live:
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
            _serve_restarts(board, revive)
            for ref in ready:
                run, actor, slot = in_flight.pop(ref)
                run_id = run.spec.run_id
                try:
                    outcome = RunOutcome.model_validate_json(ray.get(ref))
                    idle[slot.node].append(actor)
                except (RayActorError, WorkerCrashedError) as exc:
                    # the worker died holding endpoint slots: give them back, or the limits shrink for good
                    limiter.release_holder.remote(holder(run_id))
                    if placement.lost(slot.node, exc):  # the whole node went: the run moves
                        idle.pop(slot.node, None)
                        moved.setdefault(run_id, []).append(slot.node)
                        queue.insert(0, run)
                        continue
                    crashes[run_id] = crashes.get(run_id, 0) + 1
                    if crashes[run_id] < 2:  # the worker died: retry once on a fresh actor
                        queue.insert(0, run)
                        continue
                    outcome = RunOutcome(run_id=run_id, status="failed", evidence_dir="",
                                         error=f"worker died twice: {type(exc).__name__}")
                except RayError as exc:  # the run raised past the worker's own handler: that run fails
                    limiter.release_holder.remote(holder(run_id))
                    outcome = RunOutcome(run_id=run_id, status="failed", evidence_dir="", error=_ray_error(exc))
                rows[run_id] = _index_row(run.spec, outcome.status, outcome, attempts[run_id]) | _node_fields(
                    slot, moved.get(run_id), placement)
                store.write_index(list(rows.values()))
                if outcome.tracking is not None and notes is not None:
                    notes[run_id] = outcome.tracking
            status = _status_line(rows, ray.get(board.snapshot.remote()), started)
            live.update(status + (live_usage() if live_usage else ""))


def _node_fields(slot: Any, lost_on: list[str] | None, placement: Any) -> dict[str, Any]:
    """The index's record of where a run ran, and the nodes it was lost on before."""
    node = slot.endpoints.node
    return {"node_id": node.node_id if node else None, "node_host": node.host if node else None,
            "moved_from": ",".join(placement.label(n) for n in lost_on) if lost_on else None}


def _serve_restarts(board: Any, revive: Callable[[str], None] | None) -> None:
    import ray

    for url, ticket in ray.get(board.take_restarts.remote()):
        error = None
        if revive is None:
            error = f"container at {url} stopped answering; this sweep cannot restart containers"
        else:
            try:
                revive(url)
            except Exception as exc:  # noqa: BLE001 - the runs that asked fail with it; the sweep goes on
                error = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
        board.restart_done.remote(url, ticket, error)


def _ray_error(exc: Exception) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def _live_usage(services: Services) -> Callable[[], str]:
    """Running cost and tokens of the whole sweep, policy vs proposer, from the gateway."""
    from harness.gateway.session import live_usage_text

    def text() -> str:
        usage = services.gateway.usage() if services.gateway is not None else None
        return f"\n{live_usage_text(usage)}" if usage is not None and usage.by_role else ""

    return text


def _status_line(rows: dict[str, dict[str, Any]], board: dict[str, Any], started: float) -> str:
    counts: dict[str, int] = {}
    for row in rows.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    elapsed = time.monotonic() - started
    rate = board.get("rollouts", 0) / elapsed if elapsed > 0 else 0.0
    parts = [f"{counts.get(s, 0)} {s}" for s in ("done", "running", "failed", "pending", "skipped") if counts.get(s)]
    return (f"runs: {', '.join(parts)} | {rate:.1f} rollouts/s | {board.get('tokens', 0):,} tokens | "
            f"{time.strftime('%H:%M:%S', time.gmtime(elapsed))}")


def _print_table(console: Console, rows: dict[str, dict[str, Any]], sweep_dir: str, log_dir: Path) -> None:
    table = Table(title="runs")
    on_nodes = any(row.get("node_id") for row in rows.values())  # a cluster: say where each run ran
    for column in ("run", "status", "container", "algorithm", "proposer", "seed", "heldout seed→best", "failed",
                   *(("node",) if on_nodes else ()), "error"):
        table.add_column(column, overflow="fold")
    for row in rows.values():
        seed = "n/a" if row["seed_heldout"] is None else f"{row['seed_heldout']:.3f}"
        scores = "" if row["best_heldout"] is None else f"{seed}→{row['best_heldout']:.3f}"
        failed = "" if row.get("failed_rollouts") is None else str(row["failed_rollouts"])
        node = f"{row['node_host']}-{row['node_id'][:8]}" if row.get("node_id") else ""
        if row.get("moved_from"):
            node += f" (moved from {row['moved_from']}, lost)"
        # cells are data (an error may quote a service's body): never rich markup
        cells = (row["run_id"][:8], row["status"], row["container"], row["algorithm"], row["proposer"],
                 str(row["seed"]), scores, failed, *((node,) if on_nodes else ()), row["error"] or "")
        table.add_row(*(escape(str(cell)) for cell in cells))
    console.print(table)
    console.print(f"runs: {sweep_dir}/<run id>/; index: {sweep_dir}/index.parquet; logs: {log_dir}/",
                  highlight=False, soft_wrap=True)
