"""Our GEPA against the real banking77 container, with the scripted model as policy and
proposer (`rules`, or `queue` for exact control of every proposal), through
harness.run.execute_run; plus unit tests of the Pareto frontier (the proposer's edits and
screen are in test_gepa_proposer.py)."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from algorithms.gepa.pareto import ParetoFrontier
from conftest import container_spec, execute, make_run_spec, read_evidence
from harness.client import ContainerClient
from harness.context import OPTIMIZATION_STAGES
from harness.evidence.schema import TIMING_COLUMNS
from servers import ScriptedModelThread

HELDOUT = ["test:0", "test:1", "test:2"]
EXACT = {"minibatch_size": 4, "edit_formats": ["rewrite"], "proposal_attempts": 1, "proposal_samples": 1,
         "proposer_max_tokens": 4000}

# ---------------------------------------------------------------- Pareto frontier (unit)


def frontier(**scores: list[float]) -> ParetoFrontier:
    width = len(next(iter(scores.values())))
    front = ParetoFrontier(tuple(f"train:{i}" for i in range(width)))
    for candidate_id, rewards in scores.items():
        front.add(candidate_id, rewards)
    return front


def test_fronts_are_the_per_row_leaders() -> None:
    front = frontier(a=[1, 0, 0, 0.5], b=[1, 1, 0, 0.2], c=[0, 0, 1, 0.5])
    assert front.fronts() == [{"a", "b"}, {"b"}, {"c"}, {"a", "c"}]


def test_dominated_candidates_are_removed() -> None:
    # a leads row 0 only, b leads rows 0 and 1: a is dominated; c leads row 2 alone
    front = frontier(a=[1, 0, 0], b=[1, 1, 0], c=[0, 0, 1], d=[0, 0, 0.5])
    assert front.non_dominated() == {"b": 2, "c": 1}
    # equal rows: neither dominates the other, both stay
    assert frontier(a=[1, 0], b=[1, 0], c=[0, 1]).non_dominated() == {"a": 1, "b": 1, "c": 1}
    # all zero: everyone ties on every row
    assert frontier(a=[0, 0], b=[0, 0]).non_dominated() == {"a": 2, "b": 2}


def test_sampling_weights_follow_rows_led() -> None:
    front = frontier(a=[1, 0, 0], b=[1, 1, 0], c=[0, 0, 1])
    rng = random.Random(7)
    draws = Counter(front.sample(rng) for _ in range(6000))
    assert set(draws) == {"b", "c"}  # the dominated candidate is never a parent
    assert draws["b"] / 6000 == pytest.approx(2 / 3, abs=0.03)
    # same seed, same draws
    assert [front.sample(random.Random(3)) for _ in range(5)] == [front.sample(random.Random(3)) for _ in range(5)]


def test_best_is_highest_mean_and_ties_go_to_the_earlier() -> None:
    assert frontier(a=[1, 0], b=[1, 1], c=[0, 1]).best() == "b"
    assert frontier(a=[0, 1], b=[1, 0], c=[0.5, 0.5]).best() == "a"
    assert frontier(c=[0.5, 0.5], a=[0, 1]).best() == "c"
    assert frontier(a=[0.25, 0.75]).mean("a") == 0.5


def test_a_mean_leaves_rewardless_rows_out_never_counting_them_as_zero() -> None:
    from harness.candidates import RolloutResult, mean_reward

    def row(reward: float | None) -> RolloutResult:
        return RolloutResult(candidate_id="c0", task_id="train:1", reward=reward,
                             status="ok" if reward is not None else "error", output="")

    assert mean_reward([row(1.0), row(1.0), row(None), row(None)]) == 1.0
    assert mean_reward([row(1.0), row(0.0), row(None)]) == 0.5
    assert mean_reward([row(None)]) is None and mean_reward([]) is None


def test_the_pick_is_contested_only_by_candidates_that_beat_the_seed() -> None:
    from algorithms.gepa.select import best_on_kept, contenders

    front = frontier(s=[1, 0, 0, 0], a=[1, 1, 0, 0], b=[0, 1, 1, 1], c=[1, 0, 0, 0], d=[1, 1, 1, 0])
    assert contenders(front, 2, "s") == ["b", "d", "s"]  # the two best means (ties to the earlier), then the seed
    assert contenders(frontier(s=[1, 1], a=[1, 0]), 2, "s") == []  # no child beat the seed: it is the pick
    # the kept rows alone decide: the leaders were chosen on the pareto rows, so those are biased
    assert best_on_kept(front, {"b": 0.0, "d": 0.25, "s": 0.5}) == "s"
    assert best_on_kept(front, {"b": None, "d": 0.0, "s": 0.25}) == "s"  # no reward on the kept rows: last
    # a tie on the kept rows goes to the better pareto mean (d 3/4 over the seed's 1/4), then to the earlier
    assert best_on_kept(front, {"b": 0.0, "d": 0.5, "s": 0.5}) == "d"
    assert best_on_kept(front, {"b": 0.5, "d": 0.5, "s": 0.0}) == "b"


def test_add_needs_one_reward_per_row() -> None:
    with pytest.raises(ValueError, match="one reward per pareto row"):
        frontier(a=[1, 0]).add("b", [1.0])


# ---------------------------------------------------------------- runs against banking77


@pytest.fixture(scope="module")
def bank(banking77_url: str) -> dict[str, Any]:
    """Rows the `rules` policy can be steered on exactly: a rule naming a row's whole text
    fires on that row alone. Rows whose label is the policy's fallback answer are left out."""

    async def go(client: ContainerClient) -> dict[str, Any]:
        program = await client.program()
        labels = (await client.taskset()).labels or []
        tasks = await client.tasks("train", [f"train:{i}" for i in range(120)])
        return {"seed": program.seed_candidate["stage2_system"], "labels": labels, "tasks": tasks}

    async def with_client() -> dict[str, Any]:
        client = ContainerClient(banking77_url)
        try:
            return await go(client)
        finally:
            await client.aclose()

    got = asyncio.run(with_client())
    rows = {t.task_id: t.model_dump() for t in got["tasks"]}
    usable = [i for i, r in rows.items()
              if '"' not in r["text"] and "\n" not in r["text"] and r["label"] != got["labels"][0]]
    usable = [i for i in usable if not any(rows[i]["text"] in rows[j]["text"] for j in usable if j != i)]
    return {"seed": got["seed"], "rows": rows, "train": usable[:8], "pareto": usable[8:12], "wide": usable}


