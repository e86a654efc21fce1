"""Synthetic evidence shaped like a GEPA run, written with the harness's own writer
(`EvidenceLocation.write_table` checks every row against the schema) and its sweep store: the
seed scored on the pareto pool, then iterations (parent and child on a minibatch, a proposal
with its prompt, replies and screen drops, the pareto pool for an accepted child, a merge of two
frontier candidates every few iterations), a share of error rows without a reward, and the top
candidates re-scored on heldout. Used by the view benchmark and the view tests."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.evidence.writer import EvidenceLocation
from harness.sweep.store import SweepStore

LABELS = [f"intent_{i:02d}" for i in range(40)]
SEED_TEXT = ("You are a banking customer-support intent classifier. Read the customer's message and answer with the "
             "one intent label from the list that best matches it. Reply with the label only.")
PROPOSER_SYSTEM = ("You improve prompts: the instruction of a language model that labels customer messages. You are "
                   "shown the current instruction, examples it got wrong with the expected label and the feedback, "
                   "and the list of labels. Write new rules, one per line, of the form `- If the input ..., answer "
                   "`label``. ") * 3


@dataclass(frozen=True)
class RunShape:
    rollouts: int = 300  # optimization + heldout
    heldout_rows: int = 50
    heldout_candidates: int = 4  # the seed and the best by pareto mean among them
    pareto_rows: int = 30
    minibatch: int = 4
    merge_every: int = 4
    error_rate: float = 0.02
    unchanged_rate: float = 0.1  # proposals whose reply changed nothing: no child
    seed: int = 0


@dataclass
class _Run:
    shape: RunShape
    run_id: str
    rng: random.Random
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    proposals: list[dict[str, Any]] = field(default_factory=list)
    skill: dict[str, float] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    done: dict[tuple[str, str], float | None] = field(default_factory=dict)  # (candidate, task) -> reward
    spent: int = 0

    def inputs(self, task: str) -> str:
        return f"Customer message {task}: I have a question about my card, my transfer and the fees ({task})."

    def rollout(self, cid: str, task: str, stage: str) -> float | None:
        """One row, unless this (candidate, task) pair was rolled out before (the run context caches it)."""
        if (cid, task) in self.done:
            return self.done[(cid, task)]
        seq = len(self.rollouts)
        error = self.rng.random() < self.shape.error_rate
        reward = None if error else float(self.rng.random() < self.skill[cid])
        self.done[(cid, task)] = reward
        label = LABELS[int(task.split(":")[1]) % len(LABELS)]
        answer = label if reward else self.rng.choice(LABELS)
        self.rollouts.append({
            "run_id": self.run_id, "seq": seq, "rollout_id": f"{self.run_id}-{cid}-{task}", "candidate_id": cid,
            "task_id": task, "split": task.split(":")[0], "stage": stage, "reward": reward,
            "status": "error" if error else "ok", "container_status": "failed" if error else "ok",
            "error": "status failed: the container timed out scoring this row" if error else None,
            "error_kind": "transient" if error else None, "prompt_tokens": 450 + len(self.texts[cid]) // 4,
            "completion_tokens": 5, "cost_usd": 0.0, "latency_s": 0.4, "elapsed_s": 0.4 * seq,
            "output": None if error else answer,
            "feedback": None if error else (f"Correct: `{label}`." if reward else
                                            f"Wrong: expected intent `{label}` (messages like \"how do I ...\"), the "
                                            f"answer was `{answer}`, which is for other messages."),
            "feedback_source": None if error else "actionable_side_info", "inputs": self.inputs(task)})
        if stage != "heldout":
            self.spent += 1
        return reward

    def add_candidate(self, text: str, parents: list[str], origin: str, skill: float) -> str:
        cid = f"c{len(self.candidates):04d}"
        generation = 1 + max((next(c["generation"] for c in self.candidates if c["candidate_id"] == p)
                              for p in parents), default=-1)
        self.candidates.append({
            "run_id": self.run_id, "candidate_id": cid, "index": len(self.candidates), "parent_ids": parents,
            "generation": generation, "origin": origin, "digest": hashlib.sha256(text.encode()).hexdigest()[:16],
            "modules_json": json.dumps({"stage2_system": text}), "rollouts_at_creation": self.spent,
            "cost_usd_at_creation": 0.0, "elapsed_s_at_creation": 0.4 * len(self.rollouts)})
        self.texts[cid], self.skill[cid] = text, min(0.95, max(0.02, skill))
        return cid

    def set_origin(self, cid: str, origin: str) -> None:
        self.candidates[int(cid[1:])]["origin"] = origin


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _proposal(run: _Run, iteration: int, parent: str, child: str | None, status: str, edit: str,
              scores: tuple[float | None, float | None], accepted: bool, merged: list[str] | None = None) -> None:
    examples = "\n\n".join(f"Input: {run.inputs(f'train:{run.rng.randrange(2000)}')}\nOutput: {run.rng.choice(LABELS)}"
                           f"\nFeedback: Wrong: expected `{run.rng.choice(LABELS)}`." for _ in range(4))
    prompt = [{"role": "system", "content": PROPOSER_SYSTEM},
              {"role": "user", "content": f"Current instruction:\n{run.texts[parent]}\n\nExamples:\n{examples}\n\n"
                                          f"Labels: {', '.join(LABELS)}"}]
    replies = [f"- If the input mentions {run.rng.choice(['fees', 'cards', 'transfers', 'top-ups'])}, answer "
               f"`{run.rng.choice(LABELS)}`." * 3 for _ in range(2)]
    run.proposals.append({
        "run_id": run.run_id, "proposal_id": f"p{len(run.proposals):04d}", "iteration": iteration, "parent_id": parent,
        "child_id": child, "module": None if merged else "stage2_system", "proposer_model": None if merged else "m",
        "edit_format": edit, "attempts": 0 if merged else 2, "status": status, "changed": status == "changed",
        "accepted": accepted, "parent_minibatch_score": scores[0], "child_minibatch_score": scores[1],
        "prompt_tokens": 0 if merged else 1800, "completion_tokens": 0 if merged else 400, "cost_usd": 0.0,
        "latency_s": 0.0 if merged else 60.0, "error": None, "proposer_prompt": None if merged else json.dumps(prompt),
        "proposer_replies": [] if merged else replies,
        "screened_out_json": "{}" if merged else json.dumps({"duplicate": run.rng.randrange(3)}),
        "truncated_replies": 0, "learned_lines": run.texts[child].count("\n- ") if child else None,
        "merged_from": merged})


def _iterate(run: _Run, iteration: int, frontier: list[str], train: list[str], pareto: list[str]) -> None:
    shape, rng = run.shape, run.rng
    minibatch = [train[(iteration * shape.minibatch + i) % len(train)] for i in range(shape.minibatch)]
    merge = shape.merge_every and (iteration + 1) % shape.merge_every == 0 and len(frontier) >= 2
    parents = rng.sample(frontier, 2) if merge else [rng.choice(frontier)]
    parent_score = max((s for s in (_mean([run.rollout(p, t, "minibatch") for t in minibatch]) for p in parents)
                        if s is not None), default=None)
    if merge:
        lines = dict.fromkeys(run.texts[parents[0]].splitlines() + run.texts[parents[1]].splitlines())
        text, skill, edit = "\n".join(lines), max(run.skill[p] for p in parents) + 0.01, "merge"
    elif rng.random() < shape.unchanged_rate:
        _proposal(run, iteration, parents[0], None, "unchanged", rng.choice(["rules", "answer_guide"]),
                  (parent_score, None), False)
        return
    else:
        topic = rng.choice(["fees", "cards", "transfers"])
        rule = f"- If the input mentions {topic} {iteration}, answer `{rng.choice(LABELS)}`."
        header = "" if "Rules learned" in run.texts[parents[0]] else "\n\nRules learned from mistakes:"
        text, edit = f"{run.texts[parents[0]]}{header}\n{rule}", rng.choice(["rules", "answer_guide"])
        skill = run.skill[parents[0]] + rng.gauss(0.0, 0.06)
    child = run.add_candidate(text, parents, "merge" if merge else "proposal", skill)
    child_score = _mean([run.rollout(child, t, "minibatch") for t in minibatch])
    accepted = child_score is not None and parent_score is not None and (
        child_score >= parent_score if merge else child_score > parent_score)
    _proposal(run, iteration, parents[0], child, "changed", edit, (parent_score, child_score), accepted,
              merged=parents if merge else None)
    if not accepted:
        run.set_origin(child, "rejected")
        return
    for task in pareto:
        run.rollout(child, task, "pareto")
    frontier.append(child)


def write_run(root: Path, sweep: str, run_id: str, shape: RunShape, axes: dict[str, str] | None = None) -> Path:
    """Write one finished run of about `shape.rollouts` rows; returns its folder."""
    run = _Run(shape=shape, run_id=run_id, rng=random.Random(shape.seed))
    pareto = [f"train:{i}" for i in range(shape.pareto_rows)]
    train = [f"train:{i}" for i in range(shape.pareto_rows, shape.pareto_rows + 2000)]
    heldout = [f"test:{i}" for i in range(shape.heldout_rows)]
    seed = run.add_candidate(SEED_TEXT, [], "seed", 0.3)
    for task in pareto:
        run.rollout(seed, task, "seed")
    budget = shape.rollouts - shape.heldout_rows * shape.heldout_candidates
    frontier, iteration = [seed], 0
    while run.spent + 2 * shape.minibatch + shape.pareto_rows <= budget:
        _iterate(run, iteration, frontier, train, pareto)
        iteration += 1
    pareto_mean = {c: _mean([r["reward"] for r in run.rollouts if r["candidate_id"] == c and r["task_id"] in pareto])
                   for c in frontier}
    best = max(frontier, key=lambda c: (pareto_mean[c] or 0.0, -int(c[1:])))
    ranked = sorted(frontier, key=lambda c: -(pareto_mean[c] or 0.0))
    scored = sorted(list(dict.fromkeys([seed, best, *ranked]))[:shape.heldout_candidates], key=lambda c: int(c[1:]))
    heldout_scores = []
    for cid in scored:
        rewards = [run.rollout(cid, task, "heldout") for task in heldout]
        known = [r for r in rewards if r is not None]
        heldout_scores.append({"candidate_id": cid, "heldout_score": _mean(rewards), "heldout_n": len(known),
                               "heldout_failed": len(rewards) - len(known), "pareto_score": pareto_mean[cid],
                               "pareto_n": shape.pareto_rows})
    location = EvidenceLocation(str(root), sweep, run_id)
    for name, rows in (("rollouts", run.rollouts), ("candidates", run.candidates), ("proposals", run.proposals),
                       ("events", []), ("model_calls", [])):
        location.write_table(name, rows)
    failed = sum(r["status"] != "ok" for r in run.rollouts)
    location.write_manifest({
        "run_id": run_id, "sweep": sweep, "status": "done", "stop_reason": "max_rollouts", "error": None,
        "axes": axes or {}, "seed_candidate_id": seed, "best_candidate_id": best, "heldout": heldout_scores,
        "spec": {"container": {"name": (axes or {}).get("container", "banking77")},
                 "algorithm": {"name": (axes or {}).get("algorithm", "gepa")}, "policy": {"model": "policy-model"},
                 "proposer": {"model": (axes or {}).get("proposer", "proposer-model")}, "seed": shape.seed,
                 "pools": {"train": train, "pareto": pareto, "heldout": heldout}},
        "totals": {"rollouts": run.spent, "heldout_rollouts": len(run.rollouts) - run.spent, "failed_rollouts": failed,
                   "candidates": len(run.candidates), "proposals": len(run.proposals), "cost_usd": 0.0},
        "timings": {"wall_s": 0.4 * len(run.rollouts), "started_at": "2026-01-01T00:00:00+00:00"}})
    return Path(location.run_dir)


def write_sweep(root: Path, sweep: str, n_runs: int, shape: RunShape) -> Path:
    """`n_runs` runs over container x proposer x seed, with sweep.json's grid and the index."""
    containers, proposers = ("banking77", "heart_disease"), ("small", "medium", "large", "xl")
    points = [{"container": c, "proposer": p, "seed": str(s)} for s in range(-(-n_runs // 8))
              for c in containers for p in proposers][:n_runs]
    grid, index = [], []
    for i, point in enumerate(points):
        run_id = f"run{i:04d}"
        write_run(root, sweep, run_id, RunShape(**{**shape.__dict__, "seed": i}), axes=point)
        grid.append({"run_id": run_id, **point})
        index.append({"run_id": run_id, "status": "done", "container": point["container"], "seed": int(point["seed"]),
                      "axes_json": json.dumps(point, sort_keys=True)})
    store = SweepStore(str(root), sweep)
    store.write_sweep({"grid": grid})
    store.write_index(index)
    return Path(store.dir)
