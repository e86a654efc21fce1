"""Task containers: scoring, rendering, splits, dataset download, and the HTTP contract
(auth, validation, rollout) against a small OpenAI-compatible fake on loopback. Offline."""

from __future__ import annotations

import hashlib
import http.server
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from benchmarks.containers.banking77 import Banking77, normalize_label
from benchmarks.containers.data import DatasetError, dataset_file
from benchmarks.containers.heart_disease import HeartDisease, normalize_answer
from benchmarks.containers.kit import build_app, policy_endpoint, policy_result
from harness.contract import CONTRACT_VERSION, GEPA_OPTIMIZER_CONTRACT, RolloutResponse
from harness.processes import ManagedProcess, free_port
from servers import ServerThread

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def banking(data_dir: Path) -> Banking77:
    return Banking77(str(data_dir))


@pytest.fixture(scope="module")
def heart(data_dir: Path) -> HeartDisease:
    return HeartDisease(str(data_dir))


class FakeModel:
    """OpenAI-compatible fake: answers `answer`, or HTTP 400 for model `broken`; records requests."""

    def __init__(self) -> None:
        self.answer = "card_arrival"
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append({"body": body, "authorization": request.headers.get("authorization")})
            if body["model"] == "broken":
                return JSONResponse({"error": "no such model"}, status_code=400)
            return JSONResponse({
                "choices": [{"message": {"role": "assistant", "content": self.answer}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3},
            })

        self.server = ServerThread(app)
        self.port = self.server.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModel]:
    fake = FakeModel()
    with fake.server:
        yield fake


def _policy(fake: FakeModel, **over: Any) -> dict[str, Any]:
    return {"provider": "openai", "model": "fake", "base_url": fake.base_url,
            "max_tokens": 16, "temperature": 0.0, **over}


def _rollout_body(container: Any, task_id: str, policy: dict[str, Any], *, with_task: bool = True) -> dict[str, Any]:
    return {
        "rollout_id": f"r-{task_id}", "task_id": task_id,
        "candidate": container.program().seed_candidate,
        "task": container.task(task_id) if with_task else {},
        "policy": policy, "metadata": {"candidate_id": "c0", "seed": 7, "stage": "train"},
    }


# ---------------------------------------------------------------- scoring and rendering


@pytest.mark.parametrize("raw, expected", [
    ("card_arrival", "card_arrival"),
    ("  `card_arrival`.\nBecause the card is late", "card_arrival"),
    ('"Card Arrival"', "card_arrival"),
    ("Intent: card_arrival", "card_arrival"),
    ("label: 'lost_or_stolen_card'.", "lost_or_stolen_card"),
    ("\n\n**Refund_not_showing_up**", "refund_not_showing_up"),
    ("", ""),
])
def test_banking_normalize(raw: str, expected: str) -> None:
    assert normalize_label(raw) == expected


def test_banking_score_and_feedback(banking: Banking77) -> None:
    row = {"text": "where is my card", "label": "card_arrival"}
    assert banking.score(row, policy_result("  card_arrival\n")) == (1.0, "Correct: `card_arrival`.")
    # exact after trimming: another spelling of the right label scores 0, and says so
    for near_miss in ("Card arrival.", "`card_arrival`", "Intent: card_arrival", "card_arrival\nbecause"):
        reward, feedback = banking.score(row, policy_result(near_miss))
        assert reward == 0.0 and feedback.startswith("Wrong format: the intent `card_arrival` is right"), near_miss
    reward, feedback = banking.score(row, policy_result("card_linking"))
    assert reward == 0.0
    assert "expected intent `card_arrival`" in feedback and "`card_linking`" in feedback
    assert "not one of the 77" not in feedback
    assert "not one of the 77" in banking.score(row, policy_result("my card is late"))[1]
    assert "empty" in banking.score(row, policy_result("   "))[1]
    # Upstream spells two labels oddly; the exact spelling is the answer.
    odd, refund = {"text": "x", "label": "reverted_card_payment?"}, {"text": "x", "label": "Refund_not_showing_up"}
    assert banking.score(odd, policy_result("reverted_card_payment?"))[0] == 1.0
    assert banking.score(odd, policy_result("reverted_card_payment"))[0] == 0.0
    assert banking.score(refund, policy_result("Refund_not_showing_up"))[0] == 1.0