def rules_reply(seed: str, rows: dict[str, Any], ids: list[str], label: str | None = None) -> str:
    """A rewrite that answers each row's own label (or `label` for all)."""
    lines = [f'- If the message mentions "{rows[i]["text"]}", answer: {label or rows[i]["label"]}' for i in ids]
    return "```\n" + seed + "\n" + "\n".join(lines) + "\n```"


def run_queue(tmp_path: Path, data_dir: Path, urls: tuple[str, str], proposer: ScriptedModelThread,
              bank: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("max_rollouts", 200)
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=bank["train"], pareto=bank["pareto"],
                         heldout=HELDOUT, proposer_script="queue", params=kwargs.pop("params", EXACT), **kwargs)
    outcome = execute(spec, *urls, proposer.base_url)
    assert outcome.status == "done", outcome.error
    return read_evidence(outcome.evidence_dir)


@pytest.fixture
def urls(banking77_url: str, scripted_policy: Any) -> tuple[str, str]:
    return banking77_url, scripted_policy.base_url


@pytest.fixture
def accept_reject(bank: dict[str, Any]) -> list[str]:
    ids = bank["train"] + bank["pareto"]
    return [rules_reply(bank["seed"], bank["rows"], ids, label="not_a_label"), rules_reply(bank["seed"], bank["rows"], ids)]


