"""Our GEPA with parallel proposals, against the real banking77 container and the scripted
model: the first iterations start while the seed is scored, and beside one another an
iteration starts only when its child could still be scored on the pareto pool. (Budget and
no-repeat guarantees of the parallel loop are in test_gepa.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import polars as pl
import pytest

from conftest import container_spec, execute, make_run_spec, read_evidence
from harness.context import OPTIMIZATION_STAGES
from servers import ScriptedModelThread
from test_gepa import HELDOUT, bank  # noqa: F401  (the module-scoped fixture of steerable rows)

UNSCORABLE = "cannot score it on the pareto pool"


@pytest.fixture(scope="module")
def slow_policy() -> Iterator[ScriptedModelThread]:
    """The `rules` policy with every answer 0.2 s late, so a rollout's span is long enough to
    tell what ran beside what."""
    with ScriptedModelThread("rules?latency_s=0.2") as server:
        yield server


def parallel_run(tmp_path: Path, data_dir: Path, container_url: str, policy_url: str, bank: dict[str, Any], *,
                 max_rollouts: int, parallel: int) -> dict[str, Any]:
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=bank["wide"][:12],
                         pareto=bank["wide"][20:25], heldout=HELDOUT, max_rollouts=max_rollouts,
                         params={"minibatch_size": 3, "parallel_proposals": parallel})
    spec = spec.model_copy(update={"concurrency": 3 * parallel})
    outcome = execute(spec, container_url, policy_url)
    assert outcome.status == "done", outcome.error
    return read_evidence(outcome.evidence_dir)


def spans(ev: dict[str, Any]) -> pl.DataFrame:
    return (ev["rollouts"].filter(pl.col("stage").is_in(list(OPTIMIZATION_STAGES)))
            .with_columns(started_s=pl.col("elapsed_s") - pl.col("latency_s")))


def test_first_iterations_start_while_the_seed_is_scored(tmp_path, data_dir, banking77_url, slow_policy,
                                                         bank) -> None:
    ev = parallel_run(tmp_path, data_dir, banking77_url, slow_policy.base_url, bank, max_rollouts=60, parallel=4)
    rows = spans(ev)
    seed_done = rows.filter(pl.col("stage") == "seed")["elapsed_s"].max()
    first_minibatch = rows.filter(pl.col("stage") == "minibatch")["started_s"].min()
    assert first_minibatch < seed_done


@pytest.mark.parametrize("budget", [40, 61, 100])
def test_beside_others_an_iteration_starts_only_if_its_child_could_be_scored(tmp_path, data_dir, banking77_url,
                                                                             scripted_policy, bank,
                                                                             budget: int) -> None:
    ev = parallel_run(tmp_path, data_dir, banking77_url, scripted_policy.base_url, bank, max_rollouts=budget,
                      parallel=4)
    proposals = ev["proposals"]
    assert len(proposals) >= 2
    assert not proposals["error"].drop_nulls().str.contains(UNSCORABLE).any()
    spent = len(spans(ev))
    assert spent <= budget and ev["manifest"]["stop_reason"] == "max_rollouts"
    # it stops when a whole iteration (parent and child minibatches, 3 + 3, and the pareto pool, 5) no longer fits
    assert budget - spent < 3 + 3 + 5


@pytest.mark.parametrize("together", [True, False])
def test_a_turn_drawn_together_asks_its_whole_plan_in_one_round_trip(tmp_path, data_dir, banking77_url,
                                                                     scripted_policy, bank, together: bool) -> None:
    """The turn's plan is answer_guide then rules; the scripted proposer writes rule lines, so
    the first format screens out and the second changes the module, either way. Drawn together,
    both requests and their samples were in flight at once; one by one, never two calls."""
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=bank["wide"][:12],
                         pareto=bank["wide"][20:25], heldout=HELDOUT, max_rollouts=20,
                         params={"minibatch_size": 3, "edit_formats": ["answer_guide", "rules"],
                                 "examples_first": False, "proposal_samples": 2, "proposal_attempts": 2,
                                 "lines_wanted": 1, "sample_together": together})
    # a second per call: all four are surely in flight together when sent together
    with ScriptedModelThread("rules?latency_s=1") as proposer:
        outcome = execute(spec, banking77_url, scripted_policy.base_url, proposer.base_url)
        peak = httpx.get(proposer.stats_url, timeout=5).json()["peak_in_flight"]["proposer"]
    assert outcome.status == "done", outcome.error
    first = read_evidence(outcome.evidence_dir)["proposals"].sort("iteration").row(0, named=True)
    assert first["edit_format"] == "rules" and first["child_id"] is not None
    if together:
        assert peak == 4 and first["attempts"] == 4  # 2 requests x 2 samples, all at once
    else:
        assert peak == 1 and first["attempts"] == 3  # answer_guide's 2 samples, then 1 rules line was enough
