"""`python -m harness doctor`: one line per finding with its fix, exit code 1 on a blocking
problem. Against a configured built-in container (started by the doctor) and against small
loopback containers that break the contract in one place each. Offline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from conftest import run_cli
from servers import ServerThread
from harness.processes import free_port

PROGRAM = {"version": "prompt_program.v1", "program_id": "p", "target_modules": ["system"],
           "modules": [{"module_id": "system", "role": "system", "content": "Answer.", "mutable": True}],
           "seed_candidate": {"system": "Answer."}}
GOOD: dict[str, Any] = {
    "/health": {"status": "ok"},
    "/metadata": {"metadata": {"optimizer_contracts": {"gepa": {"version": "synth_optimizers.gepa.v2"}}}},
    "/program": PROGRAM,
    "/taskset": {"taskset_id": "t", "splits": {"train": 2}},
    "/task_info": {"description": "d"},
}


def contract_app(answers: dict[str, Any], rollout: dict[str, Any], key: str | None = None) -> FastAPI:
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def route(path: str, request: Request) -> JSONResponse:
        route = "/" + path
        if key and route != "/health" and request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"detail": "missing or wrong bearer key"}, status_code=401)
        if route == "/taskset/tasks":
            body = await request.json()
            return JSONResponse({"tasks": [{"task_id": t, "split": "train", "text": "hi"} for t in body["task_ids"]]})
        if route == "/rollout":
            body = await request.json()
            return JSONResponse({"rollout_id": body["rollout_id"], **rollout})
        if route in answers:
            return JSONResponse(answers[route])
        return JSONResponse({"detail": "Not Found"}, status_code=404)

    return app


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    result = run_cli("doctor", *args, env=env, timeout=180)
    return result.returncode, result.stdout.strip().splitlines()


def test_a_built_in_container_passes(data_dir: Path) -> None:
    code, lines = doctor("container=banking77", f"data_dir={data_dir}")
    assert code == 0, lines
    assert lines[0].startswith("doctor: banking77 at http://127.0.0.1:")
    assert "OK    /metadata: optimizer contract synth_optimizers.gepa.v2" in lines
    assert any(re.match(r"OK    /rollout: reward [01] from reward_info.outcome_reward, status 'ok'$", line)
               for line in lines), lines
    assert any(line.startswith("OK    /rollout: feedback from actionable_side_info: ") for line in lines)
    assert any(line.startswith("OK    /rollout: inputs for the proposer") for line in lines)
    assert any(re.match(r"OK    /rollout: answer_examples: \d+ input\(s\) cited for \d+ answer\(s\)", line)
               for line in lines), lines
    assert lines[-1] == "doctor: 0 blocking problem(s), 0 warning(s)"


@pytest.mark.parametrize("case, answers, rollout, expected", [
    ("no_optimizer_contract", {**GOOD, "/metadata": {"metadata": {}}}, {"reward": 1.0},
     "ERROR /metadata: /metadata lacks metadata.optimizer_contracts.gepa.version; a container for this harness "
     "declares 'synth_optimizers.gepa.v2' there -> fix: set metadata.optimizer_contracts.gepa.version to "
     "'synth_optimizers.gepa.v2'"),
    ("not_mutable", {**GOOD, "/program": {**PROGRAM, "modules": [{**PROGRAM["modules"][0], "mutable": False}]}},
     {"reward": 1.0},
     "ERROR /program: target module 'system' is not mutable -> fix: list each target module among `modules`, "
     "mutable, with its candidate_field in `seed_candidate`"),
    ("no_reward", GOOD, {"status": "completed", "summary": {"status_detail": "grader timed out"}},
     "ERROR /rollout: error row: no reward in response: grader timed out -> fix: on success send a status such "
     "as ok/completed and reward_info.outcome_reward; on failure put the reason in `error` or `status_detail`"),
    ("no_taskset", {k: v for k, v in GOOD.items() if k != "/taskset"}, {"reward": 1.0},
     "ERROR /taskset: GET /taskset failed (fatal): HTTP 404: Not Found -> fix: serve the route, or advertise "
     "your path as metadata.optimizer_contracts.gepa.taskset_route"),
])
def test_each_problem_is_one_line_with_its_fix(case: str, answers: dict[str, Any], rollout: dict[str, Any],
                                                expected: str) -> None:
    with ServerThread(contract_app(answers, rollout)) as server:
        code, lines = doctor(server.url)
    assert code == 1, lines
    assert expected in lines, lines
    assert sum(line.startswith("ERROR") for line in lines) == 1 and lines[-1].startswith("doctor: 1 blocking")


def test_warnings_do_not_block() -> None:
    """A bare success (top-level reward, nothing else): no feedback, inputs, output or usage."""
    with ServerThread(contract_app(GOOD, {"reward": 0.5})) as server:
        code, lines = doctor(server.url)
    assert code == 0, lines
    assert "OK    /rollout: reward 0.5 from reward, no status (read as ok)" in lines
    warnings = [line for line in lines if line.startswith("WARN")]
    assert len(warnings) == 5 and all(" -> fix: " in w for w in warnings)
    assert any("no feedback: the proposer reflects on nothing" in w for w in warnings)
    assert any("did not call the policy endpoint" in w for w in warnings)


def test_a_keyed_container_and_nothing_listening() -> None:
    with ServerThread(contract_app(GOOD, {"reward": 1.0}, key="k-123")) as server:
        code, lines = doctor(server.url)
        keyed, keyed_lines = doctor(server.url, "--api-key-env", "DOCTOR_TEST_KEY", env={"DOCTOR_TEST_KEY": "k-123"})
    assert code == 1 and any(line.startswith("ERROR /metadata: GET /metadata failed (fatal): HTTP 401") and
                             "fix: pass --api-key-env VAR" in line for line in lines), lines
    assert keyed == 0, keyed_lines
    url = f"http://127.0.0.1:{free_port()}"
    code, lines = doctor(url)
    assert code == 1 and lines[1].startswith(f"ERROR /health: nothing answers at {url}") and "fix: start the" in lines[1]


def test_a_cut_off_answer_is_named_with_the_long_answer_fix() -> None:
    rollout = {"status": "ok", "reward_info": {"outcome_reward": 0.0}, "actionable_side_info": {
        "feedback": "incomplete", "inputs": "Q"}, "trace": {"output": "The answer is", "finish_reason": "length"},
        "usage": {"prompt_tokens": 5, "completion_tokens": 24}}
    with ServerThread(contract_app(GOOD, rollout)) as server:
        code, lines = doctor(server.url)
    assert code == 0, lines
    assert ("WARN  /rollout: the answer was cut off at max_tokens 24 (the policy profiles' value) -> fix: for long "
            "answers set a floor (kit: min_policy_tokens) or raise policy.max_tokens") in lines