def test_accepted_child_is_scored_on_pareto_rejected_is_not(tmp_path, data_dir, urls, bank, accept_reject) -> None:
    with ScriptedModelThread("queue", accept_reject) as proposer:
        ev = run_queue(tmp_path, data_dir, urls, proposer, bank, max_generations=2)
    proposals, rollouts, candidates = ev["proposals"], ev["rollouts"], ev["candidates"]
    assert proposals.select("iteration", "parent_id", "child_id", "status", "accepted").rows() == [
        (0, "c0000", "c0001", "changed", False), (1, "c0000", "c0002", "changed", True)]
    assert proposals["child_minibatch_score"].to_list() == [0.0, 1.0]
    assert all(score < 1.0 for score in proposals["parent_minibatch_score"])
    stages = {c: set(rollouts.filter(pl.col("candidate_id") == c)["stage"]) for c in ("c0000", "c0001", "c0002")}
    assert stages == {"c0000": {"seed", "minibatch", "heldout"}, "c0001": {"minibatch"},
                      "c0002": {"minibatch", "pareto", "heldout"}}
    rejected = rollouts.filter(pl.col("candidate_id") == "c0001")
    assert len(rejected) == 4 and set(rejected["task_id"]) <= set(bank["train"])
    accepted_pareto = rollouts.filter((pl.col("candidate_id") == "c0002") & (pl.col("stage") == "pareto"))
    assert sorted(accepted_pareto["task_id"]) == sorted(bank["pareto"]) and accepted_pareto["reward"].min() == 1.0
    assert candidates.select("candidate_id", "origin", "parent_ids").rows() == [
        ("c0000", "seed", []), ("c0001", "rejected", ["c0000"]), ("c0002", "proposal", ["c0000"])]
    manifest = ev["manifest"]
    assert manifest["stop_reason"] == "max_generations" and manifest["best_candidate_id"] == "c0002"
    assert [h["candidate_id"] for h in manifest["heldout"]] == ["c0000", "c0002"]


def test_unchanged_and_empty_proposals_are_recorded_and_rejected(tmp_path, data_dir, urls, bank) -> None:
    with ScriptedModelThread("queue", [f"```\n{bank['seed']}\n```", ""]) as proposer:
        ev = run_queue(tmp_path, data_dir, urls, proposer, bank, max_generations=2)
    assert ev["proposals"].select("iteration", "status", "changed", "accepted", "child_id", "attempts").rows() == [
        (0, "unchanged", False, False, None, 1), (1, "empty", False, False, None, 1)]
    assert ev["candidates"]["candidate_id"].to_list() == ["c0000"]  # no child was made
    assert set(ev["rollouts"]["candidate_id"]) == {"c0000"}
    kinds = ev["events"]["kind"].to_list()
    assert kinds.count("proposal_rejected") == 2 and ev["manifest"]["totals"]["proposer_calls"] == 2


def test_unchanged_reply_is_retried_within_the_attempts(tmp_path, data_dir, urls, bank) -> None:
    good = rules_reply(bank["seed"], bank["rows"], bank["train"] + bank["pareto"])
    with ScriptedModelThread("queue", [f"```\n{bank['seed']}\n```", good]) as proposer:
        ev = run_queue(tmp_path, data_dir, urls, proposer, bank, max_generations=1,
                       params={**EXACT, "proposal_attempts": 2})
    assert ev["proposals"].select("status", "attempts", "accepted").rows() == [("changed", 2, True)]
    assert ev["manifest"]["totals"]["proposer_calls"] == 2


def rules_run(tmp_path: Path, data_dir: Path, urls: tuple[str, str], bank: dict[str, Any], *, max_rollouts: int,
              seed: int = 0, train: list[str] | None = None, parallel: int = 1, params: dict[str, Any] | None = None,
              **budget: Any) -> dict[str, Any]:
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=train or bank["wide"][:20],
                         pareto=bank["wide"][20:25], heldout=HELDOUT, max_rollouts=max_rollouts, seed=seed,
                         params={"minibatch_size": 3, "parallel_proposals": parallel, **(params or {})}, **budget)
    if parallel > 1:
        spec = spec.model_copy(update={"concurrency": 3 * parallel})
    outcome = execute(spec, *urls)
    assert outcome.status == "done", outcome.error
    return read_evidence(outcome.evidence_dir)