def test_banking_feedback_contrasts_intents_with_examples_outside_every_pool(banking: Banking77) -> None:
    from benchmarks.containers.banking77 import EXAMPLE_BANK_START

    row = {"text": "where is my card", "label": "card_arrival"}
    _, feedback = banking.score(row, policy_result("card_linking"))
    arrival, linking = banking.examples("card_arrival"), banking.examples("card_linking")
    assert len(arrival) == 2 and len(linking) == 2
    assert all(f'"{text}"' in feedback for text in arrival + linking)
    # examples come from the bank at the end of train, never from rows a pool can reach
    bank = {" ".join(r["text"].split()) for r in banking.splits()["train"][EXAMPLE_BANK_START:]}
    pools = {" ".join(r["text"].split()) for r in banking.splits()["train"][:EXAMPLE_BANK_START]}
    assert set(arrival + linking) <= bank and not (set(arrival + linking) & pools - bank)
    # an answer that is not a label: the nearest valid one is named
    _, feedback = banking.score(row, policy_result("card_arival"))
    assert "not one of the 77" in feedback and "nearest valid label is `card_arrival`" in feedback
    # the proposer sees the customer's message, not the 77-label prompt or the raw row
    assert banking.reflection_input(row) == "where is my card"


def test_banking_render_puts_labels_before_query(banking: Banking77) -> None:
    row = {"text": "My card has not arrived yet {weird braces}", "label": "card_arrival"}
    messages = banking.render({"stage2_system": "SYS"}, row)
    assert [m.role for m in messages] == ["system", "user"] and messages[0].content == "SYS"
    user = messages[1].content
    labels = banking.labels()
    assert len(labels) == 77
    assert max(user.index(label) for label in labels) < user.index(row["text"])
    assert user.endswith(row["text"] + "\n\nAnswer with the intent label only.")
    # The prefix up to the query is the same for every row (prefix caching).
    other = banking.render({"stage2_system": "SYS"}, {"text": "zzz", "label": "x"})[1].content
    assert user.split(row["text"])[0] == other.split("zzz")[0]


@pytest.mark.parametrize("raw, expected", [("Yes.", "yes"), ("**No**, because", "no"), ("no", "no"), ("", "")])
def test_heart_normalize(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_heart_score_render(heart: HeartDisease) -> None:
    sick = next(r for r in heart.splits()["train"] if r["target"] == 1 and r["thal"] == 7)
    assert heart.score(sick, policy_result("Yes, likely."))[0] == 1.0
    reward, feedback = heart.score(sick, policy_result("No."))
    assert reward == 0.0 and "expected `yes`" in feedback and "`no`" in feedback
    # findings are written as the policy sees them in its prompt, not as raw codes
    assert "Thallium stress test: reversible defect" in feedback and "thal" not in feedback.lower().split()
    shown = heart.render(heart.program().seed_candidate, sick)[1].content
    assert "Thallium stress test: reversible defect" in shown
    assert heart.reflection_input(sick) in shown and "cp:" not in heart.reflection_input(sick)
    assert "must start with 'yes' or 'no'" in heart.score(sick, policy_result("Possibly"))[1]
    missing = next(r for r in heart.splits()["train"] + heart.splits()["test"] if r["ca"] is None)
    text = heart.render(heart.program().seed_candidate, missing)[1].content
    assert "Major vessels coloured by fluoroscopy: unknown" in text
    assert "Age: " in text and "years" in text and "Chest pain type: " in text


# ---------------------------------------------------------------- splits


def test_splits_are_deterministic(data_dir: Path, banking: Banking77, heart: HeartDisease) -> None:
    again = Banking77(str(data_dir)).splits()
    assert banking.splits()["train"][:50] == again["train"][:50]
    assert {k: len(v) for k, v in again.items()} == {"train": 10003, "test": 3080}
    assert len({r["label"] for r in banking.splits()["train"][:20]}) >= 12  # shuffled, not label-sorted
    h = heart.splits()
    assert (len(h["train"]), len(h["test"])) == (203, 100)
    assert h == HeartDisease(str(data_dir)).splits()
    assert sorted(r["source_row"] for r in h["train"] + h["test"]) == list(range(303))
    assert sum(r["target"] for r in h["train"] + h["test"]) == 139


# ---------------------------------------------------------------- dataset download


@pytest.fixture()
def file_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_download_verifies_checksum(file_server: tuple[str, Path], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    base, root = file_server
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    payload = b"a,b\n1,2\n"
    (root / "good.csv").write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    path = dataset_file(None, "toy", "good.csv", f"{base}/good.csv", sha)
    assert path == tmp_path / "cache" / "gepa-harness" / "datasets" / "toy" / "good.csv"
    assert path.read_bytes() == payload
    (root / "good.csv").unlink()  # second call is served from the cache
    assert dataset_file(None, "toy", "good.csv", f"{base}/good.csv", sha) == path

    (root / "bad.csv").write_bytes(b"tampered\n")
    with pytest.raises(DatasetError, match="checksum mismatch for toy/bad.csv") as info:
        dataset_file(None, "toy", "bad.csv", f"{base}/bad.csv", sha)
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in path.parent.iterdir()) == ["good.csv"]  # nothing half-written left
    with pytest.raises(DatasetError, match="HTTP 404"):
        dataset_file(None, "toy", "gone.csv", f"{base}/gone.csv", sha)


def test_local_copy_wins_without_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "data" / "toy").mkdir(parents=True)
    (tmp_path / "data" / "toy" / "f.txt").write_text("x")
    got = dataset_file(str(tmp_path / "data"), "toy", "f.txt", "http://127.0.0.1:9/none", "0" * 64)
    assert got == tmp_path / "data" / "toy" / "f.txt"


