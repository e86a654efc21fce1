"""Our GEPA on a program of two target modules: a Banking77 container whose system message
is built from two mutable modules, served on loopback, with the scripted model as policy
and proposer. Merges combine children that lead on different pareto rows, and proposals
take turns between the modules whatever else the iterations do."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.containers.banking77 import Banking77
from benchmarks.containers.kit import ChatMessage, ProgramModule, ProgramResponse, Row, build_app
from conftest import execute, make_run_spec, read_evidence
from harness.scripted_model import rule_word
from harness.specs import ContainerSpec
from servers import ServerThread

MODULES = ["stage2_system", "stage2_style"]
STYLE = "Answer with the intent label alone."


class TwoModuleBanking77(Banking77):
    def program(self) -> ProgramResponse:
        base = super().program()
        style = ProgramModule(module_id="stage2_style", role="system", content=STYLE, mutable=True,
                              candidate_field="stage2_style")
        return base.model_copy(update={"modules": [*base.modules, style], "target_modules": MODULES,
                                       "seed_candidate": {**base.seed_candidate, "stage2_style": STYLE}})

    def render(self, candidate: dict[str, str], row: Row) -> list[ChatMessage]:
        system, *rest = super().render(candidate, row)
        return [ChatMessage(role="system", content=f"{system.content}\n\n{candidate['stage2_style']}"), *rest]


def paired_pools(container: Banking77, pairs: int) -> tuple[list[str], list[str]]:
    """Train and pareto rows in pairs of one intent whose texts share the word the scripted
    proposer keys its rule for the train row on: a rule learned on a minibatch also answers
    its pareto row, so children of different minibatches lead on different pareto rows."""
    fallback = container.labels()[0]  # the scripted policy's answer without a rule
    by_key: dict[tuple[str, str], list[int]] = {}
    for index, row in enumerate(container.load_splits()["train"]):
        word = rule_word(row["text"])
        if word and row["label"] != fallback:
            by_key.setdefault((word, row["label"]), []).append(index)
    chosen = [ids[:2] for ids in by_key.values() if len(ids) >= 2][:pairs]
    assert len(chosen) == pairs
    return [f"train:{a}" for a, _ in chosen], [f"train:{b}" for _, b in chosen]


def test_merges_combine_leaders_and_proposals_take_turns_between_modules(tmp_path: Path, data_dir: Path,
                                                                         scripted_policy: Any) -> None:
    bank = TwoModuleBanking77(str(data_dir))
    train, pareto = paired_pools(bank, 12)
    with ServerThread(build_app(bank)) as container:
        spec = make_run_spec(ContainerSpec(name="banking77_two_modules", url=container.url, target_modules=MODULES),
                             tmp_path, train=train, pareto=pareto, heldout=["test:0"], max_rollouts=300,
                             params={"minibatch_size": 3, "merge_every": 2, "edit_formats": ["rules"],
                                     "proposal_attempts": 1, "select_top": 0, "parallel_proposals": 3})
        # iterations in flight together propose from the same parent: siblings lead on different rows
        outcome = execute(spec.model_copy(update={"concurrency": 9}), container.url, scripted_policy.base_url)
    assert outcome.status == "done", outcome.error
    ev = read_evidence(outcome.evidence_dir)
    proposals = ev["proposals"]
    # merges took iterations, each child of two candidates
    merged = proposals.filter(pl.col("module").is_null())["child_id"].to_list()
    parents = dict(ev["candidates"].select("candidate_id", "parent_ids").iter_rows())
    assert merged and all(len(parents[child]) == 2 for child in merged), proposals.select("iteration", "module").rows()
    # and the proposals still went to each module in turn (by iteration, one module had them all)
    turns = Counter(proposals.filter(pl.col("module").is_not_null())["module"].to_list())
    assert set(turns) == set(MODULES) and abs(turns[MODULES[0]] - turns[MODULES[1]]) <= 1, turns