def optimization_rows(ev: dict[str, Any]) -> pl.DataFrame:
    return ev["rollouts"].filter(pl.col("stage").is_in(list(OPTIMIZATION_STAGES)))


@pytest.mark.parametrize("budget", [1, 4, 5, 7, 13, 29, 61])
def test_rollout_budget_is_never_exceeded(tmp_path, data_dir, urls, bank, budget: int) -> None:
    ev = rules_run(tmp_path, data_dir, urls, bank, max_rollouts=budget)
    spent = len(optimization_rows(ev))
    totals = ev["manifest"]["totals"]
    assert spent <= budget and spent == totals["rollouts"]
    assert len(ev["rollouts"]) - spent == totals["heldout_rollouts"]
    assert ev["manifest"]["stop_reason"] == "max_rollouts"
    if budget < 5:  # the seed does not fit on the pareto pool: nothing is spent
        assert spent == 0
    else:
        # stops only when a minibatch step (parent + child, 3 + 3) no longer fits, or an accepted
        # child's pareto scoring (5) does not: the pareto part is not held back up front
        assert spent >= 5 and budget - spent < 3 + 3


def test_no_rollout_is_repeated(tmp_path, data_dir, urls, bank) -> None:
    ev = rules_run(tmp_path, data_dir, urls, bank, max_rollouts=80, train=bank["wide"][:6])
    keyed = ev["rollouts"].join(ev["candidates"].select("candidate_id", "digest"), on="candidate_id", how="left")
    assert keyed["digest"].null_count() == 0
    assert keyed.select("digest", "task_id").is_duplicated().sum() == 0
    assert ev["rollouts"]["rollout_id"].is_unique().all() and ev["rollouts"]["seq"].to_list() == list(range(len(keyed)))


@pytest.mark.parametrize("budget", [4, 13, 61, 150])
def test_parallel_proposals_share_the_budget_and_never_repeat_a_rollout(tmp_path, data_dir, urls, bank,
                                                                          budget: int) -> None:
    ev = rules_run(tmp_path, data_dir, urls, bank, max_rollouts=budget, parallel=4, train=bank["wide"][:6])
    spent = len(optimization_rows(ev))
    assert spent <= budget and spent == ev["manifest"]["totals"]["rollouts"]
    assert ev["manifest"]["stop_reason"] == "max_rollouts"
    keyed = ev["rollouts"].join(ev["candidates"].select("candidate_id", "digest"), on="candidate_id", how="left")
    assert keyed.select("digest", "task_id").is_duplicated().sum() == 0  # in flight twice is awaited, not rerun
    assert sorted(ev["rollouts"]["seq"].to_list()) == list(range(len(keyed)))
    if budget >= 61:
        assert budget - spent < 5 + 3 + 3  # the iterations together stop only when none fits
        proposals = ev["proposals"]
        assert len(proposals) >= 4
        digest = dict(zip(ev["candidates"]["candidate_id"], ev["candidates"]["digest"]))
        accepted = {digest[c] for c in proposals.filter(pl.col("accepted"))["child_id"]}
        scored = {digest[c] for c in keyed.filter(pl.col("stage") == "pareto")["candidate_id"]}
        # every accepted text, and only those, scored on the pareto pool (two iterations in
        # flight may propose the same text: it is scored once)
        assert accepted and accepted == scored


def test_same_seed_gives_identical_evidence(tmp_path, data_dir, urls, bank) -> None:
    first = rules_run(tmp_path / "a", data_dir, urls, bank, max_rollouts=40, seed=3)
    second = rules_run(tmp_path / "b", data_dir, urls, bank, max_rollouts=40, seed=3)
    assert len(first["proposals"]) > 0 and len(first["candidates"]) > 1
    for name in ("rollouts", "candidates", "proposals", "events"):
        keep = [c for c in first[name].columns if c not in TIMING_COLUMNS]
        assert first[name].select(keep).equals(second[name].select(keep)), name
    for key in ("run_id", "totals", "heldout", "best_candidate_id", "stop_reason", "identity"):
        assert first["manifest"][key] == second["manifest"][key], key


