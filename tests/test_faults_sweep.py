"""Sweep and disk faults: a Ray worker process killed mid-run (a real RunWorker, by its pid),
a container process that dies mid-sweep (restarted by the driver, which owns it, at a
run's request), the driver killed with SIGKILL alone and started again, and an evidence
disk that is full or read-only.

Kept elsewhere: the driver's whole process group killed and resumed, a worker dying twice
(fake worker, os._exit) and the limiter slots it held (test_sweep_ray.py); an evidence root
under a regular file (test_evidence.py, test_bad_input.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import container_spec, execute, run_cli
from faults import check_rows_exactly_once, small_spec
from harness.checkpoint import CheckpointStore
from harness.errors import HarnessError
from harness.evidence.writer import EvidenceLocation
from servers import ScriptedModelThread
from harness.sweep.grid import solved_thresholds
from harness.sweep.store import SweepStore
from test_sweep_ray import (
    SweepProcess,
    check_evidence_complete,
    index_rows,
    kill_all,
    manifests,
    run_sweep,
    still_alive,
    wait_gone,
)

pytestmark = pytest.mark.timeout(400)

_WORKER = re.compile(r"run (?P<run_id>[0-9a-f]{16}) start: .* worker pid (?P<pid>\d+)")


def sweep_configs(root: Path, *, die_after: int | None = None, fault_rate: float = 0.0) -> Path:
    """Test-only Hydra options: a small chaos container (optionally dying) and small pools."""
    flags = ["--fault-rate", str(fault_rate), "--seed", "0", "--hang-s", "30"]
    if die_after is not None:
        flags += ["--die-after", str(die_after)]
    command = ", ".join(["python", "-m", "benchmarks.containers.chaos", *(f'"{f}"' for f in flags)])
    (root / "container").mkdir(parents=True, exist_ok=True)
    (root / "container" / "chaos_small.yaml").write_text(
        "# @package _global_\ncontainer:\n  name: chaos_small\n"
        f"  command: [{command}]\n  data_dir: ${{data_dir}}\n  target_modules: [stage2_system]\n"
        "  request_timeout_s: 2\n"
        "pools:\n  train: {split: train, start: 0, count: 20}\n  pareto: {split: train, start: 20, count: 8}\n"
        "  heldout: {split: test, start: 0, count: 10}\n  allow_overlap: false\n")
    return root


def worker_starts(log_dir: Path) -> list[tuple[str, int]]:
    """(run id, worker pid) of every run attempt started so far, from the per-run logs."""
    found = []
    for path in sorted(log_dir.glob("*.log")):
        for match in _WORKER.finditer(path.read_text(errors="replace")):
            found.append((match["run_id"], int(match["pid"])))
    return found


# ---------------------------------------------------------------- Ray workers


def test_a_worker_killed_mid_run_is_retried_on_a_fresh_worker(tmp_path, data_dir) -> None:
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "smoke"
    sweep = SweepProcess(evidence, data_dir, "sweep.containers=[banking77]", "sweep.seeds=[0,1,2]",
                         "budget.max_rollouts=120", "ray.max_runs_in_flight=1", log=tmp_path / "sweep.log")
    try:
        deadline = time.monotonic() + 240
        while not (starts := worker_starts(sweep_dir / "logs")):
            assert time.monotonic() < deadline and sweep.proc.poll() is None, sweep.output()[-3000:]
            time.sleep(0.1)
        victim_run, victim_pid = starts[0]
        log = sweep_dir / "logs" / f"{victim_run}.log"
        while " rollouts, best " not in log.read_text():  # it is rolling out: kill it mid-run
            assert time.monotonic() < deadline and sweep.proc.poll() is None, sweep.output()[-3000:]
            time.sleep(0.05)
        assert victim_run not in manifests(sweep_dir), "the run finished before it could be killed"
        os.kill(victim_pid, signal.SIGKILL)
        code = sweep.proc.wait(300)
        assert code == 0, sweep.output()[-3000:]
    finally:
        sweep.close()
    rows = {r["run_id"]: r for r in index_rows(sweep_dir)}
    assert len(rows) == 3 and {r["status"] for r in rows.values()} == {"done"}
    assert rows[victim_run]["attempts"] == 2  # retried once, on another worker
    assert all(r["attempts"] == 1 for run_id, r in rows.items() if run_id != victim_run)
    pids = [pid for run_id, pid in worker_starts(sweep_dir / "logs") if run_id == victim_run]
    assert len(pids) == 2 and pids[0] == victim_pid != pids[1]
    check_evidence_complete(sweep_dir, set(rows))
    for run_id in rows:
        check_rows_exactly_once(sweep_dir / run_id)


# ---------------------------------------------------------------- a container dies mid-sweep


def test_a_container_that_dies_mid_sweep_is_restarted_by_the_driver(tmp_path, data_dir) -> None:
    """Four runs share one chaos container that exits at its 151st rollout request: the
    runs in flight ask the driver (through the sweep board) to restart it, and carry on."""
    configs = sweep_configs(tmp_path / "configs", die_after=150)
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "smoke"
    out = run_sweep(evidence, data_dir, f"hydra.searchpath=[file://{configs}]", "sweep.containers=[chaos_small]",
                    "sweep.seeds=[0,1,2,3]", "budget.max_rollouts=40")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {r["run_id"]: r for r in index_rows(sweep_dir)}
    assert len(rows) == 4 and {r["status"] for r in rows.values()} == {"done"}
    check_evidence_complete(sweep_dir, set(rows))
    restarted = []
    for run_id in rows:
        ev = check_rows_exactly_once(sweep_dir / run_id)
        assert {r["status"] for r in ev["rollouts"]} == {"ok"}  # in-flight rollouts were sent again
        if any(e["kind"] == "container_restarted" for e in ev["events"]):
            restarted.append(run_id)
    assert restarted, "no run saw the container die"
    (log,) = (sweep_dir / "logs").glob("*container-chaos_small*.log")
    assert log.read_text().count("chaos: exiting after 150 rollouts") == 1
    # one restart for the one death, said on the console: every run's request found it answering again
    assert out.stdout.count("restarted the container at") == 1, out.stdout[-3000:]


# ---------------------------------------------------------------- the driver is killed


def test_the_driver_killed_alone_then_started_again(tmp_path, data_dir) -> None:
    """`kill -9` of the driver process only (not its group), with 5% container faults;
    then the same command again: every run once, finished ones not redone, no partial file,
    no duplicated row, failed rollouts recorded once with their error."""
    configs = sweep_configs(tmp_path / "configs", fault_rate=0.05)
    evidence = tmp_path / "evidence"
    sweep_dir = evidence / "smoke"
    overrides = (f"hydra.searchpath=[file://{configs}]", "sweep.containers=[chaos_small]", "sweep.seeds=[0,1,2,3,4,5]",
                 "budget.max_rollouts=80")
    sweep = SweepProcess(evidence, data_dir, *overrides, log=tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 240
        while not manifests(sweep_dir):
            assert time.monotonic() < deadline and sweep.proc.poll() is None, sweep.output()[-3000:]
            sweep.snapshot()
            time.sleep(0.1)
        tree = sweep.snapshot()
        os.kill(sweep.proc.pid, signal.SIGKILL)
        sweep.proc.wait(30)
        # what the driver started in its own sessions (containers, model servers) follows it
        services = {pid: v for pid, v in tree.items() if v[0] == pid}
        left = wait_gone(services, 30)
        assert services and left == {}, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]
        kill_all(tree)  # Ray's processes: whatever is left, so later tests have the machine
    finally:
        sweep.close()
    # read once every writer is gone: a worker outlives the driver briefly and may finish a
    # run, done, or failed (its gateway died with the driver), which the next start redoes
    finished_before = {run_id for run_id in manifests(sweep_dir)
                       if json.loads((sweep_dir / run_id / "manifest.json").read_text())["status"] == "done"}
    assert len(finished_before) < 6, "the sweep finished before it could be killed"
    assert still_alive(sweep.seen) == {}
    second = run_sweep(evidence, data_dir, *overrides)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    grid = {g["run_id"] for g in json.loads((sweep_dir / "sweep.json").read_text())["grid"]}
    rows = index_rows(sweep_dir)
    assert sorted(r["run_id"] for r in rows) == sorted(grid) and len(grid) == 6  # each run once
    status = {r["run_id"]: r["status"] for r in rows}
    assert {i for i, s in status.items() if s == "skipped"} == finished_before  # not redone
    assert set(status.values()) == {"done", "skipped"}
    check_evidence_complete(sweep_dir, grid)
    failed_rows = 0
    for run_id in grid:
        ev = check_rows_exactly_once(sweep_dir / run_id)
        failed_rows += sum(r["status"] != "ok" for r in ev["rollouts"])
    assert failed_rows > 0  # the faults were there, and each failed rollout is one row


# ---------------------------------------------------------------- the evidence disk


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (unmounted afterwards)."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "size=64k")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave_bytes: int) -> Path:
    """Fill `disk` with one file until about `leave_bytes` are free."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    filler.write_bytes(b"\0" * max(0, free - leave_bytes))
    return filler


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("free_kib", [4, 16, 24])
def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_file(tiny_disk, free_kib, data_dir, banking77_url,
                                                                  scripted_policy) -> None:
    """With 4, 16 or 24 KiB free, the disk fills at a different point; each time: a
    HarnessError naming the file and the cause, and nothing of the run left but, when it
    fitted, the run's whole checkpoint (a re-run with space resumes from it)."""
    fill(tiny_disk, free_kib * 1024)
    spec = small_spec(container_spec("banking77", data_dir), tiny_disk / "evidence", budget=30)
    with pytest.raises(HarnessError) as caught:
        execute(spec, banking77_url, scripted_policy.base_url)
    message = str(caught.value)
    # the run writes into its staging folder and is swapped in only when whole
    staged = re.escape(f"{tiny_disk}/evidence/local/.staging/{spec.run_id}-")
    assert re.match(rf"cannot write evidence {staged}[0-9a-f]+/\w+\.(parquet|json): ", message), message
    assert "No space left on device" in message and "\n" not in message
    checkpoint = f"evidence/local/.checkpoints/{spec.run_id}.json"
    assert set(files_under(tiny_disk)) - {checkpoint} == {"filler"}  # no table, no manifest, no temporary file
    assert not (tiny_disk / "evidence" / "local" / spec.run_id).exists()
    if (tiny_disk / checkpoint).exists():
        assert CheckpointStore(EvidenceLocation(str(tiny_disk / "evidence"), "local", spec.run_id),
                               spec.run_id).load() is not None


