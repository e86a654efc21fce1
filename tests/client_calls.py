"""Calling a contract server through the real client in tests: a fresh
`ContainerClient` per call with fast retries, and a rollout request for the scripted policy."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from harness.client import ContainerClient
from harness.contract import PolicyBlock, RolloutRequest
from harness.retry import RetryPolicy

FAST = RetryPolicy(attempts=4, base_delay_s=0.01, max_delay_s=0.02)


def call(url: str, fn: Callable[[ContainerClient], Awaitable[Any]], **kwargs: Any) -> Any:
    """Run `fn(client)` with a fresh client (fast retries unless given)."""
    kwargs.setdefault("retry", FAST)

    async def go() -> Any:
        client = ContainerClient(url, **kwargs)
        try:
            return await fn(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def request_for(rollout_id: str, candidate: dict[str, str], task: dict[str, Any], policy_url: str) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rollout_id, task_id=task.get("task_id", "train:0"), candidate=candidate, task=task,
        policy=PolicyBlock(provider="scripted", model="scripted-rules", base_url=policy_url, max_tokens=24),
        metadata={"candidate_id": "c0000", "seed": 0, "stage": "test"},
    )