def test_max_wall_s_cuts_a_slow_proposer_call_short(tmp_path, data_dir, urls, bank) -> None:
    """A proposer call that would run past the wall budget (a local model can take minutes)
    is abandoned at the deadline: the run stops there, not when the call returns."""
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=bank["wide"][:20],
                         pareto=bank["wide"][20:25], heldout=HELDOUT, max_rollouts=100_000, max_wall_s=2.0,
                         params={"minibatch_size": 3})
    with ScriptedModelThread("rules?latency_s=60") as slow_proposer:
        outcome = execute(spec, urls[0], urls[1], slow_proposer.base_url)
    assert outcome.status == "done" and outcome.stop_reason == "max_wall_s", outcome.error
    manifest = read_evidence(outcome.evidence_dir)["manifest"]
    assert 2.0 <= manifest["timings"]["optimize_s"] < 2.0 + 3.0
    assert manifest["totals"]["proposals"] == 0 and manifest["totals"]["heldout_rollouts"] > 0


def test_max_generations_stops_cleanly(tmp_path, data_dir, urls, bank) -> None:
    ev = rules_run(tmp_path, data_dir, urls, bank, max_rollouts=10_000, max_generations=3)
    manifest = ev["manifest"]
    assert manifest["status"] == "done" and manifest["stop_reason"] == "max_generations"
    stop = ev["events"].filter(pl.col("kind") == "stop")
    assert json.loads(stop["data_json"][0])["iterations"] == 3
    assert ev["proposals"]["iteration"].max() <= 2


def test_max_wall_s_stops_cleanly(tmp_path, data_dir, urls, bank) -> None:
    ev = rules_run(tmp_path, data_dir, urls, bank, max_rollouts=100_000, max_wall_s=1.5, train=bank["wide"])
    manifest = ev["manifest"]
    assert manifest["status"] == "done" and manifest["stop_reason"] == "max_wall_s"
    assert 0 < manifest["totals"]["rollouts"] < 100_000
    assert 1.5 <= manifest["timings"]["optimize_s"] < 1.5 + 2.0  # stops between iterations, not mid-way
    assert manifest["totals"]["heldout_rollouts"] > 0  # heldout scoring still runs after the stop


@pytest.mark.parametrize("algorithm", ["gepa", "gepa_ai"])
def test_both_arms_take_the_proposer_models_own_token_cap(tmp_path, data_dir, urls, bank, algorithm: str) -> None:
    """configs/proposer/*.yaml sets max_tokens: with no algorithm override, every proposer call
    is capped there (the scripted model cuts a longer reply and says finish_reason=length)."""
    from conftest import scripted_spec

    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=bank["wide"][:20],
                         pareto=bank["wide"][20:25], heldout=HELDOUT, max_rollouts=40, algorithm=algorithm,
                         params={"minibatch_size": 3})
    spec = spec.model_copy(update={"proposer": scripted_spec("rules", 6)})
    outcome = execute(spec, *urls)
    assert outcome.status == "done", outcome.error
    proposals = read_evidence(outcome.evidence_dir)["proposals"]
    assert len(proposals) > 0 and proposals["completion_tokens"].sum() > 0
    assert (proposals["completion_tokens"] <= 6 * proposals["attempts"]).all()
    if algorithm == "gepa":
        assert proposals["truncated_replies"].sum() > 0  # the cap bit, and our parser saw it


