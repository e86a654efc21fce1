"""Sweep expansion: which grid points exist, and which run ids they get. Pure and fast:
no Ray, no services (Hydra composes the real configs in-process for the id checks)."""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.config import load_config, run_spec
from harness.errors import ConfigError
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, Pools, RunSpec
from harness.sweep.expand import AXES, SweepSpec, expand, grid, parse_sweep, pinned_keys

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(REPO / "configs")


def sweep(**axes) -> SweepSpec:
    return parse_sweep({"name": "t", **axes})


def axes_of(points) -> list[dict[str, str]]:
    return [p.axes for p in points]


# ---- grid points ---------------------------------------------------------------------


def test_cartesian_product_of_axes():
    s = sweep(containers=["banking77", "heart_disease"], proposers=["p1", "p2", "p3"], seeds=[0, 1])
    points = grid(s, [])
    assert len(points) == 2 * 3 * 2
    got = {tuple(sorted(p.axes.items())) for p in points}
    want = {
        tuple(sorted({"container": c, "proposer": p, "seed": str(seed)}.items()))
        for c, p, seed in itertools.product(["banking77", "heart_disease"], ["p1", "p2", "p3"], [0, 1])
    }
    assert got == want
    for p in points:  # each point's overrides set exactly its axes
        assert sorted(p.overrides) == sorted(f"{k}={v}" for k, v in p.axes.items())


def test_axes_the_sweep_leaves_unset_are_not_overridden():
    points = grid(sweep(seeds=[3, 4]), [])
    assert axes_of(points) == [{"seed": "3"}, {"seed": "4"}]
    assert [p.overrides for p in points] == [("seed=3",), ("seed=4",)]


def test_zipped_axes_vary_together():
    s = sweep(policies=["a", "b", "c"], proposers=["x", "y", "z"], seeds=[0, 1], zip=[["policies", "proposers"]])
    points = grid(s, [])
    assert len(points) == 3 * 2
    pairs = {(p.axes["policy"], p.axes["proposer"]) for p in points}
    assert pairs == {("a", "x"), ("b", "y"), ("c", "z")}
    assert {p.axes["seed"] for p in points} == {"0", "1"}


def test_zip_of_three_axes_and_an_unzipped_axis():
    s = sweep(containers=["c1", "c2"], policies=["p1", "p2"], proposers=["q1", "q2"], algorithms=["gepa", "seed_only"],
              zip=[["containers", "policies", "proposers"]])
    points = grid(s, [])
    assert len(points) == 2 * 2
    assert {(p.axes["container"], p.axes["policy"], p.axes["proposer"]) for p in points} == {
        ("c1", "p1", "q1"), ("c2", "p2", "q2")}


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"policies": ["a", "b"], "proposers": ["x"], "zip": [["policies", "proposers"]]}, "different lengths"),
        ({"policies": ["a"], "zip": [["policies", "nonsense"]]}, "unknown axis"),
        ({"policies": ["a"], "proposers": ["x"], "zip": [["policies", "proposers"], ["policies"]]}, "zipped twice"),
        ({"policies": ["a"], "zip": [["policies", "proposers"]]}, "does not set"),
        ({"seeds": []}, "empty"),
        ({"seeds": [0], "typo_axis": [1]}, "typo_axis"),
        ({"seeds": [0], "exclude": [{"containers": "banking77"}]}, "containers"),
    ],
)
def test_bad_sweeps_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_sweep({"name": "t", **raw})


def test_bad_sweep_name_is_a_config_error():
    with pytest.raises(ConfigError, match="name"):
        parse_sweep({"name": "has space", "seeds": [0]})


def test_excludes_drop_matching_points_only():
    s = sweep(containers=["banking77", "heart_disease"], proposers=["p1", "p2"], seeds=[0, 1],
              exclude=[{"container": "heart_disease", "proposer": "p2"}, {"seed": 1, "proposer": "p1"}])
    points = grid(s, [])
    combos = {(p.axes["container"], p.axes["proposer"], p.axes["seed"]) for p in points}
    want = {
        (c, p, str(seed))
        for c, p, seed in itertools.product(["banking77", "heart_disease"], ["p1", "p2"], [0, 1])
        if not (c == "heart_disease" and p == "p2") and not (seed == 1 and p == "p1")
    }
    assert combos == want
    assert len(points) == len(want)


