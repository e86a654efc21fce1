"""Entry point. `python -m harness` runs one run in-process (no Ray);
`python -m harness +sweep=NAME` expands the sweep and runs it on Ray actors;
`python -m harness doctor ...` checks a container; `python -m harness export mlflow PATH`
exports existing evidence to MLflow.
Hydra's config stops here: everything below takes frozen pydantic models."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from harness.config import CONFIG_DIR, HarnessConfig, load_config, run_spec
from harness.errors import ConfigError, HarnessError
from harness.tracking.hooks import open_target
from harness.tracking.settings import MlflowTarget

if TYPE_CHECKING:
    from harness.evidence.writer import EvidenceLocation
    from harness.specs import RunSpec


def run_single(config: HarnessConfig, console: Console) -> int:
    from harness.evidence.writer import EvidenceLocation
    from harness.preflight import check_model_keys

    spec = run_spec(config)
    check_model_keys(spec, through_gateway=config.gateway.enabled)  # before any service starts
    # service logs go under the evidence root: check it before starting anything (as a sweep does)
    location = EvidenceLocation(spec.evidence_root, spec.sweep, spec.run_id)
    location.check_writable()
    tracking = open_target(config.tracking, spec.evidence_root, spec.sweep)  # a missing extra: one line, now
    # the same run started again while this one runs stops here with one line
    with location.held():
        return _run_held(config, spec, location, tracking, console)


def _run_held(config: HarnessConfig, spec: RunSpec, location: EvidenceLocation, tracking: MlflowTarget | None,
              console: Console) -> int:
    """The run itself, its evidence folder held by this process."""
    from harness.console import print_outcome, run_progress
    from harness.run import finished, run_sync
    from harness.services import Services

    if tracking is not None:
        console.print(f"tracking: MLflow experiment {tracking.experiment!r} at {tracking.uri}", highlight=False,
                      markup=False, soft_wrap=True)
    if finished(location) and not config.force:
        console.print(f"run {spec.run_id} is already done: evidence in {location.run_dir} (force=true redoes it)",
                      highlight=False)
        _export(tracking, location.run_dir, console)  # exported before? then left as it is
        return 0
    log_dir = location.log_dir
    console.print(f"run {spec.run_id}: {spec.algorithm.name} on {spec.container.name}, policy "
                  f"{spec.policy.model}, proposer {spec.proposer.model}, budget {spec.budget.max_rollouts} rollouts",
                  highlight=False)
    with Services(log_dir, config.local_server, gateway=config.gateway, label=spec.run_id) as services:
        console.print("starting container and model servers ...", highlight=False)
        endpoints = services.endpoints(spec.container, spec.policy, spec.proposer)
        with run_progress(console, spec.container.name, spec.budget.max_rollouts,
                          every_s=config.progress_every_s, live_usage=config.gateway.live_usage) as bar:
            outcome = run_sync(spec, endpoints, observer=bar, max_error_rate=config.max_error_rate,
                               restart_container=services.restarter(endpoints.container_url),
                               force=config.force)
    print_outcome(console, outcome, len(spec.pools.heldout))
    # the evidence in place: a redo that failed left the previous, done, evidence there
    _export(tracking, location.run_dir, console)
    return 0 if outcome.status == "done" else 1


def _export(tracking: MlflowTarget | None, run_dir: str, console: Console) -> None:
    """Export the finished run; a tracker's failure is one line and changes nothing else."""
    if tracking is None:
        return
    from harness.tracking.hooks import export_finished, ui_hint

    note = export_finished(tracking, run_dir)
    console.print(note.message, style=None if note.ok else "yellow", highlight=False, markup=False, soft_wrap=True)
    if note.ok:
        console.print(ui_hint(tracking), highlight=False, markup=False, soft_wrap=True)


def run_sweep_from_hydra(config: HarnessConfig, console: Console) -> int:
    """Expand the sweep's axes: Hydra composes each grid point, our code schedules."""
    from hydra import compose

    from harness.compose_check import point_error
    from harness.preflight import check_model_keys
    from harness.sweep.driver import run_sweep
    from harness.sweep.expand import expand, parse_sweep
    from harness.sweep.schedule import PlannedRun

    sweep = parse_sweep(config.sweep or {})
    user_overrides = list(HydraConfig.get().overrides.task)
    cwd = HydraConfig.get().runtime.cwd
    # a user's extra config dirs (hydra.searchpath=[...]) live in the hydra overrides, not the
    # task ones: each grid point must see them too, or an option found there cannot be an axis value
    searchpath = [o for o in HydraConfig.get().overrides.hydra if o.partition("=")[0] == "hydra.searchpath"]

    def compose_point(overrides: list[str]) -> dict:
        try:
            cfg = compose(config_name="config", overrides=searchpath + overrides)
        except (HydraException, ValueError) as exc:
            # the command line composed on its own (compose_check): an override that the point's
            # options lack, e.g. a param of one algorithm given to a sweep over several
            point = " ".join(o for o in overrides if o not in user_overrides) or "(no axis)"
            raise ConfigError(f"sweep {sweep.name}: the grid point {point} does not compose with the command "
                              f"line: {point_error(exc)}") from exc
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]

    planned = []
    for point, raw in expand(sweep, user_overrides, compose_point):
        point_config = load_config(raw, base_dir=cwd)
        spec = run_spec(point_config, sweep=sweep.name, axes=point.axes)
        check_model_keys(spec, through_gateway=point_config.gateway.enabled)  # before anything is written
        planned.append(PlannedRun(spec=spec, max_error_rate=point_config.max_error_rate))
    ids = [p.spec.run_id for p in planned]
    if len(set(ids)) != len(ids):
        console.print("note: some grid points resolve to the same run; each runs once", style="yellow")
        planned = list({p.spec.run_id: p for p in planned}.values())
    return run_sweep(sweep, planned, config, console)


def _terminate(_signum: int, _frame: object) -> None:
    # SIGTERM takes the Ctrl-C path, so services and Ray are stopped in `finally` blocks.
    raise KeyboardInterrupt


@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    console = Console(stderr=False)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        raw = OmegaConf.to_container(cfg, resolve=True)
        config = load_config(raw, base_dir=HydraConfig.get().runtime.cwd)  # type: ignore[arg-type]
        if config.sweep is not None:
            code = run_sweep_from_hydra(config, console)
        else:
            code = run_single(config, console)
    except HarnessError as exc:
        # soft_wrap: one line whatever the terminal width, so the cause reads (and greps) whole
        console.print(f"error: {exc}", style="red", highlight=False, markup=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("interrupted: stopped the services this run started", style="yellow")
        sys.exit(130)
    sys.exit(code)


def entry() -> None:
    from harness.compose_check import composition_error

    if sys.argv[1:2] == ["doctor"]:  # not a Hydra run: checks one container and exits
        from harness.doctor import main as doctor

        sys.exit(doctor(sys.argv[2:]))
    if sys.argv[1:2] == ["view"]:  # not a Hydra run: writes a page from evidence and exits
        from harness.view.cli import main as view

        sys.exit(view(sys.argv[2:]))
    if sys.argv[1:2] == ["export"]:  # not a Hydra run: exports evidence that exists to a tracker
        from harness.tracking.cli import main as export

        sys.exit(export(sys.argv[2:]))

    problem = composition_error(sys.argv[1:], CONFIG_DIR)
    if problem is not None:
        Console().print(f"error: {problem}", style="red", highlight=False, markup=False, soft_wrap=True)
        sys.exit(2)
    main()


if __name__ == "__main__":
    entry()
