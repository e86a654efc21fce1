"""Sweeps on real Ray with real containers and the scripted fake model (all loopback):
a whole sweep, resume after the driver is killed, failure isolation, Ctrl-C, joining an
existing cluster and a replay from the cache (the limiter and a dying worker, in-process:
test_sweep_ray_inprocess.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from harness.evidence.schema import TIMING_COLUMNS, TRANSPORT_COLUMNS
from harness.processes import free_port

REPO = Path(__file__).resolve().parents[1]
TABLES = ("rollouts", "candidates", "proposals", "events")
SCRIPTED = ["+sweep=smoke", "models=scripted"]

pytestmark = pytest.mark.timeout(400)


# ---- helpers: the sweep as a subprocess, and the processes it leaves behind ----------


def sweep_env(data_dir: Path) -> dict[str, str]:
    # always a fresh local Ray, whatever an in-process ray.init of another test left in os.environ
    # (it sets RAY_AUTH_MODE, for one)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HARNESS_DATA_DIR=str(data_dir), COLUMNS="250", PYTHONUNBUFFERED="1")
    return env


def sweep_cmd(evidence: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "harness", *SCRIPTED, f"evidence_root={evidence}", *overrides]


def run_sweep(evidence: Path, data_dir: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(sweep_cmd(evidence, *overrides), cwd=REPO, env=sweep_env(data_dir), capture_output=True,
                          text=True, timeout=timeout, start_new_session=True)


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgid, start time) of a live, non-zombie process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[2]), int(fields[19])


def descendants(root: int) -> dict[int, tuple[int, int]]:
    """pid -> (pgid, start time) of every process below `root`."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            table[int(entry)] = stat
    found: dict[int, tuple[int, int]] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, pgid, start) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = (pgid, start)
                frontier.append(pid)
    return found


