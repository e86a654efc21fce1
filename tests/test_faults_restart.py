"""A container process that dies or hangs, through whole runs and the Services that
started it (the chaos container as a real child process, the scripted model): restarted
up to the Services' cap, or the run fails with the reason; two runs that find it dead
restart it once; a live but silent one is waited for before it is replaced; services that
close during a restart start nothing after, and a main process that dies takes its
process group with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from client_calls import call, request_for
from conftest import execute
from faults import chaos_spec, check_rows_exactly_once, small_cli_run, small_spec, stats
from harness.container_keeper import RestartOutcome
from harness.errors import HarnessError, PreflightError
from harness.processes import ManagedProcess, free_port
from harness.retry import RetryPolicy
from harness.run_state import Progress
from harness.services import Services

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------- the container process dies


def kill_at(url: str, *rollouts: int) -> Callable[[Progress], None]:
    """A run observer that SIGKILLs the chaos process answering at `url` each time the run
    has landed one of `rollouts` rollouts, and waits until the process is gone: from the
    run's own loop, so the run cannot finish first (a watcher thread polling the container
    lost that race on a fast machine)."""
    left = sorted(rollouts)

    def observe(progress: Progress) -> None:
        if not left or progress.rollouts < left[0]:
            return
        left.pop(0)
        pid = stats(url)["pid"]
        os.kill(pid, signal.SIGKILL)
        stat = Path(f"/proc/{pid}/stat")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # gone, or a zombie its parent has not reaped yet
            try:
                if stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
            except (FileNotFoundError, ProcessLookupError):
                return
            time.sleep(0.002)

    return observe


@pytest.mark.parametrize("kills", [(10,), (10, 20)], ids=["once", "twice"])
def test_a_container_killed_mid_run_is_restarted_and_the_run_finishes(data_dir, tmp_path, scripted_policy,
                                                                      kills) -> None:
    """Killed twice, it is restarted twice: whether to restart is the Services' call (their
    cap per container), so a sweep's run also outlives a second death of the container it
    shares with the others."""
    with Services(tmp_path / "logs") as services:
        spec_c = chaos_spec(data_dir)
        url = services.container_url(spec_c)
        first_pid = stats(url)["pid"]
        outcome = execute(small_spec(spec_c, tmp_path, budget=30), url, scripted_policy.base_url,
                         restart_container=services.restarter(url), observer=kill_at(url, *kills))
        assert services.restarts() == {url: len(kills)}
        assert stats(url)["pid"] != first_pid  # a new process, on the same url
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    # the rollouts in flight when it died were sent again after the restart: none failed
    assert {r["status"] for r in ev["rollouts"]} == {"ok"}
    kinds = [e["kind"] for e in ev["events"]]
    assert kinds.count("container_restart") == kinds.count("container_restarted") == len(kills)


def kill_until_refused(url: str) -> None:
    """SIGKILL the chaos process at `url` and wait until nothing listens there (a reset
    while the socket closes is not that yet)."""
    os.kill(stats(url)["pid"], signal.SIGKILL)
    for _ in range(100):
        try:
            httpx.get(f"{url}/health", timeout=1)
        except httpx.ConnectError:
            return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail("the killed container still answers")


def test_a_container_found_dead_at_preflight_is_restarted(data_dir, tmp_path, scripted_policy) -> None:
    """The process died between runs (e.g. under another run of a sweep): this run's
    preflight finds nothing listening, restarts it, and the run goes ahead."""
    with Services(tmp_path / "logs") as services:
        spec_c = chaos_spec(data_dir)
        url = services.container_url(spec_c)
        kill_until_refused(url)
        outcome = execute(small_spec(spec_c, tmp_path, budget=20), url, scripted_policy.base_url,
                         restart_container=services.restarter(url))
        assert services.restarts() == {url: 1}
    assert outcome.status == "done", outcome.error
    ev = check_rows_exactly_once(outcome.evidence_dir)
    kinds = [e["kind"] for e in ev["events"]]
    assert kinds[:3] == ["start", "container_restart", "container_restarted"]
    assert "GET /health failed (transient): ConnectError" in json.loads(ev["events"][1]["data_json"])["error"]


def test_of_two_runs_that_found_it_dead_one_restarts_it_and_the_other_records_no_restart(
        data_dir, tmp_path, scripted_policy) -> None:
    """Two runs sharing a container both find it dead: the first one's request restarts it;
    the second's finds it answering, and its evidence says so instead of a restart."""
    from harness.client import ContainerClient
    from harness.container_keeper import ContainerKeeper

    with Services(tmp_path / "logs") as services:
        url = services.container_url(chaos_spec(data_dir))
        task = call(url, lambda c: c.tasks("train", ["train:0"]))[0].model_dump()
        seed = call(url, lambda c: c.program()).seed_candidate
        kill_until_refused(url)

        async def both() -> list[list[str]]:
            events: list[list[str]] = [[], []]
            # one attempt each: both are refused before either asks for the restart (with
            # retries, the second would only find the restarted container answering)
            clients = [ContainerClient(url, retry=RetryPolicy(attempts=1)) for _ in events]
            keepers = [ContainerKeeper(client, "chaos", services.restarter(url),
                                       lambda kind, message, log=log, **data: log.append(kind))
                       for client, log in zip(clients, events)]
            try:
                answers = await asyncio.gather(*(keeper.send(request_for(f"r{i}", seed, task, scripted_policy.base_url),
                                                             []) for i, keeper in enumerate(keepers)))
            finally:
                await asyncio.gather(*(client.aclose() for client in clients))
            assert [a.status for a in answers] == ["ok", "ok"]
            return events

        events = asyncio.run(both())
        assert services.restarts() == {url: 1}
    assert sorted(events) == [["container_restart", "container_answering"], ["container_restart", "container_restarted"]]