def test_a_full_disk_keeps_the_previous_sweep_index(tiny_disk) -> None:
    store = SweepStore(str(tiny_disk / "evidence"), "s")
    row = {"run_id": "r0", "status": "done", "seed": 0, "attempts": 1}
    store.write_index([row])
    fill(tiny_disk, 4096)
    many = [{**row, "run_id": f"r{i}", "error": os.urandom(64).hex()} for i in range(2000)]
    with pytest.raises(HarnessError, match=r"cannot write .*/s/index.parquet: .*No space left on device"):
        store.write_index(many)
    assert files_under(tiny_disk) == ["evidence/s/index.parquet", "filler"]
    assert pq.read_table(tiny_disk / "evidence" / "s" / "index.parquet").to_pylist()[0]["run_id"] == "r0"


def test_a_read_only_evidence_disk_fails_before_any_rollout(tmp_path, data_dir, banking77_url) -> None:
    """As root, directory permissions do not stop a write (test_evidence.py skips that
    case); a read-only mount does."""
    disk = tmp_path / "ro"
    _mount_tmpfs(disk, "ro,size=64k")
    try:
        with ScriptedModelThread("rules") as policy:
            with pytest.raises(HarnessError, match=r"^evidence directory .*/ro/local is not writable: .*Read-only"):
                execute(small_spec(container_spec("banking77", data_dir), disk, budget=10), banking77_url,
                       policy.base_url)
            assert asyncio.run(_served(policy.stats_url)) == 0  # no rollout, no proposal
        assert files_under(disk) == []
        with pytest.raises(HarnessError, match="is not writable"):
            EvidenceLocation(str(disk), "s", "r").check_writable()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