def still_alive(procs: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    alive = {}
    for pid, (pgid, start) in procs.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == start:  # same process, not a reused pid
            alive[pid] = (pgid, start)
    return alive


def wait_gone(procs: dict[int, tuple[int, int]], timeout: float) -> dict[int, tuple[int, int]]:
    deadline = time.monotonic() + timeout
    while (alive := still_alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def kill_all(procs: dict[int, tuple[int, int]]) -> None:
    """SIGKILL what is left of a process tree this test started (never anything else)."""
    for pid, (pgid, _) in still_alive(procs).items():
        try:
            if pgid == pid:  # a service in its own session: take its children with it
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_gone(procs, 10)


class SweepProcess:
    """A sweep started in its own session; on exit nothing it started survives."""

    def __init__(self, evidence: Path, data_dir: Path, *overrides: str, log: Path):
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(sweep_cmd(evidence, *overrides), cwd=REPO, env=sweep_env(data_dir),
                                     stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        self.seen: dict[int, tuple[int, int]] = {}

    def snapshot(self) -> dict[int, tuple[int, int]]:
        self.seen.update(descendants(self.proc.pid))
        return dict(self.seen)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.snapshot()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        kill_all(self.seen)
        self._out.close()


def manifests(sweep_dir: Path) -> set[str]:
    return {p.parent.name for p in sweep_dir.glob("*/manifest.json")}


def wait_for_some_manifests(sweep: SweepProcess, sweep_dir: Path, total: int, timeout: float = 240) -> set[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = manifests(sweep_dir)
        if done:
            assert len(done) < total, "the sweep finished before it could be interrupted: make its runs longer"
            return done
        assert sweep.proc.poll() is None, f"sweep exited early:\n{sweep.output()[-3000:]}"
        sweep.snapshot()
        time.sleep(0.2)
    pytest.fail(f"no run finished within {timeout}s:\n{sweep.output()[-3000:]}")


def index_rows(sweep_dir: Path) -> list[dict]:
    return pq.read_table(sweep_dir / "index.parquet").to_pylist()


def check_evidence_complete(sweep_dir: Path, run_ids: set[str]) -> None:
    """Every run dir complete; every Parquet file readable; no temporary files; no duplicate rows."""
    leftovers = [str(p) for p in sweep_dir.rglob("*") if p.name.endswith(".tmp") or ".write-probe-" in p.name]
    assert not leftovers, f"leftover temporary files: {leftovers}"
    for path in sweep_dir.rglob("*.parquet"):
        pq.read_table(path)  # raises on a partial file
    # hidden directories (.checkpoints, .staging) hold no run
    run_dirs = {p.name for p in sweep_dir.iterdir()
                if p.is_dir() and p.name not in ("logs", "report") and not p.name.startswith(".")}
    assert run_dirs == run_ids, "run directories do not match the grid"
    assert not list(sweep_dir.glob(".checkpoints/*")), "a finished run left its checkpoint behind"
    for run_id in run_ids:
        run_dir = sweep_dir / run_id
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["run_id"] == run_id and manifest["status"] == "done"
        for table in TABLES:
            assert (run_dir / f"{table}.parquet").is_file(), f"{run_id} lacks {table}.parquet"
        rollouts = pq.read_table(run_dir / "rollouts.parquet").to_pylist()
        ids = [r["rollout_id"] for r in rollouts]
        assert len(ids) == len(set(ids)), f"{run_id}: duplicated rollout rows"
        assert {r["run_id"] for r in rollouts} == {run_id}
        totals = manifest["totals"]
        assert len(rollouts) == totals["rollouts"] + totals["heldout_rollouts"]
        candidates = [c["candidate_id"] for c in pq.read_table(run_dir / "candidates.parquet").to_pylist()]
        assert len(candidates) == len(set(candidates)) == totals["candidates"]


# ---- whole sweeps (subprocess) ----------------------------------------------------------


def test_smoke_sweep_end_to_end_then_all_skipped(tmp_path, data_dir):
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "smoke"
    first = run_sweep(evidence, data_dir)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

    rows = index_rows(sweep_dir)
    sweep_json = json.loads((sweep_dir / "sweep.json").read_text())
    grid_ids = [g["run_id"] for g in sweep_json["grid"]]
    assert len(grid_ids) == 4 and len(set(grid_ids)) == 4
    assert sorted(r["run_id"] for r in rows) == sorted(grid_ids)  # every run once
    assert {r["status"] for r in rows} == {"done"}
    assert {(g["container"], g["seed"]) for g in sweep_json["grid"]} == {
        (c, s) for c in ("banking77", "heart_disease") for s in ("0", "1")}
    for row in rows:
        assert row["error"] is None and row["attempts"] == 1
        assert row["evidence_dir"] == str(sweep_dir / row["run_id"])
        assert 0 < row["rollouts"] <= 40
    parity = sweep_json["parity"]
    assert parity["seeds"] == [0, 1]
    assert len(parity["budgets"]) == 1 and json.loads(parity["budgets"][0])["max_rollouts"] == 40
    assert set(parity["heldout_ids"]) == {"banking77", "heart_disease"}
    assert all(len(ids) == 20 for ids in parity["heldout_ids"].values())
    assert parity["policies"] == parity["proposers"] == ["scripted-rules"]
    assert sweep_json["sweep"]["name"] == "smoke" and sweep_json["price_table_version"]
    check_evidence_complete(sweep_dir, set(grid_ids))
    assert all(r["run_id"][:8] in first.stdout for r in rows)  # the final table
    # stdout is a pipe: the status comes as lines while the sweep runs, not only at its end
    status = [line for line in first.stdout.splitlines() if line.startswith("runs: ") and " rollouts/s | " in line]
    assert status[0].startswith("runs: 4 pending |") and status[-1].startswith("runs: 4 done |"), status
    assert any("running" in line for line in status), status
    summary = (sweep_dir / "report" / "summary.md").read_text()  # the sweep ends with its summary
    assert "| banking77 | gepa |" in summary and "| heart_disease | gepa |" in summary

    shutil.rmtree(sweep_dir / "report")  # as if the first invocation had stopped before its summary
    # as if a forced redo had been killed mid-swap: one done run's evidence moved aside, no
    # new evidence in its place. The driver puts it back and skips the run as done.
    aside = sweep_dir / ".staging" / f"{rows[0]['run_id']}-0123456789ab.replaced"
    aside.parent.mkdir(exist_ok=True)
    (sweep_dir / rows[0]["run_id"]).rename(aside)
    again = run_sweep(evidence, data_dir, "concurrency=3")  # transport change: same runs
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "4 already done, 0 to run" in again.stdout
    assert not aside.exists() and (sweep_dir / rows[0]["run_id"] / "manifest.json").is_file()
    assert (sweep_dir / "report" / "summary.md").read_text() == summary
    skipped = {r["run_id"]: r for r in index_rows(sweep_dir)}
    for row in rows:  # the skipped runs' results come from their manifests
        assert {k: skipped[row["run_id"]][k] for k in ("rollouts", "seed_heldout", "best_heldout")} == {
            k: row[k] for k in ("rollouts", "seed_heldout", "best_heldout")}
    assert {r["status"] for r in index_rows(sweep_dir)} == {"skipped"}
    assert sorted(r["run_id"] for r in index_rows(sweep_dir)) == sorted(grid_ids)

    # an index that lost the rows of three runs (as one written before indexes kept earlier
    # invocations' rows): the next invocation lists them again, from their manifests
    kept_row = pq.read_table(sweep_dir / "index.parquet").slice(0, 1)
    pq.write_table(kept_row, sweep_dir / "index.parquet")
    kept = kept_row.column("run_id")[0].as_py()

    # another seed with another budget: the sweep's report keeps the four earlier runs, and
    # the two budgets of the banking77 cell are told apart, never pooled into one mean
    more = run_sweep(evidence, data_dir, "sweep.containers=[banking77]", "sweep.seeds=[2]", "budget.max_rollouts=30")
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert "1 runs, 0 already done, 1 to run" in more.stdout
    assert "its report also covers 4 run(s) earlier invocations left" in more.stdout
    grid = {g["run_id"]: g for g in json.loads((sweep_dir / "sweep.json").read_text())["grid"]}
    assert set(grid) > set(grid_ids) and len(grid) == 5
    # the index goes on listing the earlier runs: as the last invocation recorded them, or as
    # their manifests do
    indexed = {r["run_id"]: r for r in index_rows(sweep_dir)}
    assert {r: row["status"] for r, row in indexed.items()} == {
        **{run_id: "done" for run_id in grid}, kept: "skipped"}
    for row in rows:
        assert {k: indexed[row["run_id"]][k] for k in ("rollouts", "seed_heldout", "best_heldout", "evidence_dir",
                                                         "container", "seed", "identity_json")} == {
            k: row[k] for k in ("rollouts", "seed_heldout", "best_heldout", "evidence_dir", "container", "seed",
                                "identity_json")}
    configs = {(g["container"], g["config"]) for g in grid.values()}
    assert configs == {("heart_disease", "-"), ("banking77", "budget.max_rollouts=40"),
                       ("banking77", "budget.max_rollouts=30")}
    cells = pl.read_parquet(sweep_dir / "report" / "summary.parquet")
    assert sorted(zip(cells["task"], cells["config"], cells["n_runs"])) == [
        ("banking77", "budget.max_rollouts=30", 1), ("banking77", "budget.max_rollouts=40", 2),
        ("heart_disease", "-", 2)]


RESUME = ("sweep.containers=[banking77]", "sweep.seeds=[0,1,2,3,4,5]", "budget.max_rollouts=120")


def test_resume_after_the_driver_is_killed(tmp_path, data_dir):
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "smoke"
    sweep = SweepProcess(evidence, data_dir, *RESUME, log=tmp_path / "first.log")
    try:
        wait_for_some_manifests(sweep, sweep_dir, total=6)
        tree = sweep.snapshot()
        finished_before = {r for r in manifests(sweep_dir)}
        os.killpg(sweep.proc.pid, signal.SIGKILL)  # the driver and everything in its process group
        sweep.proc.wait(30)
        # Ray's processes share the driver's fate; the services it started (own sessions) are orphans
        # now: this test removes them so that they cannot disturb later tests
        kill_all(tree)
    finally:
        sweep.close()
    assert still_alive(sweep.seen) == {}

    # a run killed while it wrote its evidence: a half Parquet file and a temporary file, no manifest
    grid_ids = {g["run_id"] for g in json.loads((sweep_dir / "sweep.json").read_text())["grid"]}
    unfinished = sorted(grid_ids - manifests(sweep_dir))
    assert unfinished
    partial = sweep_dir / unfinished[0]
    partial.mkdir(exist_ok=True)
    (partial / "rollouts.parquet").write_bytes(b"PAR1\x00half a file")
    (partial / ".events.parquet.0123abcd.tmp").write_bytes(b"PAR1")

    second = run_sweep(evidence, data_dir, *RESUME)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    rows = index_rows(sweep_dir)
    assert {g["run_id"] for g in json.loads((sweep_dir / "sweep.json").read_text())["grid"]} == grid_ids
    assert len(grid_ids) == 6
    assert sorted(r["run_id"] for r in rows) == sorted(grid_ids)  # each run exactly once
    status = {r["run_id"]: r["status"] for r in rows}
    assert set(status.values()) <= {"done", "skipped"}
    assert finished_before <= {i for i, s in status.items() if s == "skipped"}  # finished runs are not redone
    assert any(s == "done" for s in status.values())
    check_evidence_complete(sweep_dir, grid_ids)


def _write_test_configs(root: Path) -> Path:
    """Test-only Hydra options: a container attached to a dead port, one whose command exits."""
    pools = ("pools:\n  train: {split: train, start: 0, count: 60}\n  pareto: {split: train, start: 60, count: 20}\n"
             "  heldout: {split: test, start: 0, count: 100}\n")
    (root / "container").mkdir(parents=True)
    (root / "container" / "dead.yaml").write_text(
        "# @package _global_\ncontainer:\n  name: dead\n  url: http://127.0.0.1:9\n" + pools)
    (root / "container" / "broken.yaml").write_text(
        "# @package _global_\ncontainer:\n  name: broken\n  command: [python, -c, 'import sys; sys.exit(3)']\n" + pools)
    return root


def test_failed_runs_are_isolated(tmp_path, data_dir):
    configs = _write_test_configs(tmp_path / "configs")
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "smoke"
    out = run_sweep(evidence, data_dir, f"hydra.searchpath=[file://{configs}]",
                    "sweep.containers=[heart_disease,dead,broken]", "sweep.seeds=[0]")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {r["container"]: r for r in index_rows(sweep_dir)}
    assert sorted(rows) == ["broken", "dead", "heart_disease"]
    assert rows["heart_disease"]["status"] == "done"
    assert rows["dead"]["status"] == "failed"
    assert "dead" in rows["dead"]["error"] and "ConnectError" in rows["dead"]["error"]
    assert rows["broken"]["status"] == "failed"  # its container never started: the other runs still ran
    assert "exited with code 3" in rows["broken"]["error"]
    check_evidence_complete(sweep_dir, {rows["heart_disease"]["run_id"]})
    # the final table names every run and the failures' causes
    table = out.stdout[out.stdout.rindex("┏"):]  # from the table's header on
    for row in rows.values():
        assert row["run_id"][:8] in table
    assert table.count("failed") >= 2 and "ConnectError" in table and "exited with code 3" in table
    assert "index.parquet" in table

    # another seed of the healthy container alone: the index, the grid and the report keep the
    # runs that failed before writing any evidence (the index is their only record)
    more = run_sweep(evidence, data_dir, f"hydra.searchpath=[file://{configs}]", "sweep.containers=[heart_disease]",
                     "sweep.seeds=[1]")
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    kept = {r["run_id"]: r for r in index_rows(sweep_dir)}
    assert {r["run_id"] for r in rows.values()} < set(kept) and len(kept) == 4
    assert kept[rows["broken"]["run_id"]]["status"] == "failed"
    assert "exited with code 3" in kept[rows["broken"]["run_id"]]["error"]
    grid = {g["run_id"]: g for g in json.loads((sweep_dir / "sweep.json").read_text())["grid"]}
    assert set(grid) == set(kept) and grid[rows["broken"]["run_id"]]["container"] == "broken"
    assert "config" not in grid[rows["broken"]["run_id"]]  # one configuration per cell: nothing to tell apart
    cells = pl.read_parquet(sweep_dir / "report" / "summary.parquet")
    assert sorted(zip(cells["task"], cells["n_expected"], cells["n_runs"], cells["n_failed"])) == [
        ("broken", 1, 0, 1), ("dead", 1, 0, 1), ("heart_disease", 2, 2, 0)]


def test_ctrl_c_stops_services_and_ray(tmp_path, data_dir):
    evidence = tmp_path / "evidence"
    sweep = SweepProcess(evidence, data_dir, *RESUME, log=tmp_path / "interrupted.log")
    try:
        wait_for_some_manifests(sweep, evidence / "smoke", total=6)
        tree = sweep.snapshot()
        services = {pid for pid, (pgid, _) in tree.items() if pgid == pid}  # containers, model server
        assert len(services) >= 2, tree
        os.killpg(sweep.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        code = sweep.proc.wait(120)
        output = sweep.output()
        assert code == 130, output[-3000:]
        assert "interrupted" in output
        left = wait_gone(tree, 30)
        assert not left, f"still running after Ctrl-C: {[Path(f'/proc/{p}/cmdline').read_bytes()[:120] for p in left]}"
    finally:
        sweep.close()




def test_a_sweep_joins_an_existing_ray_cluster(tmp_path, data_dir):
    """`ray.address=host:port` runs the sweep on that cluster (here a head started by the
    test), not on a Ray of its own; the runs' workers are the cluster's."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        # without token auth, as the sweep's own driver expects unless RAY_AUTH_MODE says otherwise
        env={**sweep_env(data_dir), "RAY_AUTH_MODE": "disabled"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not list(Path(temp_dir).glob("session_*/logs/raylet.out")):
            assert head.poll() is None and time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        evidence = tmp_path / "evidence"
        out = subprocess.run(sweep_cmd(evidence, f"ray.address=127.0.0.1:{port}", "sweep.seeds=[0]"), cwd=REPO,
                             env={**sweep_env(data_dir), "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        rows = index_rows(evidence / "smoke")
        assert len(rows) == 2 and {r["status"] for r in rows} == {"done"}
        check_evidence_complete(evidence / "smoke", {r["run_id"] for r in rows})
        worker_logs = [p for p in Path(temp_dir).glob("session_*/logs/worker-*") if b"RunWorker" in p.read_bytes()]
        assert worker_logs, "no RunWorker ran on the cluster the sweep was pointed at"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_sweep_replayed_from_the_cache_reproduces_its_evidence_with_no_live_call(tmp_path, data_dir):
    """`gateway.cache=read_write` records every model call of a sweep (2 runs on Ray, in
    flight together); the same sweep with `gateway.cache=replay` into another evidence root
    makes no live call and writes the same evidence, timings aside."""
    store = f"gateway.cache_path={tmp_path / 'responses.sqlite'}"
    recorded = run_sweep(tmp_path / "recorded", data_dir, "sweep.seeds=[0]", "gateway.cache=read_write", store)
    assert recorded.returncode == 0, recorded.stdout[-3000:] + recorded.stderr[-3000:]
    replayed = run_sweep(tmp_path / "replayed", data_dir, "sweep.seeds=[0]", "gateway.cache=replay", store)
    assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
    run_ids = {r["run_id"] for r in index_rows(tmp_path / "recorded" / "smoke")}
    assert run_ids == {r["run_id"] for r in index_rows(tmp_path / "replayed" / "smoke")} and len(run_ids) == 2
    for run_id in sorted(run_ids):
        first, second = (tmp_path / root / "smoke" / run_id for root in ("recorded", "replayed"))
        calls = [pl.read_parquet(d / "model_calls.parquet") for d in (first, second)]
        assert set(calls[0]["cache"]) == {"miss"} and set(calls[1]["cache"]) == {"replay"}  # no live call
        assert set(calls[1]["status"]) == {"ok"} and calls[0].height == calls[1].height > 0
        for name in (*TABLES, "model_calls"):
            tables = [pl.read_parquet(d / f"{name}.parquet") for d in (first, second)]
            keep = [c for c in tables[0].columns if c not in TIMING_COLUMNS | TRANSPORT_COLUMNS]
            assert tables[0].select(keep).equals(tables[1].select(keep)), (run_id, name)
        manifests = [json.loads((d / "manifest.json").read_text()) for d in (first, second)]
        for key in ("totals", "heldout", "best_candidate_id", "stop_reason", "identity"):
            assert manifests[0][key] == manifests[1][key], (run_id, key)
