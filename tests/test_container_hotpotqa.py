"""HotpotQA container: the official answer metric, the pinned data (local JSONL or the
upstream JSON array), the split, and the contract end to end as a process started from
its container config, against a tiny scripted OpenAI-compatible fake. Offline."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from benchmarks.containers import hotpotqa
from benchmarks.containers.hotpotqa import HotpotQA, exact_match, extract_answer, f1_score, normalize_answer
from benchmarks.containers.kit import build_app, policy_result
from harness.client import ContainerClient
from harness.config import PoolsConfig
from harness.contract import CONTRACT_VERSION, RolloutRequest
from harness.preflight import preflight
from harness.services import Services
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, RunSpec
from servers import ServerThread

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- a scripted fake model


class FakeModel:
    """OpenAI-compatible fake on loopback. Model `gold` answers each question correctly (it
    is told the answers), `wrong` answers `Paris`, `bare` gives the gold answer with no
    `Answer:` line, `wordy` pads the gold answer."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.requests.append(body)
            question = re.search(r"^Question: (.*)$", body["messages"][-1]["content"], re.M)
            gold = self.answers.get(question.group(1) if question else "", "unknown")
            text = {"gold": f"The paragraphs connect.\nAnswer: {gold}", "wrong": "Answer: Paris",
                    "bare": gold, "wordy": f"Answer: it is {gold} for sure"}[body["model"]]
            return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 5}}

        self.server = ServerThread(app)
        self.port = self.server.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "FakeModel":
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def container(data_dir: Path) -> HotpotQA:
    return HotpotQA(str(data_dir))


@pytest.fixture(scope="module")
def fake(container: HotpotQA) -> Iterator[FakeModel]:
    rows = container.splits()["train"] + container.splits()["test"]
    with FakeModel({r["question"]: r["answer"] for r in rows}) as model:
        yield model


def _policy(fake: FakeModel, model: str) -> dict[str, Any]:
    return {"provider": "openai_compatible", "model": model, "base_url": fake.base_url, "max_tokens": 64}


# ---------------------------------------------------------------- the official metric


@pytest.mark.parametrize("pred, gold, f1, em", [
    ("The Beatles", "Beatles", 1.0, 1.0),            # articles, case
    ("beatles!", "the Beatles.", 1.0, 1.0),           # punctuation
    ("the Beatles band", "Beatles", 2 * 0.5 / 1.5, 0.0),
    ("yes", "no", 0.0, 0.0),                          # yes/no mismatch is zero even if tokens overlap
    ("no, it is not", "no", 0.0, 0.0),
    ("Chief of Protocol", "Chief of Protocol", 1.0, 1.0),
    ("", "1962", 0.0, 0.0),
])
def test_official_f1_and_em(pred: str, gold: str, f1: float, em: float) -> None:
    assert f1_score(pred, gold)[0] == pytest.approx(f1)
    assert exact_match(pred, gold) == em


def test_normalize_and_extract() -> None:
    assert normalize_answer("  An Apple, a Day!  ") == "apple day"
    assert extract_answer("step 1\nstep 2\nAnswer: 3,677 seated.") == ("3,677 seated", True)
    assert extract_answer("**Final answer:** Animorphs") == ("Animorphs", True)
    assert extract_answer("Answer: first\nthinking more\nAnswer: second") == ("second", True)
    assert extract_answer("I think\n\nYG Entertainment\n") == ("YG Entertainment", False)
    assert extract_answer("") == ("", False)


# ---------------------------------------------------------------- data and split


def _upstream_bytes(jsonl: Path) -> bytes:
    """The upstream JSON array rebuilt from the shared JSONL: compact, `/` escaped, ASCII,
    and the one `, ` separator upstream has before example 43 (see PROVENANCE.md)."""
    parts = [json.dumps(json.loads(line), separators=(",", ":")).replace("/", "\\/")
             for line in jsonl.read_text(encoding="utf-8").splitlines()]
    return ("[" + ",".join(parts[:43]) + ", " + ",".join(parts[43:]) + "]").encode()


def test_pin_matches_upstream_bytes_and_download(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 container: HotpotQA) -> None:
    payload = _upstream_bytes(data_dir / "hotpotqa" / hotpotqa.LOCAL_JSONL)
    blob = hashlib.sha1(b"blob %d\0" % len(payload) + payload).hexdigest()
    assert blob == "3d143d23369e310d3560a2d0c644f880276b3483"  # the upstream git blob of PROVENANCE.md
    assert hashlib.sha256(payload).hexdigest() == hotpotqa.SHA256
    served = tmp_path / "served"
    served.mkdir()
    (served / hotpotqa.UPSTREAM_FILE).write_bytes(payload)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.setattr(hotpotqa, "URL", f"http://127.0.0.1:{server.server_address[1]}/{hotpotqa.UPSTREAM_FILE}")
        downloaded = HotpotQA(None).splits()  # no data dir: download, verify, parse the JSON array
    finally:
        server.shutdown()
        server.server_close()
    assert downloaded == container.splits()


def test_split_is_deterministic(data_dir: Path, container: HotpotQA) -> None:
    splits = container.splits()
    assert {k: len(v) for k, v in splits.items()} == {"train": 63, "test": 40}
    assert splits == HotpotQA(str(data_dir)).splits()
    assert sorted(r["source_row"] for rows in splits.values() for r in rows) == list(range(103))
    assert splits["train"][0]["source_row"] != 0  # shuffled
    first = splits["train"][0]
    assert list(first)[:2] == ["question", "answer"]  # what a proposer reads first