async def _served(stats_url: str) -> int:
    import httpx

    async with httpx.AsyncClient() as client:
        return (await client.get(stats_url)).json()["total"]


def test_an_index_carried_into_a_later_invocation_names_no_run_running(tmp_path) -> None:
    """An invocation stopped mid-sweep leaves runs `running` in the index; a later one with
    other runs keeps those rows as still to do, and a run that failed early with its cause."""
    first = SweepStore(str(tmp_path), "s")
    first.write_index([{"run_id": "a", "status": "running", "seed": 0, "attempts": 1},
                       {"run_id": "b", "status": "failed", "error": "container exited with code 3", "seed": 1,
                        "attempts": 1, "axes_json": '{"seed": "1"}', "identity_json": '{"seed": 1}'},
                       {"run_id": "c", "status": "done", "seed": 2, "attempts": 1, "evidence_dir": "/e/s/c"}])
    later = SweepStore(str(tmp_path), "s")
    assert later.earlier_runs({"c"}) == {"b": {"axes": {"seed": "1"}, "identity": {"seed": 1}}}
    later.write_index([{"run_id": "c", "status": "skipped", "seed": 2, "attempts": 0}])
    rows = {r["run_id"]: r for r in pq.read_table(tmp_path / "s" / "index.parquet").to_pylist()}
    assert {k: r["status"] for k, r in rows.items()} == {"a": "pending", "b": "failed", "c": "skipped"}
    assert rows["b"]["error"] == "container exited with code 3"