@pytest.mark.parametrize("silent_s", [3.0, None], ids=["busy", "hung"])
def test_a_restart_asked_of_a_live_container_waits_for_it_to_answer(data_dir, tmp_path, silent_s) -> None:
    """A restart asked for while the process lives but does not answer (stopped with SIGSTOP:
    from outside, a fresh process swamped by every run's retries looks the same). Silent for
    3 s, past one 2 s health probe, it is left alone once it answers within its startup
    timeout; silent for good, it is replaced."""
    with Services(tmp_path / "logs") as services:
        url = services.container_url(chaos_spec(data_dir, startup_timeout_s=20))
        pid = stats(url)["pid"]
        os.kill(pid, signal.SIGSTOP)
        wake = threading.Timer(silent_s, os.kill, (pid, signal.SIGCONT)) if silent_s else None
        if wake:
            wake.start()
        try:
            restarted = services.revive(url)
        finally:
            if wake:
                wake.join()
        assert restarted is (silent_s is None)
        if silent_s:
            assert services.restarts() == {} and stats(url)["pid"] == pid
        else:
            assert services.restarts() == {url: 1} and stats(url)["pid"] != pid


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def test_a_service_whose_main_process_died_takes_what_it_started_with_it(tmp_path) -> None:
    """A wrapper command whose main process is gone (it crashed, or its parent-death signal
    came first) leaves its children in the process group; once the harness sees the main
    process gone, the group goes too (a restart on the same port would find it taken)."""
    child = "import time; time.sleep(300)"
    wrapper = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(300)"
    service = ManagedProcess("wrapper", [sys.executable, "-c", wrapper], health_url="http://127.0.0.1:9/health",
                             log_path=tmp_path / "wrapper.log")
    service.spawn()
    leader = service.pid
    assert leader is not None
    try:
        deadline = time.monotonic() + 30
        while len(_group_members(leader)) < 2:  # the wrapper and its child
            assert time.monotonic() < deadline, _group_members(leader)
            time.sleep(0.05)
        os.kill(leader, signal.SIGKILL)
        while service.alive():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while _group_members(leader):
            assert time.monotonic() < deadline, _group_members(leader)
            time.sleep(0.05)
        service.stop()  # nothing left to stop
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGKILL)


def test_services_that_close_during_a_restart_start_nothing_after(data_dir, tmp_path) -> None:
    """A sweep stopped (Ctrl-C) while its driver restarts a hung container on another thread:
    the services close, the restart under way gives up, and no new container comes up on
    the port after them."""
    services = Services(tmp_path / "logs")
    try:
        url = services.container_url(chaos_spec(data_dir, startup_timeout_s=120))
        os.kill(stats(url)["pid"], signal.SIGSTOP)  # hung: alive, answering nothing
        outcome: list[RestartOutcome] = []
        restart = threading.Thread(target=lambda: outcome.append(RestartOutcome.of(services.revive, url)))
        restart.start()
        deadline = time.monotonic() + 30
        while not services._restart_lock.locked():  # the restart is under way
            assert time.monotonic() < deadline and restart.is_alive()
            time.sleep(0.01)
        services.close()
        restart.join(60)  # it ends once the services are closed, not after the 120 s startup wait
        assert not restart.is_alive()
        assert outcome[0].error is not None and "stopping" in outcome[0].error, outcome
        assert services.restarts() == {}
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        services.close()