@pytest.mark.parametrize("lines_per_reply, calls", [(2, 1), (1, 2)])
def test_sampling_stops_once_enough_lines_survive_the_screen(tmp_path, data_dir, urls, bank,
                                                             lines_per_reply: int, calls: int) -> None:
    """`proposal_samples` is a ceiling: a second reply is asked for only when the first
    yields fewer than `lines_wanted` lines that pass the screen."""
    rows, train = bank["rows"], bank["train"]
    replies = ["\n".join(f'- If the message mentions "{rows[i]["text"]}", answer: {rows[i]["label"]}'
                         for i in train[k * lines_per_reply:(k + 1) * lines_per_reply]) for k in range(2)]
    params = {**EXACT, "edit_formats": ["rules"], "proposal_samples": 2, "lines_wanted": 2}
    with ScriptedModelThread("queue", replies) as proposer:
        ev = run_queue(tmp_path, data_dir, urls, proposer, bank, max_generations=1, params=params)
    proposal = ev["proposals"].row(0, named=True)
    assert (proposal["status"], proposal["attempts"], len(proposal["proposer_replies"])) == ("changed", calls, calls)
    assert proposal["learned_lines"] == 2


def test_the_pick_weighs_train_rows_kept_apart_against_a_lucky_pareto_pool(tmp_path, data_dir, urls, bank) -> None:
    """select_top: the pareto leaders and the seed are also scored on train rows no minibatch
    uses. Child c0001 fits the pareto pool alone; c0002 holds on the rows kept apart too."""
    from algorithms.gepa.select import split_train

    minibatch, apart = split_train(tuple(bank["train"]), 4, seed=0)
    pareto = bank["pareto"]
    lucky = rules_reply(bank["seed"], bank["rows"], [*pareto, minibatch[0]])
    steady = rules_reply(bank["seed"], bank["rows"], [*pareto[:2], *minibatch[:2], *apart])
    params = {**EXACT, "select_top": 2, "select_rows": 4}
    with ScriptedModelThread("queue", [lucky, steady]) as proposer:
        ev = run_queue(tmp_path, data_dir, urls, proposer, bank, max_generations=2, params=params)
    rollouts, manifest = ev["rollouts"], ev["manifest"]
    assert ev["proposals"].select("child_id", "accepted").rows() == [("c0001", True), ("c0002", True)]
    pareto_means = rollouts.filter(pl.col("stage").is_in(["seed", "pareto"])).group_by("candidate_id").agg(
        pl.col("reward").mean()).sort("candidate_id")["reward"].to_list()
    assert pareto_means == [0.0, 1.0, 0.5]  # the pareto pool alone would pick c0001
    kept = rollouts.filter(pl.col("stage") == "select")
    assert {c: sorted(g["task_id"]) for (c,), g in kept.group_by("candidate_id")} == {
        c: sorted(apart) for c in ("c0000", "c0001", "c0002")}
    assert set(rollouts.filter(pl.col("stage") == "minibatch")["task_id"]) <= set(minibatch)
    assert manifest["best_candidate_id"] == "c0002"  # 4 / 4 on the kept rows against c0001's 0 / 4
    select = json.loads(ev["events"].filter(pl.col("kind") == "select")["data_json"][0])
    assert select["pareto_best"] == "c0001" and select["scores"] == {"c0001": 0.0, "c0002": 1.0, "c0000": 0.0}
    assert manifest["totals"]["rollouts"] == len(optimization_rows(ev))  # the extra rows are budgeted


@pytest.mark.parametrize("parallel", [1, 3])
@pytest.mark.parametrize("budget", [9, 30, 80])
def test_rows_kept_for_the_pick_are_held_from_the_iterations(tmp_path, data_dir, urls, bank, budget: int,
                                                             parallel: int) -> None:
    """The pick's extra rows ((select_top + 1) x select_rows = 6) are held up front: the
    iterations stop short of them, and the run ends instead of waiting for them."""
    ev = rules_run(tmp_path, data_dir, urls, bank, max_rollouts=budget, parallel=parallel,
                   params={"select_top": 1, "select_rows": 3})
    rows = optimization_rows(ev)
    spent = rows.filter(pl.col("stage") != "select")
    assert len(rows) <= budget and len(rows) == ev["manifest"]["totals"]["rollouts"]
    if budget < 6 + 2 * 5 + 2 * 3:  # no room for the seed and one child beside the hold: no pick stage
        assert len(rows.filter(pl.col("stage") == "select")) == 0
        assert len(rows.filter(pl.col("stage") == "seed")) == 5  # the search itself goes on
    else:
        assert len(spent) <= budget - 6
        means = rows.filter(pl.col("stage").is_in(["seed", "pareto"])).group_by("candidate_id").agg(
            pl.col("reward").mean())
        seed_mean = means.filter(pl.col("candidate_id") == "c0000")["reward"][0]
        beat_the_seed = (means["reward"] > seed_mean).any()
        # the pick's rows are rolled out only when some child beat the seed on the pareto pool
        assert (len(rows.filter(pl.col("stage") == "select")) > 0) == beat_the_seed