def test_render_and_feedback(container: HotpotQA) -> None:
    row = next(r for r in container.splits()["train"] if r["type"] == "bridge")
    messages = container.render({"stage1_system": "SYS"}, row)
    assert messages[0].content == "SYS"
    user = messages[1].content
    assert user.index("[1] " + row["context"][0][0]) < user.index("Question: " + row["question"])
    assert user.rstrip().endswith("`Answer: <short answer>`.")
    reward, feedback = container.score(row, policy_result("Answer: Paris"))
    assert reward == 0.0
    assert f"expected `{row['answer']}`" in feedback and "the answer was `Paris`" in feedback
    for title, _ in row["supporting_facts"]:
        assert title in feedback
    reward, feedback = container.score(row, policy_result(f"Answer: {row['answer']}"))
    assert reward == 1.0 and feedback.startswith("Correct (F1 1.00, EM 1)") and "Supporting facts" not in feedback
    yes_no = next(r for r in container.splits()["train"] + container.splits()["test"] if r["answer"] in ("yes", "no"))
    assert "answer exactly yes or no" in container.score(yes_no, policy_result("Answer: maybe"))[1]


# ---------------------------------------------------------------- the contract, in process and as a process


def test_reward_option_em(data_dir: Path, container: HotpotQA, fake: FakeModel) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    HotpotQA.add_arguments(parser)
    em_container = HotpotQA(str(data_dir))
    em_container.configure(parser.parse_args(["--reward", "em"]))
    index = next(i for i, r in enumerate(em_container.splits()["train"]) if r["answer"] not in ("yes", "no"))
    task = em_container.task(f"train:{index}")
    body = {"rollout_id": "r1", "task_id": f"train:{index}", "candidate": em_container.program().seed_candidate,
            "task": task, "policy": _policy(fake, "wordy"), "metadata": {"seed": 1}}
    with TestClient(build_app(em_container)) as client:
        em = client.post("/rollout", json=body).json()
    with TestClient(build_app(container)) as client:
        f1 = client.post("/rollout", json=body).json()
    assert em["reward_info"]["outcome_reward"] == 0.0 and em["objective_scores"]["em"] == 0.0
    assert 0.0 < f1["reward_info"]["outcome_reward"] == f1["objective_scores"]["f1"] < 1.0
    assert "extra words" in f1["actionable_side_info"]["feedback"]


def _spec_from_config(data_dir: Path) -> RunSpec:
    raw = yaml.safe_load((REPO / "configs" / "container" / "hotpotqa.yaml").read_text())
    container = ContainerSpec.model_validate({**raw["container"], "data_dir": str(data_dir)})
    scripted = ModelSpec(provider="scripted", model="scripted-rules")
    return RunSpec(container=container, policy=scripted, proposer=scripted, algorithm=AlgorithmSpec(name="seed_only"),
                   pools=PoolsConfig.model_validate(raw["pools"]).resolve(), budget=BudgetSpec(max_rollouts=10))


def test_process_from_config_passes_preflight_and_scores(data_dir: Path, tmp_path: Path, fake: FakeModel,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    spec = _spec_from_config(data_dir)
    assert spec.container.command == ["python", "-m", "benchmarks.containers.hotpotqa"]

    async def drive(url: str) -> tuple[Any, list[Any]]:
        client = ContainerClient(url, concurrency=4)
        try:
            assert (await client.health()).contract_version == CONTRACT_VERSION
            checked = await preflight(client, spec, spec.container.target_modules)
            seed = checked.program.seed_candidate
            requests = [RolloutRequest(rollout_id=f"r-{model}-{task_id}", task_id=task_id, candidate=seed,
                                       task=checked.rows[task_id], policy=_policy(fake, model),
                                       metadata={"seed": 0, "stage": "train"})
                        for model in ("gold", "wrong", "bare") for task_id in spec.pools.train[:3]]
            return checked, list(await asyncio.gather(*(client.rollout(r) for r in requests)))
        finally:
            await client.aclose()

    with Services(tmp_path / "logs") as services:
        checked, results = asyncio.run(drive(services.container_url(spec.container)))
    assert checked.taskset.splits == {"train": 63, "test": 40} and checked.taskset.taskset_id == "hotpotqa"
    assert checked.program.target_modules == ["stage1_system"]
    assert len(checked.rows) == 40 + 23 + 40 and "question" in checked.rows["test:0"]
    assert checked.task_info and checked.task_info["reward"] == "f1"
    gold, wrong, bare = results[:3], results[3:6], results[6:]
    assert all(r.status == "ok" and r.resolved_reward() == 1.0 and r.objective_scores["em"] == 1.0 for r in gold)
    assert all(r.resolved_reward() == 0.0 and "expected `" in r.feedback and "Supporting paragraphs:" in r.feedback
               for r in wrong)
    assert all(r.resolved_reward() == 1.0 and "No `Answer:` line" in r.feedback for r in bare)
    assert gold[0].usage.prompt_tokens == 50 and gold[0].usage.completion_tokens == 5
    assert gold[0].trace and gold[0].trace["messages"][0]["content"] == hotpotqa.SEED_SYSTEM
    # The policy block asked for 64 tokens; the container's floor leaves room to reason.
    assert gold[0].trace["max_tokens"] == 256 and {r["max_tokens"] for r in fake.requests} == {256}
