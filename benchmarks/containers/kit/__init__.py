"""The container kit: everything a task container written in Python imports, from here.

A container is data + a program + either `render` and `score` (`SingleCallContainer`: one
policy call per rollout) or its own `rollout` (`MultiStepContainer`: a grader, a simulated
user, tools). `serve` runs it as a CLI, `build_app` gives the FastAPI app. The contract's
types (`harness.contract`) and the model client are re-exported, so a container needs no
other import from the harness."""

from benchmarks.containers.kit.app import build_app, serve
from benchmarks.containers.kit.container import (
    MultiStepContainer,
    PolicyResult,
    RolloutEnv,
    Row,
    SingleCallContainer,
    TaskContainer,
    failed_response,
    policy_endpoint,
    policy_result,
    request_seed,
    seeded_split,
    user_text,
)
from harness.contract import (
    PROGRAM_VERSION,
    ProgramModule,
    ProgramResponse,
    RewardInfo,
    RolloutRequest,
    RolloutResponse,
    SideInfo,
    Usage,
    role_url,
)
from harness.errors import HarnessError
from harness.llm import ChatClient, ChatMessage
from harness.pricing import cost_usd

__all__ = [
    # the two kinds of container, their base and the CLI / app
    "SingleCallContainer", "MultiStepContainer", "TaskContainer", "serve", "build_app",
    # what a rollout uses
    "Row", "RolloutEnv", "PolicyResult", "policy_result", "failed_response", "policy_endpoint", "request_seed",
    "seeded_split", "user_text",
    # the task contract's types
    "PROGRAM_VERSION", "ProgramModule", "ProgramResponse", "RolloutRequest", "RolloutResponse", "RewardInfo",
    "SideInfo", "Usage", "role_url",
    # model calls, their price, and the error a container raises for a clear error row
    "ChatClient", "ChatMessage", "cost_usd", "HarnessError",
]