def test_a_carried_row_of_a_run_left_pending_takes_the_status_its_manifest_records(tmp_path) -> None:
    """A driver stopped after a run's evidence was swapped in but before its index write
    leaves the run pending in the index; a later invocation that does not plan the run
    carries the status the run's manifest records, not the stale one. A done or skipped
    row is kept as the index has it."""
    SweepStore(str(tmp_path), "s").write_index(
        [{"run_id": "a", "status": "pending", "seed": 0, "attempts": 1},
         {"run_id": "b", "status": "skipped", "seed": 1, "attempts": 0, "evidence_dir": "/e/s/b"}])
    later = SweepStore(str(tmp_path), "s")
    later.earlier_runs(set())
    from_manifests = {run_id: {"run_id": run_id, "status": "done", "seed": seed, "attempts": None, "best_heldout": 0.5,
                               "evidence_dir": later.run_location(run_id).run_dir} for run_id, seed in (("a", 0), ("b", 1))}
    later.adopt(from_manifests)
    later.write_index([])
    rows = {r["run_id"]: r for r in pq.read_table(tmp_path / "s" / "index.parquet").to_pylist()}
    assert (rows["a"]["status"], rows["a"]["best_heldout"], rows["a"]["evidence_dir"]) == (
        "done", 0.5, later.run_location("a").run_dir)
    assert (rows["b"]["status"], rows["b"]["attempts"]) == ("skipped", 0)


def test_a_run_whose_manifest_cannot_be_read_is_named_not_dropped_in_silence(tmp_path) -> None:
    store = SweepStore(str(tmp_path), "s")
    (tmp_path / "s" / "r1").mkdir(parents=True)
    (tmp_path / "s" / "r1" / "manifest.json").write_text('{"status": "do')  # cut short
    assert store.earlier_runs(set()) == {}
    assert list(store.unreadable) == ["r1"] and store.unreadable["r1"]


def test_the_sweep_records_the_solved_thresholds_of_earlier_invocations_runs_too(data_dir) -> None:
    """The report's coverage of a task reads its threshold from sweep.json: a later
    invocation over other containers keeps those of the runs it does not plan."""
    spec = small_spec(container_spec("heart_disease", data_dir, solved_threshold=0.9), str(data_dir))
    earlier = {"r1": {"spec": {"container": {"name": "hotpotqa", "solved_threshold": 0.8}}},
               "r2": {"spec": {"container": {"name": "heart_disease", "solved_threshold": 0.5}}},
               "r3": {"axes": {"seed": "1"}, "identity": {"seed": 1}}}  # failed before writing evidence
    assert solved_thresholds([spec], earlier) == {"heart_disease": 0.9, "hotpotqa": 0.8}


def test_a_carried_row_names_the_evidence_where_the_sweep_folder_is_now(tmp_path) -> None:
    """A sweep folder copied elsewhere (another clone, another machine): its index's rows of
    earlier runs name their evidence in the copy, not the path they were first written at."""
    SweepStore(str(tmp_path / "first"), "s").write_index(
        [{"run_id": "c", "status": "done", "seed": 2, "attempts": 1, "evidence_dir": str(tmp_path / "first/s/c")},
         {"run_id": "d", "status": "failed", "seed": 3, "attempts": 1, "error": "no evidence", "evidence_dir": None}])
    shutil.copytree(tmp_path / "first", tmp_path / "copy")
    later = SweepStore(str(tmp_path / "copy"), "s")
    later.earlier_runs(set())
    later.write_index([])
    rows = {r["run_id"]: r for r in pq.read_table(tmp_path / "copy" / "s" / "index.parquet").to_pylist()}
    assert rows["c"]["evidence_dir"] == later.run_location("c").run_dir
    assert rows["c"]["evidence_dir"].startswith(str(tmp_path / "copy")) and rows["d"]["evidence_dir"] is None


