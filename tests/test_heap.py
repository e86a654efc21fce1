"""A run's process leaves what was alive when the run began out of the garbage collector's
passes while the run optimizes, and gives it back when the run ends (the effect on a run's
rate is measured by benchmarks/perf/overhead.py, not here)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from conftest import container_spec, make_run_spec
from harness.heap import HeapFreeze
from harness.run import run_sync
from harness.services import Endpoints


def test_runs_in_flight_together_share_one_freeze_until_the_last_releases() -> None:
    assert gc.get_freeze_count() == 0
    first, second = HeapFreeze(), HeapFreeze()
    try:
        first.hold()
        assert gc.get_freeze_count() > 0
        second.hold()
        first.release()
        first.release()  # a second release of the same hold counts for nothing
        # (a count, not a comparison with the first: frozen objects are still freed meanwhile)
        assert gc.get_freeze_count() > 0
        second.release()
        assert gc.get_freeze_count() == 0
    finally:
        first.release()
        second.release()


def test_a_run_optimizes_with_the_heap_frozen_and_leaves_it_unfrozen(
        banking77_url: str, scripted_policy: Any, data_dir: Path, tmp_path: Path) -> None:
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=[f"train:{i}" for i in range(8)],
                         pareto=[f"train:{i}" for i in range(8, 12)], heldout=["test:0"], max_rollouts=16)
    endpoints = Endpoints(container_url=banking77_url, policy_url=scripted_policy.base_url,
                          proposer_url=scripted_policy.base_url)
    frozen_while_running: list[int] = []
    outcome = run_sync(spec, endpoints, observer=lambda _: frozen_while_running.append(gc.get_freeze_count()))
    assert outcome.status == "done" and outcome.rollouts > 0
    assert frozen_while_running and min(frozen_while_running) > 0
    assert gc.get_freeze_count() == 0
