"""Every config in configs/ composes with Hydra and validates into the harness's pydantic
models; every sweep file expands into valid run specs; `--cfg job` prints and starts nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from algorithms.registry import build_optimizer
from harness.config import HarnessConfig, load_config, run_spec
from harness.specs import RunSpec
from harness.sweep.expand import expand, grid, parse_sweep

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
GROUPS = ("container", "policy", "proposer", "algorithm", "models", "tracking")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


GROUP_OPTIONS = [(group, option) for group in GROUPS for option in options(group)]
SWEEPS = options("sweep")


@pytest.fixture(scope="module")
def hydra_configs():
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        yield


def compose_raw(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose(config_name="config", overrides=overrides), resolve=True)  # type: ignore[return-value]


def validate(raw: dict) -> tuple[HarnessConfig, RunSpec]:
    config = load_config(raw, base_dir=str(REPO))
    return config, run_spec(config)


def test_every_group_has_options():
    for group in GROUPS + ("sweep",):
        assert options(group), f"configs/{group}/ has no options"


def test_default_config_composes_and_validates(hydra_configs):
    config, spec = validate(compose_raw([]))
    assert config.sweep is None
    assert spec.sweep == "local" and spec.run_id


@pytest.mark.parametrize("group, option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_group_option_composes_and_validates(hydra_configs, group, option):
    raw = compose_raw([f"{group}={option}"])
    config, spec = validate(raw)
    if group in ("policy", "proposer"):
        # the option lands in place as written (the models profile does not override it)
        written = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / group / f"{option}.yaml"), resolve=True)
        assert raw[group] == written
    if group == "container":
        assert config.container.name == option
        assert spec.pools.heldout and spec.pools.train
    if group == "algorithm":
        assert config.algorithm.name == option
        build_optimizer(config.algorithm.name, config.algorithm.params)  # params validate too
    if group == "models":
        assert spec.policy.model and spec.proposer.model


@pytest.mark.parametrize("profile", ["models=scripted", "models=local", "models=hosted"])
@pytest.mark.parametrize("container", options("container"))
def test_every_container_with_every_model_profile(hydra_configs, container, profile):
    validate(compose_raw([f"container={container}", profile]))


SWEEP_VARIANTS = [[f"+sweep={name}"] for name in SWEEPS] + [[f"+sweep={name}", "models=scripted"] for name in SWEEPS] + [
    [f"+sweep={name}", "models=hosted"] for name in SWEEPS
]


@pytest.mark.parametrize("overrides", SWEEP_VARIANTS, ids=[" ".join(v) for v in SWEEP_VARIANTS])
def test_sweep_expands_into_valid_run_specs(hydra_configs, overrides):
    top = load_config(compose_raw(overrides), base_dir=str(REPO))
    assert top.sweep is not None
    sweep = parse_sweep(top.sweep)
    assert sweep.name == overrides[0].split("=", 1)[1]
    points = grid(sweep, overrides)
    assert points, "the sweep expands to no run"
    specs = []
    for point, raw in expand(sweep, overrides, compose_raw):
        config = load_config(raw, base_dir=str(REPO))
        spec = run_spec(config, sweep=sweep.name, axes=point.axes)
        build_optimizer(spec.algorithm.name, spec.algorithm.params)
        # each axis value landed in the composed point
        if "container" in point.axes:
            assert spec.container.name == point.axes["container"]
        if "seed" in point.axes:
            assert spec.seed == int(point.axes["seed"])
        if "algorithm" in point.axes:
            assert spec.algorithm.name == point.axes["algorithm"]
        specs.append(spec)
    ids = [s.run_id for s in specs]
    assert len(set(ids)) == len(ids), "two grid points of a shipped sweep are the same run"


def _harness(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env={**env, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=120)


def test_cfg_job_prints_the_composed_config_and_starts_nothing(tmp_path):
    evidence = tmp_path / "ev"
    out = _harness("--cfg", "job", f"evidence_root={evidence}", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = OmegaConf.create(out.stdout)
    assert printed.container.name == "banking77"
    assert printed.budget.max_rollouts > 0
    assert printed.evidence_root == str(evidence)
    assert "sweep" not in printed
    assert not evidence.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/, .hydra/, logs


def test_cfg_job_with_a_sweep_prints_it_and_starts_nothing(tmp_path):
    evidence = tmp_path / "ev"
    out = _harness("--cfg", "job", "+sweep=smoke", "models=scripted", f"evidence_root={evidence}", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = OmegaConf.create(out.stdout)
    assert printed.sweep.name == "smoke"
    assert list(printed.sweep.containers) == ["banking77", "heart_disease"]
    assert printed.policy.provider == "scripted"
    assert "sweep smoke:" not in out.stdout  # no sweep banner (stdout is all YAML: it parsed above)
    assert not evidence.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_numbers_in_a_container_command_override_become_arguments(hydra_configs):
    overrides = ["container=tau2_retail", "container.command=[python,-m,benchmarks.containers.tau2_retail,--max-steps,30]"]
    _, spec = validate(compose_raw(overrides))
    assert spec.container.command == ["python", "-m", "benchmarks.containers.tau2_retail", "--max-steps", "30"]
    quoted = ["container=tau2_retail", "container.command=[python,-m,benchmarks.containers.tau2_retail,--max-steps,'30']"]
    assert validate(compose_raw(quoted))[1].run_id == spec.run_id  # the same command, the same run


@pytest.mark.parametrize("profile, containers, proposers", [
    ("local", ["banking77", "heart_disease"], ["local_0_5b", "local_1_5b"]),
    ("scripted", ["banking77", "heart_disease"], ["scripted"]),
    ("hosted", ["healthbench", "tau2_retail"], ["gpt_5_4_nano", "gpt_5_4_mini", "gpt_5_4"]),
])
def test_the_models_profile_sets_the_sweeps_axes(hydra_configs, profile, containers, proposers):
    scaling = parse_sweep(load_config(compose_raw(["+sweep=proposer_scaling", f"models={profile}"]),
                                      base_dir=str(REPO)).sweep)
    assert (scaling.containers, scaling.proposers) == (containers, proposers)
    same = parse_sweep(load_config(compose_raw(["+sweep=same_container", f"models={profile}"]),
                                   base_dir=str(REPO)).sweep)
    assert same.containers == (["banking77", "heart_disease", "hotpotqa", "healthbench", "tau2_retail"]
                               if profile == "hosted" else ["banking77", "heart_disease"])
    # an explicit axis still wins over the profile's
    mine = parse_sweep(load_config(compose_raw(["+sweep=proposer_scaling", f"models={profile}",
                                                "sweep.containers=[hotpotqa]"]), base_dir=str(REPO)).sweep)
    assert mine.containers == ["hotpotqa"]


def test_the_containers_label_field_reaches_only_the_optimizers_that_read_it(hydra_configs):
    """heart_disease names its rows' class field: GEPA takes it as `select_spread_by` (a new
    run id); the library and seed-only arms do not read it and keep their run ids; a param
    the config gives itself wins."""
    _, gepa = validate(compose_raw(["container=heart_disease"]))
    assert gepa.algorithm.params["select_spread_by"] == "target"
    _, plain = validate(compose_raw(["container=heart_disease", "container.label_field=null"]))
    assert "select_spread_by" not in plain.algorithm.params and plain.run_id != gepa.run_id
    _, given = validate(compose_raw(["container=heart_disease", "+algorithm.params.select_spread_by=sex"]))
    assert given.algorithm.params["select_spread_by"] == "sex"
    for algorithm in ("gepa_ai", "seed_only"):
        ids = {validate(compose_raw(["container=heart_disease", f"algorithm={algorithm}", *extra]))[1].run_id
               for extra in ([], ["container.label_field=null"])}
        assert len(ids) == 1
    _, banking = validate(compose_raw([]))
    assert "select_spread_by" not in banking.algorithm.params  # no label_field: the default run's id stays