def test_exclude_matching_nothing_keeps_every_point():
    s = sweep(containers=["banking77"], seeds=[0, 1], exclude=[{"container": "heart_disease"}])
    assert len(grid(s, [])) == 2


def test_pinned_axis_from_user_overrides_collapses_that_axis():
    s = sweep(containers=["banking77", "heart_disease"], seeds=[0, 1])
    user = ["+sweep=smoke", "container=heart_disease", "budget.max_rollouts=7"]
    points = grid(s, user)
    assert axes_of(points) == [{"container": "heart_disease", "seed": "0"}, {"container": "heart_disease", "seed": "1"}]
    for p in points:
        # the user's other overrides are kept (first), the axis value is set once, by the grid
        assert p.overrides[:2] == ("+sweep=smoke", "budget.max_rollouts=7")
        assert [o for o in p.overrides if o.startswith("container=")] == ["container=heart_disease"]


def test_pinned_value_outside_the_axis_list_is_used():
    points = grid(sweep(containers=["banking77", "heart_disease"], seeds=[0]), ["container=hotpotqa"])
    assert axes_of(points) == [{"container": "hotpotqa", "seed": "0"}]


def test_pinned_seed_and_plus_prefixed_override():
    assert pinned_keys(["+seed=5", "proposer=x", "sweep.seeds=[1,2]", "budget.max_rollouts=3", "models=scripted"]) == {
        "seed": "5", "proposer": "x"}
    points = grid(sweep(seeds=[0, 1, 2], proposers=["a", "b"]), ["+seed=5"])
    assert sorted((p.axes["proposer"], p.axes["seed"]) for p in points) == [("a", "5"), ("b", "5")]


def test_pinning_applies_before_excludes():
    s = sweep(containers=["banking77", "heart_disease"], seeds=[0, 1], exclude=[{"container": "heart_disease", "seed": 1}])
    points = grid(s, ["container=heart_disease"])
    assert axes_of(points) == [{"container": "heart_disease", "seed": "0"}]


def test_user_override_of_a_key_the_sweep_does_not_vary_passes_through():
    points = grid(sweep(seeds=[0, 1]), ["policy=scripted"])
    assert [p.overrides for p in points] == [("policy=scripted", "seed=0"), ("policy=scripted", "seed=1")]


def test_expand_composes_each_point_with_its_overrides():
    seen = []

    def compose_point(overrides):
        seen.append(overrides)
        return {"n": len(seen)}

    out = expand(sweep(containers=["a", "b"]), ["models=scripted"], compose_point)
    assert [raw for _, raw in out] == [{"n": 1}, {"n": 2}]
    assert seen == [["models=scripted", "container=a"], ["models=scripted", "container=b"]]


def test_axes_cover_every_override_key():
    assert set(AXES.values()) == {"container", "policy", "proposer", "algorithm", "seed"}


# ---- run ids -------------------------------------------------------------------------


def base_spec(**update) -> RunSpec:
    spec = RunSpec(
        container=ContainerSpec(name="banking77", command=["python", "-m", "benchmarks.containers.banking77"]),
        policy=ModelSpec(provider="scripted", model="scripted-rules", source="rules"),
        proposer=ModelSpec(provider="scripted", model="scripted-rules", source="rules", max_tokens=400),
        algorithm=AlgorithmSpec(name="gepa", params={"minibatch_size": 4}),
        pools=Pools(train=("train:0", "train:1"), pareto=("train:2",), heldout=("test:0",)),
        budget=BudgetSpec(max_rollouts=40),
    )
    return spec.model_copy(update=update) if update else spec


def test_same_spec_same_id():
    assert base_spec().run_id == base_spec().run_id
    assert len(base_spec().run_id) == 16 and int(base_spec().run_id, 16) >= 0


@pytest.mark.parametrize(
    "update",
    [
        {"concurrency": 16},
        {"evidence_root": "s3://elsewhere/evidence"},
        {"sweep": "another_sweep"},
        {"axes": {"seed": "0"}},
        {"policy": ModelSpec(provider="scripted", model="scripted-rules", source="rules", timeout_s=5)},
        {"container": ContainerSpec(name="banking77", url="http://127.0.0.1:8000", request_timeout_s=3)},
    ],
    ids=["concurrency", "evidence_root", "sweep", "axes", "model-timeout", "container-transport"],
)
def test_transport_and_placement_do_not_change_the_id(update):
    assert base_spec(**update).run_id == base_spec().run_id