def test_rows_the_budget_cannot_keep_apart_go_back_to_the_minibatches(tmp_path, data_dir, urls, bank) -> None:
    """A hold of 2 x 10 rows beside the seed and one child (2 x 5 + 2 x 3) needs 36
    rollouts: with 35 nothing is kept apart, and the minibatches draw on the whole train pool."""
    from algorithms.gepa.select import split_train

    ev = rules_run(tmp_path, data_dir, urls, bank, max_rollouts=35, params={"select_top": 1, "select_rows": 10})
    _, apart = split_train(tuple(bank["wide"][:20]), 10, seed=0)
    minibatch_rows = set(ev["rollouts"].filter(pl.col("stage") == "minibatch")["task_id"])
    assert "kept_apart" not in ev["events"]["kind"].to_list()
    assert minibatch_rows & set(apart)  # rows the split had set apart for a pick that will not be made


def test_an_unexpected_error_after_preflight_fails_the_run_with_its_evidence_written(tmp_path, data_dir, urls,
                                                                                    bank, caplog) -> None:
    """A ValueError from the optimizer (its own parameter naming a field the rows lack) is
    not a HarnessError: the run still ends `failed` with the cause in its manifest."""
    spec = make_run_spec(container_spec("banking77", data_dir), tmp_path, train=bank["wide"][:20],
                         pareto=bank["wide"][20:25], heldout=HELDOUT, max_rollouts=100,
                         params={"select_top": 1, "select_rows": 4, "select_spread_by": "no_such_field"})
    outcome = execute(spec, *urls)
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.startswith(
        "ValueError: select_spread_by is 'no_such_field', and train task ")
    manifest = read_evidence(outcome.evidence_dir)["manifest"]
    assert manifest["status"] == "failed" and manifest["error"] == outcome.error
    logged = [r.getMessage() for r in caplog.records if r.name == "harness.run"]
    assert len(logged) == 1 and logged[0].startswith(f"run {spec.run_id} raised:\nTraceback")


def test_a_wall_bound_run_still_makes_its_pick_on_the_rows_kept_apart(tmp_path, data_dir, urls, bank) -> None:
    """The wall clock stops the iterations; the pick's extra rows were held from the rollout
    budget and run after it, as heldout does."""
    from algorithms.gepa.select import split_train

    minibatch, apart = split_train(tuple(bank["train"]), 4, seed=0)
    replies = [rules_reply(bank["seed"], bank["rows"], [*bank["pareto"], minibatch[0]]),
               rules_reply(bank["seed"], bank["rows"], [*bank["pareto"][:2], *minibatch[:2], *apart])]
    with ScriptedModelThread("queue", replies) as proposer:
        # the queue cycles: later proposals repeat a text and spend nothing, so the wall ends the run
        ev = run_queue(tmp_path, data_dir, urls, proposer, bank, max_rollouts=100_000, max_wall_s=3.0,
                       params={**EXACT, "select_top": 2, "select_rows": 4, "max_idle_iterations": 10**9})
    manifest, rollouts = ev["manifest"], ev["rollouts"]
    assert manifest["stop_reason"] == "max_wall_s"
    kept = rollouts.filter(pl.col("stage") == "select")
    contenders = sorted(kept["candidate_id"].unique())
    assert contenders[:2] == ["c0000", "c0001"] and kept.height == 4 * len(contenders)
    assert set(kept["task_id"]) == set(apart) and "select_skipped" not in ev["events"]["kind"].to_list()