def test_a_driver_killed_mid_write_leaves_no_temporary_for_the_next(tmp_path) -> None:
    """SIGKILL between atomic_write's temporary and its move leaves `.index.parquet.<id>.tmp`
    (or one inside check_writable, its probe); the next driver, holding the folder, deletes
    those of its own files and nothing else: a run's checkpoint temporaries are the run's."""
    sweep = tmp_path / "s"
    sweep.mkdir()
    dead = [sweep / ".index.parquet.0123abcd.tmp", sweep / ".sweep.json.4567ef.tmp", sweep / ".write-probe-89ab"]
    kept = [sweep / "notes.tmp", sweep / "index.parquet", sweep / "run" / ".manifest.json.89ab.tmp",
            sweep / ".checkpoints" / ".r1.json.cdef.tmp"]
    for path in dead + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    store = SweepStore(str(tmp_path), "s")
    with store.held():
        store.drop_dead_temporaries()
    assert [p.exists() for p in dead] == [False, False, False] and all(p.exists() for p in kept)


def test_a_run_killed_while_it_saved_its_checkpoint_leaves_no_temporary(tmp_path) -> None:
    """The run's next start deletes its own checkpoint temporaries as it loads; another
    run's (perhaps being written now) stay."""
    checkpoints = tmp_path / "s" / ".checkpoints"
    checkpoints.mkdir(parents=True)
    own, other = checkpoints / ".r1.json.0123abcd.tmp", checkpoints / ".r2.json.4567ef01.tmp"
    for path in (own, other):
        path.write_bytes(b'{"version": 1, "run_id": "r1"')
    assert CheckpointStore(EvidenceLocation(str(tmp_path), "s", "r1"), "r1").load() is None
    assert not own.exists() and other.exists()


def test_a_second_driver_of_a_sweep_stops_before_it_writes(tmp_path, data_dir) -> None:
    """While one driver holds the sweep folder, the same sweep started again is one error
    line naming the folder, and the folder is as it was; once the first lets go, it runs."""
    evidence = tmp_path / "evidence"
    store = SweepStore(str(evidence), "smoke")
    overrides = ("sweep.containers=[banking77]", "sweep.seeds=[0]", "budget.max_rollouts=20")
    with store.held():
        second = run_sweep(evidence, data_dir, *overrides, timeout=120)
        assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
        errors = [line for line in second.stdout.splitlines() if line.startswith("error:")]
        assert errors == [f"error: sweep folder {store.dir} is in use by another sweep driver or a run of `python "
                          "-m harness`; wait for it to end, or give this sweep another name"], second.stdout[-3000:]
        assert sorted(p.name for p in (evidence / "smoke").iterdir()) in ([], ["logs"])
    assert run_sweep(evidence, data_dir, *overrides).returncode == 0
    assert [r["status"] for r in index_rows(evidence / "smoke")] == ["done"]


def test_a_sweep_driver_and_a_single_run_never_run_in_one_folder_at_once(tmp_path, data_dir) -> None:
    """`python -m harness` runs in the sweep folder `local` and holds it shared with other
    single runs: a sweep driver of that folder, which runs its runs without their own locks,
    stops with one line while such a run runs, and a single run stops with one line while
    a driver holds the folder; neither starts anything."""
    evidence = tmp_path / "evidence"
    folder = evidence / "local"
    with EvidenceLocation(str(evidence), "local", "0123456789abcdef").held():  # as `python -m harness` holds its run
        sweep = run_sweep(evidence, data_dir, "sweep.name=local", "sweep.containers=[banking77]", "sweep.seeds=[0]",
                          "budget.max_rollouts=20", timeout=120)
    assert sweep.returncode == 2, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    errors = [line for line in sweep.stdout.splitlines() if line.startswith("error:")]
    assert errors == [f"error: sweep folder {folder} is in use by another sweep driver or a run of `python -m "
                      "harness`; wait for it to end, or give this sweep another name"], sweep.stdout[-3000:]
    with SweepStore(str(evidence), "local").held():
        single = run_cli("models=scripted", "budget.max_rollouts=20", f"evidence_root={evidence}",
                         f"data_dir={data_dir}")
    assert single.returncode == 2, single.stdout[-3000:] + single.stderr[-3000:]
    errors = [line for line in single.stdout.splitlines() if line.startswith("error:")]
    assert errors == [f"error: sweep folder {folder} is in use by a sweep driver; wait for it to end"], \
        single.stdout[-3000:]
    assert "starting container" not in single.stdout
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) in ([], ["logs"])