# ---------------------------------------------------------------- HTTP contract


def test_read_routes_and_tasks(banking: Banking77) -> None:
    with TestClient(build_app(banking)) as client:
        assert client.get("/health").json() == {"status": "ok", "contract_version": CONTRACT_VERSION}
        meta = client.get("/metadata").json()
        assert meta["capabilities"] == {"protocol": "http", "contract_version": CONTRACT_VERSION}
        assert meta["metadata"]["optimizer_contracts"]["gepa"]["version"] == GEPA_OPTIMIZER_CONTRACT
        program = client.get("/program").json()
        assert program["target_modules"] == ["stage2_system"]
        assert [m["module_id"] for m in program["modules"]] == ["stage2_system", "stage2_user"]
        taskset = client.get("/taskset").json()
        assert taskset["splits"] == {"train": 10003, "test": 3080} and len(taskset["labels"]) == 77
        assert client.get("/task_info").json()["labels"] == taskset["labels"]
        tasks = client.post("/taskset/tasks", json={"split": "train", "task_ids": ["train:0", "train:5", "train:0"]})
        assert tasks.status_code == 200
        got = tasks.json()["tasks"]
        assert [t["task_id"] for t in got] == ["train:0", "train:5", "train:0"]
        assert got[1]["split"] == "train" and got[1]["seed"] == 5 and got[1]["text"] and got[1]["label"]
        for body, needle in [
            ({"split": "train", "task_ids": ["train:99999"]}, "train:99999"),
            ({"split": "train", "task_ids": ["test:0"]}, "test:0"),
            ({"split": "train", "task_ids": ["nonsense"]}, "nonsense"),
            ({"split": "dev", "task_ids": ["dev:0"]}, "dev"),
        ]:
            resp = client.post("/taskset/tasks", json=body)
            assert resp.status_code == 404 and needle in resp.json()["detail"]