@pytest.mark.parametrize(
    "update",
    [
        {"budget": BudgetSpec(max_rollouts=41)},
        {"budget": BudgetSpec(max_rollouts=40, max_wall_s=60)},
        {"seed": 1},
        {"policy": ModelSpec(provider="scripted", model="scripted-rules", source="rules", temperature=0.5)},
        {"proposer": ModelSpec(provider="local", model="qwen2.5-coder-0.5b", max_tokens=400)},
        {"algorithm": AlgorithmSpec(name="gepa", params={"minibatch_size": 8})},
        {"algorithm": AlgorithmSpec(name="seed_only")},
        {"pools": Pools(train=("train:0",), pareto=("train:2",), heldout=("test:0",))},
        {"heldout_candidates": "all"},
        {"container": ContainerSpec(name="heart_disease", command=["x"])},
        {"container": ContainerSpec(name="banking77", command=["python", "-m", "benchmarks.containers.banking77",
                                                               "--grader-model", "judge"])},
    ],
    ids=["budget", "wall-budget", "seed", "temperature", "proposer", "params", "algorithm", "pools", "heldout", "container",
         "container-options"],
)
def test_result_changing_fields_change_the_id(update):
    assert base_spec(**update).run_id != base_spec().run_id


def test_id_is_stable_across_processes():
    """Not Python's randomized hash(): another interpreter computes the same id."""
    code = ("import sys; sys.path.insert(0, %r); from tests.test_sweep_expand import base_spec; "
            "print(base_spec().run_id)") % str(REPO)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == base_spec().run_id


# ---- ids through the real configs, as `python -m harness +sweep=...` plans them -------


@functools.lru_cache(maxsize=None)
def _plan(overrides: tuple[str, ...]) -> tuple[tuple[tuple, str], ...]:
    return tuple(_plan_uncached(list(overrides)).items())


def plan(overrides: list[str]) -> dict[tuple, str]:
    return dict(_plan(tuple(overrides)))


def _plan_uncached(overrides: list[str]) -> dict[tuple, str]:
    """axes -> run id for every grid point, composed as harness.__main__ does."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        top = load_config(OmegaConf.to_container(compose(config_name="config", overrides=overrides), resolve=True),
                          base_dir=str(REPO))
        s = parse_sweep(top.sweep or {})

        def compose_point(point_overrides):
            return OmegaConf.to_container(compose(config_name="config", overrides=point_overrides), resolve=True)

        ids = {}
        for point, raw in expand(s, overrides, compose_point):
            spec = run_spec(load_config(raw, base_dir=str(REPO)), sweep=s.name, axes=point.axes)
            ids[tuple(sorted(point.axes.items()))] = spec.run_id
    return ids


SMOKE = ["+sweep=smoke", "models=scripted"]


def test_real_sweep_ids_stable_under_transport_overrides():
    ids = plan(SMOKE)
    assert len(ids) == 4 and len(set(ids.values())) == 4  # containers x seeds, all distinct
    assert _plan_uncached(SMOKE) == ids  # recomputed from scratch
    assert plan(SMOKE + ["concurrency=7", "ray.max_runs_in_flight=5"]) == ids
    assert plan(SMOKE + ["evidence_root=/somewhere/else"]) == ids


def test_real_sweep_ids_change_with_budget_and_seed():
    ids = plan(SMOKE)
    bigger = plan(SMOKE + ["budget.max_rollouts=41"])
    assert bigger.keys() == ids.keys() and not set(bigger.values()) & set(ids.values())
    seeds = plan(SMOKE + ["sweep.seeds=[1,2]"])
    # seed 1 is the same run in both grids; seed 2 is new
    for key, run_id in seeds.items():
        if ("seed", "1") in key:
            assert ids[key] == run_id
        else:
            assert run_id not in ids.values()


def test_real_sweep_pinned_container_collapses_axis():
    ids = plan(SMOKE + ["container=heart_disease"])
    full = plan(SMOKE)
    assert sorted(ids) == [(("container", "heart_disease"), ("seed", "0")), (("container", "heart_disease"), ("seed", "1"))]
    assert all(full[key] == run_id for key, run_id in ids.items())  # the same runs as in the full grid
