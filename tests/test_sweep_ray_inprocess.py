"""Sweeps' Ray parts in this process, on a local Ray: the shared endpoint limiter across
actors, the scheduler when a worker process dies mid-run, and container restarts served
off the driver's loop."""

from __future__ import annotations

import asyncio
import json
import io
import os
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from rich.console import Console

from harness.config import load_config, run_spec
from harness.container_keeper import RestartOutcome
from harness.run import RunOutcome
from harness.services import Endpoints
from harness.specs import RunSpec
from harness.sweep.limits import EndpointLimiter, HolderReleased, shared_gate
from harness.sweep.schedule import PlannedRun, RestartDesk, index_row, schedule
from harness.sweep.store import SweepStore
from harness.sweep.worker import SweepBoard

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(400)


def index_rows(sweep_dir: Path) -> list[dict]:
    return pq.read_table(sweep_dir / "index.parquet").to_pylist()


@pytest.fixture(scope="class")
def local_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.usefixtures("local_ray")
class TestInProcessRay:
    def test_twenty_gate_holders_never_exceed_the_limit(self):
        @ray.remote(num_cpus=0)
        class Tally:
            def __init__(self):
                self.now: dict[str, int] = {}
                self.peak: dict[str, int] = {}

            def enter(self, keys):
                for k in keys:
                    self.now[k] = self.now.get(k, 0) + 1
                    self.peak[k] = max(self.peak.get(k, 0), self.now[k])

            def leave(self, keys):
                for k in keys:
                    self.now[k] -= 1

            def peaks(self):
                return self.peak

        async def _hold(limiter, tally, keys):
            async with shared_gate(limiter, *keys)():
                await tally.enter.remote(keys)
                await asyncio.sleep(0.2)
                await tally.leave.remote(keys)

        @ray.remote(num_cpus=0)
        class Holders:  # gate holders in another process: the limit is shared across processes
            async def hold(self, limiter, tally, n, keys):
                await asyncio.gather(*(_hold(limiter, tally, keys) for _ in range(n)))

        limiter = EndpointLimiter.remote({"http://container": 3, "http://policy": 5})
        tally = Tally.remote()
        keys_a = ["http://container", "http://policy"]  # a rollout's gate: container and policy
        keys_b = ["http://policy"]  # a proposer-like gate on the policy key alone

        async def main():
            await asyncio.gather(
                *(_hold(limiter, tally, keys_a if i % 2 else keys_b) for i in range(10)),
                Holders.remote().hold.remote(limiter, tally, 5, keys_a),
                Holders.remote().hold.remote(limiter, tally, 5, keys_b),
            )

        asyncio.run(main())
        peaks = ray.get(tally.peaks.remote())
        # never passed (that the limits are reached is the next test's: here it hangs on timing)
        assert 1 <= peaks["http://container"] <= 3
        assert 1 <= peaks["http://policy"] <= 5
        assert ray.get(limiter.in_use.remote()) == {}

    def test_a_gate_fills_to_its_limit_and_no_further(self):
        """As many holders as a gate's limit, in two processes, are all inside at once (each
        stays until the room has been full: a limiter stricter than its limit would keep one
        out until the wait runs out); one more holder gets in only after."""
        @ray.remote(num_cpus=0)
        class Room:
            def __init__(self):
                self.now = self.peak = 0

            def enter(self):
                self.now += 1
                self.peak = max(self.peak, self.now)

            def leave(self):
                self.now -= 1

            def peaked(self):
                return self.peak

        async def _hold(limiter, room, keys, full):
            async with shared_gate(limiter, *keys)():
                await room.enter.remote()
                deadline = time.monotonic() + 60
                while await room.peaked.remote() < full:
                    assert time.monotonic() < deadline, "the gate let fewer holders in than its limit"
                    await asyncio.sleep(0.02)
                await room.leave.remote()

        @ray.remote(num_cpus=0)
        class Holders:
            async def hold(self, limiter, room, n, keys, full):
                await asyncio.gather(*(_hold(limiter, room, keys, full) for _ in range(n)))

        limiter = EndpointLimiter.remote({"http://container": 3, "http://policy": 5})
        for keys, limit in ((["http://container", "http://policy"], 3), (["http://policy"], 5)):
            room = Room.remote()

            async def main():
                await asyncio.gather(*(_hold(limiter, room, keys, limit) for _ in range(limit // 2 + 1)),
                                     Holders.remote().hold.remote(limiter, room, limit - limit // 2, keys, limit))

            asyncio.run(main())
            assert ray.get(room.peaked.remote()) == limit, keys
        assert ray.get(limiter.in_use.remote()) == {}

    def test_release_holder_frees_a_dead_holders_slots_once(self):
        limiter = EndpointLimiter.remote({"k": 2})
        assert ray.get([limiter.acquire.remote(["k"], "dead"), limiter.acquire.remote(["k"], "dead")]) == [True, True]
        waiting = limiter.acquire.remote(["k"], "alive")
        assert not ray.wait([waiting], timeout=0.5)[0]  # full
        assert ray.get(limiter.release_holder.remote("dead")) == 2
        assert ray.get(waiting, timeout=10) is True
        # the dead holder's late calls change nothing: no slot given twice, none taken
        ray.get(limiter.release.remote(["k"], "dead"))
        assert ray.get(limiter.acquire.remote(["k"], "dead"), timeout=10) is False
        assert ray.get(limiter.in_use.remote()) == {"k": 1}
        assert ray.get(limiter.acquire.remote(["k"], "other"), timeout=10) is True
        extra = limiter.acquire.remote(["k"], "third")
        assert not ray.wait([extra], timeout=0.5)[0]  # still a limit of 2
        ray.get(limiter.release_holder.remote("alive"))
        assert ray.get(extra, timeout=10) is True

        async def released_gate():
            async with shared_gate(limiter, "k", holder="dead")():
                pass

        with pytest.raises(HolderReleased):
            asyncio.run(released_gate())

    def test_a_gate_takes_all_its_keys_or_none(self):
        """One call takes a gate's slots key by key; a holder released while it waits for
        a later key gets none, and the earlier key's slot goes back."""
        limiter = EndpointLimiter.remote({"a": 1, "b": 1})
        assert ray.get(limiter.acquire.remote(["b"], "other"), timeout=10) is True
        waiting = limiter.acquire.remote(["a", "b"], "late")
        assert not ray.wait([waiting], timeout=0.5)[0]  # holds a, waits for b
        assert ray.get(limiter.in_use.remote()) == {"a": 1, "b": 1}
        assert ray.get(limiter.release_holder.remote("late")) == 1  # its slot of a
        ray.get(limiter.release.remote(["b"], "other"))
        assert ray.get(waiting, timeout=10) is False
        assert ray.get(limiter.in_use.remote()) == {}
        assert ray.get(limiter.acquire.remote(["a", "b"], "next"), timeout=10) is True

    def test_the_board_hands_each_restart_request_out_once(self):
        """A request the driver took is not listed again while it is served (nor after);
        a later request for the same container is. A ticket's answer is that of the restart
        that covered it: the request that got a new process is told so, though a request made
        meanwhile found that process answering; tickets no restart took get the next answer."""
        board = SweepBoard.remote()
        url = "http://container"
        first = ray.get(board.request_restart.remote(url))
        assert ray.get(board.take_restarts.remote()) == [(url, first)]
        assert ray.get(board.take_restarts.remote()) == []
        second = ray.get(board.request_restart.remote(url))
        assert ray.get(board.take_restarts.remote()) == [(url, second)]
        assert ray.get(board.restart_status.remote(url, first)) is None
        ray.get(board.restart_done.remote(url, first, '{"restarted": true}'))
        ray.get(board.restart_done.remote(url, second, '{"restarted": false}'))
        assert ray.get(board.restart_status.remote(url, first)) == '{"restarted": true}'
        assert ray.get(board.restart_status.remote(url, second)) == '{"restarted": false}'
        third, fourth = ray.get([board.request_restart.remote(url), board.request_restart.remote(url)])
        assert ray.get(board.take_restarts.remote()) == [(url, fourth)]
        ray.get(board.restart_done.remote(url, fourth, '{"error": "gone"}'))
        assert ray.get(board.restart_status.remote(url, third)) == '{"error": "gone"}'
        assert ray.get(board.take_restarts.remote()) == []

    def test_a_slow_container_restart_does_not_hold_the_driver_loop(self):
        """The driver's poll hands a run's restart request to the desk and returns while the
        container is still starting; the same request is not served twice, and the run gets
        the outcome once the restart is done."""
        board = SweepBoard.remote()
        started, release = threading.Event(), threading.Event()
        calls: list[str] = []

        def revive(url: str) -> bool:  # a container that takes its time to start
            calls.append(url)
            started.set()
            assert release.wait(60)
            return True

        try:
            with RestartDesk(board, revive, Console(file=io.StringIO())) as desk:
                ticket = ray.get(board.request_restart.remote("http://container"))
                desk.poll()
                assert started.wait(30)  # the restart is under way, and the poll has returned
                desk.poll()
                assert ray.get(board.restart_status.remote("http://container", ticket)) is None
                release.set()
                answer = None
                for _ in range(600):
                    answer = ray.get(board.restart_status.remote("http://container", ticket))
                    if answer is not None:
                        break
                    time.sleep(0.05)
                assert answer is not None and RestartOutcome.model_validate_json(answer).restarted
                desk.poll()  # served: nothing left to take
            assert calls == ["http://container"]
        finally:
            release.set()

    def test_ctrl_c_does_not_wait_for_a_restart_under_way(self):
        """Leaving the loop on an exception (Ctrl-C) does not wait for the restart; the
        services closing after it stop that container."""
        board = SweepBoard.remote()
        started, release, finished = threading.Event(), threading.Event(), threading.Event()

        def revive(url: str) -> bool:
            started.set()
            release.wait(60)
            finished.set()
            return True

        try:
            with pytest.raises(KeyboardInterrupt):
                with RestartDesk(board, revive, Console(file=io.StringIO())) as desk:
                    ray.get(board.request_restart.remote("http://container"))
                    desk.poll()
                    assert started.wait(30)
                    raise KeyboardInterrupt
            assert not finished.is_set()  # the desk let go while the restart was still under way
        finally:
            release.set()
        assert finished.wait(30)

    def test_dead_worker_is_retried_once_then_failed_and_frees_its_slots(self, tmp_path):
        """Seed 1's worker process dies holding endpoint slots, twice; seed 2's raises past the
        worker's handler. Both are recorded failed and the others finish; with a limit of one
        slot per endpoint, a slot leaked by the dead worker would starve every later run."""
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
            raw = OmegaConf.to_container(compose(config_name="config", overrides=[
                "models=scripted", f"evidence_root={tmp_path}", "ray.cpus_per_run=0.5", "ray.max_runs_in_flight=1"]),
                resolve=True)
        base = load_config(raw, base_dir=str(REPO))
        runs = [PlannedRun(spec=run_spec(base.model_copy(update={"seed": s}), sweep="death", axes={"seed": str(s)}),
                           max_error_rate=0.5) for s in (1, 0, 2, 3)]
        endpoints = Endpoints(container_url="http://container", policy_url="http://policy",
                              proposer_url="http://proposer")

        @ray.remote
        class DyingWorker:
            """RunWorker's interface; holds the rollout gate the way a run does."""

            def run(self, spec_json, endpoints_json, limiter, board, log_dir, max_error_rate, holder=None, **_: object):
                spec = RunSpec.model_validate_json(spec_json)
                ep = Endpoints.model_validate_json(endpoints_json)
                gate = shared_gate(limiter, ep.container_url, ep.policy_url, holder=holder)

                async def rollout():
                    async with gate():
                        if spec.seed == 1:
                            os._exit(1)  # the worker process dies mid-rollout
                        await asyncio.sleep(0.1)

                try:
                    asyncio.run(asyncio.wait_for(rollout(), 20))
                except asyncio.TimeoutError:
                    return RunOutcome(run_id=spec.run_id, status="failed", evidence_dir="",
                                      error="no endpoint slot within 20 s").model_dump_json()
                if spec.seed == 2:
                    raise ValueError("boom outside the worker's handler")
                return RunOutcome(run_id=spec.run_id, status="done", evidence_dir=f"{log_dir}/{spec.run_id}",
                                  rollouts=1).model_dump_json()

        limiter = EndpointLimiter.remote({"http://container": 1, "http://policy": 1})
        store = SweepStore(str(tmp_path), "death")
        rows = {r.spec.run_id: index_row(r.spec, "pending", None, 0) for r in runs}
        schedule(runs, {r.spec.run_id: endpoints for r in runs}, limiter, SweepBoard.remote(), base, store, rows,
                  tmp_path / "logs", Console(file=io.StringIO()), DyingWorker)

        by_seed = {row["seed"]: row for row in rows.values()}
        assert by_seed[1]["status"] == "failed" and by_seed[1]["attempts"] == 2
        assert by_seed[1]["error"].startswith("worker died twice")
        assert by_seed[2]["status"] == "failed" and "ValueError: boom" in by_seed[2]["error"]
        assert by_seed[0]["status"] == by_seed[3]["status"] == "done", by_seed
        assert ray.get(limiter.in_use.remote()) == {}
        on_disk = {r["seed"]: (r["status"], r["attempts"]) for r in index_rows(tmp_path / "death")}
        assert on_disk == {1: ("failed", 2), 0: ("done", 1), 2: ("failed", 1), 3: ("done", 1)}

    def test_a_worker_that_dies_after_its_run_is_in_place_leaves_the_run_done(self, tmp_path):
        """A forced sweep: seed 0 (no evidence before) and seed 2 (done evidence before) die
        right after their attempt's manifest is in place, and are recorded done from it
        without a second attempt; seed 1 (done evidence before) dies before writing any, and
        its old evidence does not count: it is retried, and done by its second attempt."""
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
            raw = OmegaConf.to_container(compose(config_name="config", overrides=[
                "models=scripted", f"evidence_root={tmp_path}", "ray.cpus_per_run=0.5", "ray.max_runs_in_flight=1",
                "force=true"]), resolve=True)
        base = load_config(raw, base_dir=str(REPO))
        runs = [PlannedRun(spec=run_spec(base.model_copy(update={"seed": s}), sweep="late", axes={"seed": str(s)}),
                           max_error_rate=0.5) for s in (0, 1, 2)]
        endpoints = Endpoints(container_url="http://container", policy_url="http://policy",
                              proposer_url="http://proposer")

        def manifest(attempt: str) -> str:
            return json.dumps({"status": "done", "files": {"rollouts.parquet": attempt}, "totals": {"rollouts": 7},
                               "seed_candidate_id": "c0000", "best_candidate_id": "c0003",
                               "heldout": [{"candidate_id": "c0000", "heldout_score": 0.25},
                                           {"candidate_id": "c0003", "heldout_score": 0.5}]})

        for run in runs[1:]:  # a forced redo's done evidence from before
            run_dir = tmp_path / "late" / run.spec.run_id
            run_dir.mkdir(parents=True)
            (run_dir / "manifest.json").write_text(manifest("before"))

        @ray.remote
        class LateDyingWorker:
            def run(self, spec_json, endpoints_json, limiter, board, log_dir, max_error_rate, **_: object):
                spec = RunSpec.model_validate_json(spec_json)
                run_dir = tmp_path / "late" / spec.run_id
                tried = run_dir / "tried"
                if spec.seed == 1 and not tried.exists():
                    tried.write_text("1")
                    os._exit(1)  # dies before its attempt writes anything
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / "manifest.json").write_text(manifest(f"attempt of seed {spec.seed}"))
                if spec.seed != 1:
                    os._exit(1)  # dies after its run's evidence is in place
                return RunOutcome(run_id=spec.run_id, status="done", evidence_dir=str(run_dir),
                                  rollouts=7, best_heldout=0.5).model_dump_json()

        limiter = EndpointLimiter.remote({})
        store = SweepStore(str(tmp_path), "late")
        rows = {r.spec.run_id: index_row(r.spec, "pending", None, 0) for r in runs}
        schedule(runs, {r.spec.run_id: endpoints for r in runs}, limiter, SweepBoard.remote(), base, store, rows,
                 tmp_path / "logs", Console(file=io.StringIO()), LateDyingWorker)

        by_seed = {row["seed"]: row for row in rows.values()}
        assert {s: (r["status"], r["attempts"]) for s, r in by_seed.items()} == {
            0: ("done", 1), 1: ("done", 2), 2: ("done", 1)}, by_seed
        assert by_seed[0]["evidence_dir"] == str(tmp_path / "late" / runs[0].spec.run_id)
        assert (by_seed[0]["rollouts"], by_seed[0]["seed_heldout"], by_seed[0]["best_heldout"]) == (7, 0.25, 0.5)
