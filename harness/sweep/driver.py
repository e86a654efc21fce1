"""Runs a sweep: skip finished runs, start Ray and the services (one set on one machine;
on a cluster, schedule.py starts one per node), hand the rest to the scheduler
(harness/sweep/schedule.py), and end with a table of runs, the tracking export and the
summary."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.config import HarnessConfig
from harness.errors import ConfigError, HarnessError
from harness.evidence.configs import CONFIG_AXIS
from harness.services import Services
from harness.sweep.expand import SweepSpec
from harness.sweep.grid import solved_thresholds, sweep_grid
from harness.sweep.schedule import (
    PlannedRun, endpoint_limits, index_row, manifest_row, ray_address, recorded_results, run_on_cluster, schedule,
    start_services,
)
from harness.sweep.store import SweepStore
from harness.tracking.hooks import ExportNote, export_finished, open_target, ui_hint
from harness.tracking.settings import MlflowTarget


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
    store = SweepStore(base.evidence_root, sweep.name)
    with store.held():  # a second driver of this sweep stops here, before it writes anything
        store.check_writable()
        store.drop_dead_temporaries()  # a driver killed mid-write left them
        return _drive(sweep, runs, base, console, store)


def _drive(sweep: SweepSpec, runs: list[PlannedRun], base: HarnessConfig, console: Console,
           store: SweepStore) -> int:
    import ray

    from harness.pricing import PRICE_TABLE_VERSION
    from harness.sweep.limits import EndpointLimiter
    from harness.sweep.worker import RunWorker, SweepBoard

    # before any run: a missing extra or a store that does not open is one line; a new SQLite
    # store is created here once, not by several workers at the same time
    tracking = open_target(base.tracking, base.evidence_root, sweep.name)
    if tracking is not None:
        console.print(f"tracking: MLflow experiment {tracking.experiment!r} at {tracking.uri}", highlight=False,
                      markup=False, soft_wrap=True)
    log_dir = store.log_dir
    planned = {r.spec.run_id for r in runs}
    earlier = store.earlier_runs(planned)
    thresholds = solved_thresholds([r.spec for r in runs], earlier)
    store.adopt({r: manifest_row(r, m, store.run_location(r).shown_dir) for r, m in earlier.items()})
    grid = sweep_grid([r.spec for r in runs], earlier)
    store.write_sweep({"sweep": sweep.model_dump(), "grid": grid, "earlier_run_ids": sorted(earlier),
                       "parity": _parity(runs), "price_table_version": PRICE_TABLE_VERSION,
                       "solved_thresholds": thresholds})
    for run_id, why in sorted(store.unreadable.items()):
        console.print(f"sweep {sweep.name}: run {run_id} is left out of its report: its manifest cannot be read "
                      f"({why})", highlight=False, markup=False, soft_wrap=True)
    if earlier:
        told_apart = any(p.get(CONFIG_AXIS, "-") != "-" for p in grid)
        console.print(f"sweep {sweep.name}: its report also covers {len(earlier)} run(s) earlier invocations left in "
                      f"{store.shown_dir}" + (", other configurations on a 'config' axis" if told_apart else ""),
                      highlight=False, markup=False, soft_wrap=True)
    rows: dict[str, dict[str, Any]] = {}
    todo: list[PlannedRun] = []
    for run in runs:
        location = store.run_location(run.spec.run_id)
        try:
            # a done run's evidence a killed forced redo left moved aside goes back first, so
            # the run is skipped as done here rather than refused as done by its worker (the
            # folder is this driver's alone: no `python -m harness` run is running in it); a
            # roll-forward that fails stops the sweep here, before any work
            location.recover()
            manifest = location.read_manifest()
        except (OSError, ValueError):  # unreadable: not done, so it runs again (as execute_run decides too)
            manifest = None
        if manifest is not None and manifest.get("status") == "done" and not base.force:
            rows[run.spec.run_id] = index_row(run.spec, "skipped", None, 0) | {
                "evidence_dir": location.shown_dir, **recorded_results(manifest)}
        else:
            rows[run.spec.run_id] = index_row(run.spec, "pending", None, 0)
            todo.append(run)
    store.write_index(list(rows.values()))
    console.print(f"sweep {sweep.name}: {len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run",
                  highlight=False)
    notes: dict[str, ExportNote] = {}
    if not todo:
        print_table(console, rows, store.shown_dir, log_dir)
        _export_skipped(tracking, rows, notes)
        _print_tracking(console, tracking, notes)
        _write_summary(store.uri, store.shown_dir, console)  # an earlier invocation may have stopped before it
        return 0
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    on_sigterm = signal.getsignal(signal.SIGTERM)
    address = ray_address(base.ray.address)
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
            run_on_cluster(todo, base, store, rows, console, RunWorker, tracking=tracking, notes=notes)
        else:
            with Services(log_dir, base.local_server, gateway=base.gateway, label=sweep.name) as services:
                console.print("starting shared containers and model servers ...", highlight=False)
                endpoints = start_services(services, todo, rows)
                if len(endpoints) < len(todo):  # a service that cannot start fails its runs, not the sweep
                    store.write_index(list(rows.values()))
                    todo = [r for r in todo if r.spec.run_id in endpoints]
                if todo:
                    limiter = EndpointLimiter.remote(endpoint_limits(base, endpoints.values()))
                    board = SweepBoard.remote()
                    schedule(todo, endpoints, limiter, board, base, store, rows, log_dir, console, RunWorker,
                              revive=services.revive,
                              live_usage=_live_usage(services) if base.gateway.live_usage else None,
                              tracking=tracking, notes=notes)
    finally:
        ray.shutdown()
    print_table(console, rows, store.shown_dir, log_dir)
    _export_skipped(tracking, rows, notes)
    _print_tracking(console, tracking, notes)
    _write_summary(store.uri, store.shown_dir, console)
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


def _write_summary(sweep_dir: str, shown_dir: str, console: Console) -> None:
    """Every sweep ends with its summary; a report problem is reported, not fatal. `shown_dir`:
    the folder as printed (an object store URI's query may hold keys)."""
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
                      f"{shown_dir})", style="yellow", highlight=False, markup=False)
        return
    console.print(f"summary: {paths.report_dir}/summary.md (regenerate: python -m benchmarks.report {shown_dir})",
                  highlight=False)


def _live_usage(services: Services) -> Callable[[], str]:
    """Running cost and tokens of the whole sweep, policy vs proposer, from the gateway."""
    from harness.gateway.session import live_usage_text

    def text() -> str:
        usage = services.gateway.usage() if services.gateway is not None else None
        return f"\n{live_usage_text(usage)}" if usage is not None and usage.by_role else ""

    return text


def print_table(console: Console, rows: dict[str, dict[str, Any]], sweep_dir: str, log_dir: Path) -> None:
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
