"""Chaos: Banking77 with faults injected into its /rollout route, for fault-injection tests
and soaks. A real, registered container (`configs/container/chaos.yaml`): same data,
program and scoring as Banking77, same bearer check.

Run: `python -m benchmarks.containers.chaos --port 8123 --fault-rate 0.05 --fault-kinds 500,hang --seed 0`.

Which rollouts fail depends on (seed, rollout id) alone, so a rerun fails the same
rollouts (`FaultPlan.fault_for`). A faulted rollout fails its first `--fault-attempts`
attempts (default 1: the harness's retry gets a real answer; 0: every attempt), one way:

- `500`: HTTP 500 (transient for the client: retried)
- `hang`: no answer for `--hang-s` seconds (past the client's timeout: retried)
- `malformed`: HTTP 200 whose body is cut-off JSON
- `no_reward`: HTTP 200, status ok, no reward in any of the places the contract allows
- `wrong_id`: HTTP 200 answering for another rollout id

`--die-after N` ends the process (exit code 3) when rollout request N+1 arrives, in the
middle of whatever else is in flight. With `--journal PATH` the attempt counts of faulted
rollouts survive a restart (one line per attempt), so a rollout retried against the
restarted process is not faulted again as if it were new. Each injected fault is one stderr line
(`chaos: injected KIND rollout=ID attempt=K`); GET /chaos/stats counts them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from benchmarks.containers.banking77 import Banking77
from benchmarks.containers.kit import RewardInfo, RolloutEnv, RolloutRequest, RolloutResponse, Row, Usage, serve

FAULT_KINDS = ("500", "hang", "malformed", "no_reward", "wrong_id")
# faults the harness's client retries (a second attempt gets a real answer); the others
# come back as a 200 that the harness records as a failed row
RETRIED_KINDS = frozenset({"500", "hang"})
DIE_EXIT_CODE = 3


class FaultPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    rate: float = Field(default=0.0, ge=0.0, le=1.0)
    kinds: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    attempts: int = Field(default=1, ge=0)  # first attempts of a faulted rollout that fail; 0: all
    hang_s: float = Field(default=30.0, gt=0)
    die_after: int | None = Field(default=None, ge=0)

    @field_validator("kinds")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(FAULT_KINDS))
        if unknown or not value:
            raise ValueError(f"fault kinds must be a non-empty subset of {list(FAULT_KINDS)}, got {list(value)}")
        return value

    def fault_for(self, rollout_id: str) -> str | None:
        """The fault this rollout id gets (None: none): a function of seed and id only."""
        digest = hashlib.sha256(f"{self.seed}:{rollout_id}".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2**64 >= self.rate:
            return None
        return self.kinds[int.from_bytes(digest[8:16], "big") % len(self.kinds)]

    def fails_attempt(self, attempt: int) -> bool:
        """Whether attempt `attempt` (1-based) of a faulted rollout fails."""
        return self.attempts == 0 or attempt <= self.attempts


class _MalformedBody(Exception):
    def __init__(self, rollout_id: str):
        super().__init__(rollout_id)
        self.rollout_id = rollout_id


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Chaos(Banking77):
    name = "Banking77 behind a fault injector"

    def __init__(self, data_dir: str | None = None, plan: FaultPlan | None = None) -> None:
        super().__init__(data_dir)
        self.plan = plan or FaultPlan()
        self.received = 0
        self.injected: Counter[str] = Counter()
        self._attempts: Counter[str] = Counter()
        self._journal: Path | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--fault-rate", type=float, default=0.0, help="share of rollout ids that get a fault")
        parser.add_argument("--fault-kinds", default=",".join(FAULT_KINDS),
                            help=f"comma-separated subset of {','.join(FAULT_KINDS)}")
        parser.add_argument("--seed", type=int, default=0, help="which rollout ids fail (with the rate)")
        parser.add_argument("--fault-attempts", type=int, default=1,
                            help="attempts of a faulted rollout that fail before it is served (0: every one)")
        parser.add_argument("--hang-s", type=float, default=30.0, help="how long a `hang` fault holds the request")
        parser.add_argument("--die-after", type=int, default=None,
                            help=f"exit (code {DIE_EXIT_CODE}) when rollout request N+1 arrives")
        parser.add_argument("--journal", default=None,
                            help="file keeping the attempt counts of faulted rollouts across restarts")

    def configure(self, args: argparse.Namespace) -> None:
        self.plan = FaultPlan(rate=args.fault_rate, kinds=tuple(k.strip() for k in args.fault_kinds.split(",") if k.strip()),
                              seed=args.seed, attempts=args.fault_attempts, hang_s=args.hang_s,
                              die_after=args.die_after)
        if args.journal:
            self._journal = Path(args.journal)
            if self._journal.exists():
                self._attempts.update(self._journal.read_text().split())

    async def rollout(self, req: RolloutRequest, row: Row, env: RolloutEnv) -> RolloutResponse:
        self.received += 1
        if self.plan.die_after is not None and self.received > self.plan.die_after:
            _say(f"chaos: exiting after {self.plan.die_after} rollouts")
            os._exit(DIE_EXIT_CODE)
        kind = self.plan.fault_for(req.rollout_id)
        if kind is None:
            return await super().rollout(req, row, env)  # the Banking77 rollout
        self._attempts[req.rollout_id] += 1
        attempt = self._attempts[req.rollout_id]
        if self._journal is not None:
            with self._journal.open("a") as journal:
                journal.write(req.rollout_id + "\n")
        if not self.plan.fails_attempt(attempt):
            return await super().rollout(req, row, env)
        self.injected[kind] += 1
        _say(f"chaos: injected {kind} rollout={req.rollout_id} attempt={attempt}")
        if kind == "500":
            raise HTTPException(500, "chaos: injected server error")
        if kind == "hang":
            await asyncio.sleep(self.plan.hang_s)
            return await super().rollout(req, row, env)
        if kind == "malformed":
            raise _MalformedBody(req.rollout_id)
        if kind == "no_reward":
            return RolloutResponse(rollout_id=req.rollout_id, status="ok", usage=Usage(), trace={"output": ""})
        return RolloutResponse(rollout_id=f"{req.rollout_id}-not-mine", status="ok",
                               reward_info=RewardInfo(outcome_reward=1.0))

    def extend_app(self, app: FastAPI) -> None:
        @app.exception_handler(_MalformedBody)
        async def _malformed(_: Request, exc: _MalformedBody) -> Response:
            cut = '{"rollout_id": "%s", "status": "ok", "reward_info": {"outcome_rew' % exc.rollout_id
            return Response(cut, status_code=200, media_type="application/json")

        @app.get("/chaos/stats")
        async def stats() -> dict[str, Any]:
            return {"pid": os.getpid(), "received": self.received, "injected": dict(self.injected),
                    "plan": self.plan.model_dump()}


if __name__ == "__main__":
    serve(Chaos)