@pytest.mark.parametrize("case", ["dies_again", "attached", "no_restarts_left"])
def test_a_container_that_cannot_be_restarted_fails_the_run_cleanly(data_dir, tmp_path, scripted_policy, case) -> None:
    """--die-after 6: the process exits at its 7th rollout request, and again after each
    restart, until the Services that started it stop restarting it (3 restarts)."""
    with Services(tmp_path / "logs", max_restarts=0 if case == "no_restarts_left" else 3) as services:
        started = chaos_spec(data_dir, "--die-after", "6")
        url = services.container_url(started)
        spec_c = started
        attaching = Services(tmp_path / "attached-logs")
        if case == "attached":  # the same process, attached by url: not this harness's to restart
            spec_c = started.model_copy(update={"command": None, "url": url})
            attaching.container_url(spec_c)
            hook = attaching.restarter(url)
        else:
            hook = services.restarter(url)
        with attaching:
            outcome = execute(small_spec(spec_c, tmp_path, budget=30), url, scripted_policy.base_url,
                             restart_container=hook)
    assert outcome.status == "failed"
    expected = {
        "dies_again": f"container chaos stopped answering and the restart failed: container chaos at {url} "
                      "died again after 3 restart(s): not restarting it",
        "attached": "container chaos stopped answering and cannot be restarted (attached by url, not started by "
                    "the harness: start it again, then rerun): POST /rollout failed (transient): ConnectError",
        "no_restarts_left": f"container chaos stopped answering and the restart failed: container chaos at {url} "
                            "died again after 0 restart(s): not restarting it",
    }[case]
    assert outcome.error == expected
    ev = check_rows_exactly_once(outcome.evidence_dir)
    assert ev["manifest"]["status"] == "failed" and ev["manifest"]["error"] == expected
    failed = [r for r in ev["rollouts"] if r["status"] != "ok"]
    assert failed and all("ConnectError" in r["error"] for r in failed)


def _refuse(url: str) -> bool:
    raise PreflightError(f"container at {url} is attached, not started by the harness")


def _crash(url: str) -> bool:
    raise OSError(f"cannot start {url}")


def test_a_restart_outcome_carries_any_failure_of_the_restart_to_the_run_as_its_error() -> None:
    """However the owner of the container fails to restart it (a refusal or a crash), the
    outcome that travels back to the run names the cause, and the run's hook raises it as a
    HarnessError (the container is then lost, the run fails cleanly)."""
    cases = {_refuse: "container at u is attached, not started by the harness", _crash: "OSError: cannot start u"}
    for revive, error in cases.items():
        outcome = RestartOutcome.model_validate_json(RestartOutcome.of(revive, "u").model_dump_json())
        assert outcome == RestartOutcome(restarted=False, error=error)
        with pytest.raises(HarnessError) as raised:
            outcome.restarted_or_raise()
        assert str(raised.value) == error
    assert RestartOutcome.of(lambda url: True, "u").restarted_or_raise() is True
    assert RestartOutcome.of(lambda url: False, "u").restarted_or_raise() is False


def test_the_cli_restarts_a_container_that_dies(tmp_path, data_dir) -> None:
    """`python -m harness container=chaos` whose process exits mid-run: restarted, run done."""
    evidence = tmp_path / "evidence"
    # the first process dies at its 20th rollout; the run needs at most 24 + 8 in all, so the
    # restarted one never reaches 20 whatever the order of answers
    command = "['python','-m','benchmarks.containers.chaos','--die-after','20']"
    ev = small_cli_run(evidence, data_dir, "container=chaos", f"container.command={command}")
    assert ev["manifest"]["status"] == "done"
    assert [e["kind"] for e in ev["events"]].count("container_restarted") == 1
    logs = "".join(p.read_text() for p in (evidence / "local" / "logs").glob("*container-chaos*.log"))
    assert "chaos: exiting after 20 rollouts" in logs
    assert 0 < ev["manifest"]["totals"]["rollouts"] <= 24


def test_service_ports_come_from_below_the_ephemeral_range() -> None:
    """Outgoing connections draw their local ports from the ephemeral range: a service port
    taken from there could be taken by a run's rollout connection before the service binds
    it, or while a dead container's port waits for its restart."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if ephemeral < 21000:
        pytest.skip(f"this machine's ephemeral ports start at {ephemeral}: no room below them")
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40 and all(20000 <= port < ephemeral for port in ports)