def test_the_examples_edit_quotes_the_containers_citations_without_a_proposer_call(tmp_path, data_dir, urls,
                                                                                  bank) -> None:
    """`examples`: the banking77 container cites example messages for the expected and the
    given intent of each failure; the child quotes them with their labels, never a
    minibatch row's own message, and no proposer is called."""
    params = {**EXACT, "edit_formats": ["examples"]}
    with ScriptedModelThread("queue", ["(a proposer reply would be a failure of this test)"]) as proposer:
        ev = run_queue(tmp_path, data_dir, urls, proposer, bank, max_generations=1, params=params)
    proposal = ev["proposals"].row(0, named=True)
    assert (proposal["edit_format"], proposal["status"], proposal["attempts"], proposal["proposer_model"]) == (
        "examples", "changed", 0, None)
    assert ev["manifest"]["totals"]["proposer_calls"] == 0
    child = json.loads(ev["candidates"].filter(pl.col("candidate_id") == proposal["child_id"])["modules_json"][0])
    text = next(iter(child.values()))
    assert text.startswith(bank["seed"].rstrip()) and "Examples (input -> answer):" in text
    lines = [ln for ln in text.split("Examples (input -> answer):")[1].splitlines() if ln.strip()]
    assert 0 < len(lines) <= EXACT["minibatch_size"]
    minibatch = ev["rollouts"].filter(pl.col("stage") == "minibatch")
    own = {bank["rows"][t]["text"] for t in minibatch["task_id"]}
    cited: dict[str, set[str]] = {}
    for raw in minibatch.filter(pl.col("reward") < 1)["answer_examples_json"]:
        for label, texts in json.loads(raw).items():
            cited.setdefault(label, set()).update(texts)
    for line in lines:
        quoted, label = line.removeprefix('- "').rsplit('" -> ', 1)
        assert quoted in cited[label] and quoted not in own


def test_with_cited_memory_a_later_examples_edit_also_quotes_earlier_failures(tmp_path, data_dir, urls,
                                                                               bank) -> None:
    """`cited_memory`: the second `examples` edit quotes, after its own minibatch's
    citations, those of the first minibatch's failures; without it, only its own."""
    base = {**EXACT, "edit_formats": ["examples"], "max_cited_lines": 16}
    added: dict[int, list[str]] = {}
    cited_first: set[str] = set()
    for memory in (0, 64):
        with ScriptedModelThread("queue", ["(a proposer reply would be a failure of this test)"]) as proposer:
            ev = run_queue(tmp_path / str(memory), data_dir, urls, proposer, bank, max_generations=2,
                           params={**base, "cited_memory": memory})
        proposals = ev["proposals"].sort("iteration")
        assert proposals["edit_format"].to_list() == ["examples", "examples"]
        texts = {row["candidate_id"]: next(iter(json.loads(row["modules_json"]).values()))
                 for row in ev["candidates"].iter_rows(named=True)}
        second = proposals.row(1, named=True)
        parent_lines = set(texts[second["parent_id"]].splitlines())
        added[memory] = [ln for ln in texts[second["child_id"]].splitlines() if ln not in parent_lines]
        # the first iteration's minibatch: the seed's first four minibatch rollouts
        minibatch = ev["rollouts"].filter(pl.col("stage") == "minibatch").sort("seq")
        first_rows = minibatch.filter(pl.col("candidate_id") == "c0000").head(4)
        own_second = set(minibatch.filter(pl.col("candidate_id") == second["parent_id"]).tail(4)["task_id"])
        cited_first = {text for raw in first_rows.filter(pl.col("reward") < 1)["answer_examples_json"]
                       for texts_ in json.loads(raw).values() for text in texts_}
        cited_first -= {bank["rows"][t]["text"] for t in own_second}
    quoted = {memory: {ln.removeprefix('- "').rsplit('" -> ', 1)[0] for ln in lines} for memory, lines in added.items()}
    assert len(added[64]) > len(added[0]) > 0
    assert quoted[64] - quoted[0] and quoted[64] - quoted[0] <= cited_first