def test_bearer_auth(banking: Banking77, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CONTAINER_KEY", "ck-s3cret")
    with TestClient(build_app(banking, api_key_env="TEST_CONTAINER_KEY")) as client:
        assert client.get("/health").status_code == 200
        for path in ("/metadata", "/program", "/taskset", "/task_info"):
            assert client.get(path).status_code == 401
        assert client.get("/taskset", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.post("/rollout", content=b"not json").status_code == 401
        ok = client.get("/taskset", headers={"Authorization": "Bearer ck-s3cret"})
        assert ok.status_code == 200 and "ck-s3cret" not in ok.text


def test_credential_in_policy_block_is_422_without_echo(banking: Banking77, fake_model: FakeModel) -> None:
    body = _rollout_body(banking, "train:0", _policy(fake_model, api_key="sk-LEAKED-123"))
    with TestClient(build_app(banking)) as client:
        resp = client.post("/rollout", json=body)
    assert resp.status_code == 422
    assert "sk-LEAKED-123" not in resp.text and "api_key" in resp.text


def test_rollout_scores_with_policy_model(banking: Banking77, fake_model: FakeModel,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_POLICY_KEY", "pk-abc")
    train = banking.splits()["train"]
    right = f"train:{next(i for i, r in enumerate(train) if r['label'] == 'card_arrival')}"
    wrong = f"train:{next(i for i, r in enumerate(train) if r['label'] != 'card_arrival')}"
    fake_model.answer, fake_model.requests[:] = "card_arrival", []
    with TestClient(build_app(banking, policy_key_env="TEST_POLICY_KEY")) as client:
        ok = RolloutResponse.model_validate(client.post("/rollout", json=_rollout_body(
            banking, right, _policy(fake_model, temperature=0.3, max_tokens=12))).json())
        # Full inference URL and no task in the body: the row is looked up by id.
        inference = {"provider": "openai", "model": "fake", "inference_url": fake_model.base_url + "/chat/completions/"}
        miss = client.post("/rollout", json=_rollout_body(banking, wrong, inference, with_task=False)).json()
        unknown = client.post("/rollout", json=_rollout_body(banking, "train:0", inference) | {
            "task_id": "train:99999", "task": {}})
    assert ok.status == "ok" and ok.resolved_reward() == 1.0 and ok.output_text == "card_arrival"
    assert ok.usage.prompt_tokens == 11 and ok.usage.completion_tokens == 3 and ok.usage.cost_usd is None
    assert ok.feedback == "Correct: `card_arrival`." and ok.trace and ok.trace["model"] == "fake"
    assert ok.trace["messages"][0] == {"role": "system", "content": banking.program().seed_candidate["stage2_system"]}
    sent = fake_model.requests[0]
    assert sent["authorization"] == "Bearer pk-abc"
    assert sent["body"]["temperature"] == 0.3 and sent["body"]["max_tokens"] == 12 and sent["body"]["seed"] == 7
    assert miss["reward_info"]["outcome_reward"] == 0.0 and "Wrong: expected intent" in miss["actionable_side_info"]["feedback"]
    # the inputs the feedback cites, by answer: the row under its own label, each intent's examples under it
    row = banking.task(wrong)
    assert ok.answer_examples == {"card_arrival": [banking.task(right)["text"]]}
    assert miss["actionable_side_info"]["answer_examples"] == {
        row["label"]: [row["text"], *banking.examples(row["label"])], "card_arrival": banking.examples("card_arrival")}
    assert all(f'"{text}"' in miss["actionable_side_info"]["feedback"] for text in banking.examples("card_arrival"))
    assert unknown.status_code == 404 and "train:99999" in unknown.json()["detail"]


def test_rollout_policy_failure_is_error_row(heart: HeartDisease, fake_model: FakeModel) -> None:
    with TestClient(build_app(heart)) as client:
        resp = client.post("/rollout", json=_rollout_body(heart, "test:3", _policy(fake_model, model="broken")))
        lacking = client.post("/rollout", json=_rollout_body(heart, "test:3", _policy(fake_model)) | {"candidate": {}})
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "error" and body["reward_info"] is None  # no reward: never a zero
    assert "HTTP 400" in body["error"] and body["error_kind"] == "fatal"
    assert lacking.status_code == 422 and "system" in lacking.text


def test_policy_endpoint() -> None:
    assert policy_endpoint("http://h/v1/chat/completions") == "http://h/v1"
    assert policy_endpoint("http://h/v1/") == "http://h/v1"


def test_cli_serves_concurrent_rollouts(data_dir: Path, heart: HeartDisease, fake_model: FakeModel,
                                        tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.containers.heart_disease", "--port", str(port),
               "--data-dir", str(data_dir), "--api-key-env", "TEST_CLI_KEY"]
    fake_model.answer = "Yes."
    proc = ManagedProcess("heart", command, health_url=f"http://127.0.0.1:{port}/health",
                          log_path=tmp_path / "heart.log", env={"TEST_CLI_KEY": "k1"}, cwd=str(REPO),
                          startup_timeout_s=30)
    with proc:
        headers = {"Authorization": "Bearer k1"}
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/taskset", headers=headers).json()["labels"] == ["no", "yes"]

        def one(i: int) -> dict[str, Any]:
            body = _rollout_body(heart, f"train:{i}", _policy(fake_model))
            return httpx.post(f"{url}/rollout", json=body, headers=headers, timeout=30).json()

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(16)))
    targets = [heart.splits()["train"][i]["target"] for i in range(16)]
    assert [r["reward_info"]["outcome_reward"] for r in results] == [float(t) for t in targets]
    assert all(r["status"] == "ok" for r in results)
