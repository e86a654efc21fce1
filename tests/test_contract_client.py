"""The task contract through the real client (harness.client.ContainerClient): every route
of both reference containers (real child processes) and bearer auth. The misbehaving
contract server is in test_contract_client_faults.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from client_calls import call, request_for
from conftest import CONTAINER_MODULES, container_spec
from pydantic import ValidationError

from harness.client import ContainerClient
from harness.contract import (
    CONTRACT_VERSION,
    GEPA_OPTIMIZER_CONTRACT,
    PROGRAM_VERSION,
    PolicyBlock,
)
from harness.errors import (
    ConfigError,
    FailureKind,
    ServiceError,
)
from harness.services import Services

# ---------------------------------------------------------------- both reference containers


@pytest.fixture(params=["banking77", "heart_disease"])
def container(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, request.getfixturevalue(f"{request.param}_url")


def test_every_route_of_the_reference_containers(container: tuple[str, str], scripted_policy: Any) -> None:
    name, url = container

    async def go(client: ContainerClient) -> dict[str, Any]:
        health, metadata, program, taskset = (await client.health(), await client.metadata(),
                                              await client.program(), await client.taskset())
        tasks = await client.tasks("train", ["train:0", "train:1", "train:2"])
        test_tasks = await client.tasks("test", ["test:0"])
        info = await client.task_info()
        rollout = await client.rollout(request_for("r-every-route", program.seed_candidate, tasks[0].model_dump(),
                                                   scripted_policy.base_url))
        return locals()

    got = call(url, go)
    assert got["health"].status == "ok" and got["health"].contract_version == CONTRACT_VERSION
    assert got["metadata"].gepa_contract == GEPA_OPTIMIZER_CONTRACT
    assert got["metadata"].capabilities["contract_version"] == CONTRACT_VERSION
    program = got["program"]
    assert program.version == PROGRAM_VERSION and program.target_modules == [CONTAINER_MODULES[name]]
    field = program.field_of(program.target_modules[0])
    assert program.seed_candidate[field].strip()
    taskset = got["taskset"]
    assert set(taskset.splits) == {"train", "test"} and all(n > 0 for n in taskset.splits.values())
    assert [t.task_id for t in got["tasks"]] == ["train:0", "train:1", "train:2"]
    assert [t.seed for t in got["tasks"]] == [0, 1, 2] and all(t.split == "train" for t in got["tasks"])
    assert got["test_tasks"][0].task_id == "test:0"
    assert isinstance(got["info"], dict) and got["info"]
    rollout = got["rollout"]
    assert rollout.rollout_id == "r-every-route" and rollout.status == "ok"
    assert 0.0 <= rollout.resolved_reward() <= 1.0
    assert rollout.usage.prompt_tokens > 0 and rollout.usage.completion_tokens > 0
    assert rollout.feedback and rollout.output_text


def test_unknown_task_id_is_fatal_and_named(banking77_url: str) -> None:
    with pytest.raises(ServiceError) as caught:
        call(banking77_url, lambda c: c.tasks("train", ["train:999999"]))
    assert caught.value.kind is FailureKind.FATAL
    assert "/taskset/tasks" in str(caught.value) and "404" in str(caught.value)


# ---------------------------------------------------------------- a container with a key


@pytest.fixture(scope="module")
def keyed_banking77(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    key = f"ck-{uuid.uuid4().hex}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_TEST_CONTAINER_KEY", key)
        mp.setenv("HARNESS_TEST_WRONG_KEY", "not-the-key")
        with Services(tmp_path_factory.mktemp("keyed-logs")) as services:
            spec = container_spec("banking77", data_dir, api_key_env="HARNESS_TEST_CONTAINER_KEY")
            yield services.container_url(spec), key


@pytest.mark.parametrize("route", ["/metadata", "/program", "/taskset", "/task_info"])
def test_keyed_container_rejects_a_client_without_the_key(keyed_banking77: tuple[str, str], route: str) -> None:
    url, _ = keyed_banking77
    method = {"/metadata": "metadata", "/program": "program", "/taskset": "taskset", "/task_info": "task_info"}[route]
    if route == "/task_info":  # optional route: a fatal answer reads as "not offered"
        assert call(url, lambda c: c.task_info()) is None
        return
    for key_env in (None, "HARNESS_TEST_WRONG_KEY"):
        with pytest.raises(ServiceError) as caught:
            call(url, lambda c: getattr(c, method)(), api_key_env=key_env)
        assert caught.value.kind is FailureKind.FATAL
        assert route in str(caught.value) and "401" in str(caught.value)


def test_keyed_container_works_with_the_key(keyed_banking77: tuple[str, str], scripted_policy: Any) -> None:
    url, _ = keyed_banking77

    async def go(client: ContainerClient) -> Any:
        program = await client.program()
        task = (await client.tasks("train", ["train:5"]))[0]
        await client.taskset()
        return await client.rollout(request_for("r-keyed", program.seed_candidate, task.model_dump(),
                                                scripted_policy.base_url))

    response = call(url, go, api_key_env="HARNESS_TEST_CONTAINER_KEY")
    assert response.status == "ok" and response.rollout_id == "r-keyed"
    # without the key, the same rollout is refused before anything runs
    with pytest.raises(ServiceError, match=r"POST /rollout failed \(fatal\): HTTP 401"):
        call(url, lambda c: c.rollout(request_for("r-nokey", {"stage2_system": "x"}, {}, scripted_policy.base_url)))
    assert call(url, lambda c: c.health()).status == "ok"  # liveness stays open


def test_client_names_an_unset_key_variable(keyed_banking77: tuple[str, str]) -> None:
    url, _ = keyed_banking77
    with pytest.raises(ConfigError, match="HARNESS_TEST_UNSET_KEY"):
        call(url, lambda c: c.metadata(), api_key_env="HARNESS_TEST_UNSET_KEY")


@pytest.mark.parametrize("field", [
    {"api_key": "{secret}"}, {"openai_api_key": "{secret}"}, {"x-api-key": "{secret}"}, {"apiKey": "{secret}"},
    {"password": "{secret}"}, {"headers": {"Authorization": "Bearer {secret}"}},
    {"extra_body": [{"access_token": "{secret}"}]},
], ids=lambda f: "-".join(f))
def test_a_key_inside_the_policy_block_is_refused(keyed_banking77: tuple[str, str], scripted_policy: Any,
                                                  field: dict[str, Any]) -> None:
    url, key = keyed_banking77
    secret = f"sk-leak-{uuid.uuid4().hex}"
    leak = json.loads(json.dumps(field).replace("{secret}", secret))
    body = {
        "rollout_id": "r-leak", "task_id": "train:0", "candidate": {"stage2_system": "Answer."}, "task": {},
        "policy": {"provider": "openai_compatible", "model": "m", "base_url": scripted_policy.base_url, **leak},
    }
    refused = httpx.post(f"{url}/rollout", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert refused.status_code == 422
    assert "credentials" in refused.text and secret not in refused.text
    # without the container key the request is turned away before its body is read
    assert httpx.post(f"{url}/rollout", json=body, timeout=10).status_code == 401
    # the harness cannot even build such a request
    with pytest.raises(ValidationError, match="credentials"):
        PolicyBlock(provider="openai_compatible", model="m", base_url="http://x", **leak)


def test_ordinary_extra_policy_fields_pass() -> None:
    block = PolicyBlock(provider="openai_compatible", model="m", base_url="http://x", top_k=5, max_completion_tokens=9,
                        keep_alive="5m", extra_body={"stop": ["\n"]})
    assert block.model_extra["top_k"] == 5
