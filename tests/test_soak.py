"""Soak: a 50-run sweep on Ray (`python -m harness +sweep=...`, loopback only) with faults
injected at 5 percent everywhere, bounded in time and count:

- the chaos container (keyed) fails 5% of rollout ids once (500, hang, cut-off JSON, no
  reward, another rollout id) and its process exits every 400 rollout requests;
- the scripted policy and proposer (`flaky`) fail 5% of distinct requests once (429 with
  and without Retry-After, 503, slow, garbled body, empty completion).

Checks: every run finished or failed with a recorded reason, every run once in the index,
every rollout row present exactly once, each injected container fault accounted for
(retried kinds end ok, the others are failed rows with their error), the container
restarted by the driver once per death, and no key in any file the sweep wrote. The
figures are printed (`pytest -s`) and kept in the test's tmp dir as soak_report.json."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.containers.chaos import FAULT_KINDS, RETRIED_KINDS
from conftest import REPO
from faults import assert_no_secret, check_rows_exactly_once, count_kinds, injected_faults
from test_sweep_ray import check_evidence_complete, index_rows, sweep_env

RUNS = 50
BUDGET = 20
DIE_AFTER = 400
FAULT_RATE = 0.05
WALL_LIMIT_S = 420
_FLAKY = re.compile(r"^flaky: injected (\S+)$", re.M)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(WALL_LIMIT_S + 120)]


def soak_configs(root: Path) -> Path:
    flags = ["--fault-rate", str(FAULT_RATE), "--fault-kinds", ",".join(FAULT_KINDS), "--seed", "11",
             "--hang-s", "30", "--die-after", str(DIE_AFTER), "--journal", str(root / "chaos-journal.txt")]
    command = ", ".join(["python", "-m", "benchmarks.containers.chaos", *(f'"{f}"' for f in flags)])
    (root / "container").mkdir(parents=True)
    (root / "container" / "chaos_soak.yaml").write_text(
        "# @package _global_\ncontainer:\n  name: chaos_soak\n"
        f"  command: [{command}]\n  data_dir: ${{data_dir}}\n  target_modules: [stage2_system]\n"
        "  api_key_env: HARNESS_SOAK_CONTAINER_KEY\n  request_timeout_s: 2\n"
        "pools:\n  train: {split: train, start: 0, count: 12}\n  pareto: {split: train, start: 12, count: 4}\n"
        "  heldout: {split: test, start: 0, count: 4}\n  allow_overlap: false\n")
    (root / "sweep").mkdir()
    seeds = ", ".join(str(s) for s in range(RUNS))
    (root / "sweep" / "soak.yaml").write_text(
        "# @package _global_\nsweep:\n  name: soak\n  description: 50 small runs with 5% faults everywhere\n"
        f"  containers: [chaos_soak]\n  seeds: [{seeds}]\n"
        f"budget:\n  max_rollouts: {BUDGET}\n  max_wall_s: 120\n")
    return root


def test_soak_fifty_runs_with_five_percent_faults(tmp_path: Path, data_dir: Path) -> None:
    configs = soak_configs(tmp_path / "configs")
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "soak"
    key = f"ck-{uuid.uuid4().hex}"
    flaky = (f"'flaky?rate={FAULT_RATE}&kinds=429,429_bare,503,slow,garbage,empty&retry_after=0.2"
             "&slow_s=0.5&seed=5'")
    command = [sys.executable, "-m", "harness", "+sweep=soak", "models=scripted", f"hydra.searchpath=[file://{configs}]",
               f"evidence_root={evidence}", f"policy.source={flaky}", f"proposer.source={flaky}",
               "ray.max_runs_in_flight=4", "ray.cpus_per_run=0.25"]
    started = time.monotonic()
    out = subprocess.run(command, cwd=REPO, env={**sweep_env(data_dir), "HARNESS_SOAK_CONTAINER_KEY": key},
                         capture_output=True, text=True, timeout=WALL_LIMIT_S, start_new_session=True)
    wall = time.monotonic() - started
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]

    # every run once, finished or failed with its reason
    rows = index_rows(sweep_dir)
    assert len(rows) == RUNS and len({r["run_id"] for r in rows}) == RUNS
    assert all(r["status"] in ("done", "failed") for r in rows)
    assert all(r["error"] for r in rows if r["status"] == "failed")
    check_evidence_complete(sweep_dir, {r["run_id"] for r in rows if r["status"] == "done"})

    # every rollout row exactly once (check_rows_exactly_once), and by id across runs
    by_id: dict[str, dict] = {}
    outcomes: Counter[str] = Counter()
    for row in rows:
        run_dir = sweep_dir / row["run_id"]
        if not (run_dir / "manifest.json").exists():
            continue
        ev = check_rows_exactly_once(run_dir)
        for rollout in ev["rollouts"]:
            assert rollout["rollout_id"] not in by_id
            by_id[rollout["rollout_id"]] = rollout
            outcomes[rollout["status"]] += 1

    # each injected container fault: retried kinds survived as ok rows, the others are failed rows
    logs = sweep_dir / "logs"
    container_log = "".join(p.read_text(errors="replace") for p in logs.glob("*container-chaos_soak*.log"))
    faults = injected_faults(container_log)
    deaths = container_log.count(f"chaos: exiting after {DIE_AFTER} rollouts")
    driver_restarts = out.stdout.count("restarted the container at")
    # once per death: a live process replaced as well would fail the rollouts it held
    assert driver_restarts == deaths, (driver_restarts, deaths, out.stdout[-3000:])
    survived: Counter[str] = Counter()
    for fault in faults:
        row = by_id.get(fault["rollout"])
        if row is None:
            continue  # a rollout of a run that failed before writing it (none expected)
        if fault["kind"] in RETRIED_KINDS:
            assert row["status"] == "ok", (fault, row["status"], row["error"])
        else:
            # no reward, never a zero
            assert row["status"] == "error" and row["reward"] is None, (fault, row["status"], row["error"])
        survived[fault["kind"]] += 1
    restarts = sum("container_restarted" in pq.read_table(p).column("kind").to_pylist()
                   for p in sweep_dir.glob("*/events.parquet"))
    model_log = "".join(p.read_text(errors="replace") for p in logs.glob("scripted-model-*.log"))
    model_faults = Counter(_FLAKY.findall(model_log))

    report = {
        "runs": len(rows), "runs_done": sum(r["status"] == "done" for r in rows),
        "runs_failed": {r["run_id"]: r["error"] for r in rows if r["status"] == "failed"},
        "rollout_rows": len(by_id), "rollout_rows_by_status": dict(outcomes),
        "container_faults_injected": dict(count_kinds(faults)), "container_faults_accounted": dict(survived),
        "container_deaths": deaths, "runs_that_restarted_the_container": restarts,
        "driver_restarts": driver_restarts,
        "model_faults_injected": dict(model_faults), "wall_s": round(wall, 1),
    }
    (tmp_path / "soak_report.json").write_text(json.dumps(report, indent=2))
    print("\nsoak:", json.dumps(report, indent=2))

    assert report["runs_done"] == RUNS, report["runs_failed"]
    assert sum(survived.values()) == len(faults) > 0  # every injected container fault is accounted for
    assert set(survived) == set(FAULT_KINDS)
    assert deaths >= 1 and restarts >= 1  # the container died mid-sweep and was restarted
    assert sum(model_faults.values()) > 0
    assert outcomes["error"] == sum(survived[k] for k in set(FAULT_KINDS) - RETRIED_KINDS)  # no other failure
    # no key in anything the sweep wrote (evidence, index, logs, reports) nor in its output
    assert_no_secret([evidence], key, texts=(out.stdout, out.stderr))
    assert wall < WALL_LIMIT_S
    assert os.path.exists(sweep_dir / "index.parquet")
