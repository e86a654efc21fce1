"""Overhead benchmark (not a test): rollouts per second through the whole harness against a
container whose policy answers instantly, next to the rate that same container serves to a
bare async HTTP load loop, in one invocation.

The container is `benchmarks.containers.instant` (Banking77 with an in-process policy: no
model call, so the container's own cost per rollout is what the raw loop measures). Arms,
interleaved over rounds so drift on a shared machine hits all alike, median reported:

- `raw`: an httpx loop POSTing prepared /rollout bodies, `--concurrency` in flight.
- `raw_aiohttp`: the same loop with aiohttp's client, which the harness's contract client
  uses: the container's ceiling with the lighter client.
- `harness_eval`: `execute_run` with the seed-only algorithm over a pareto pool of
  `--rollouts` rows: contract client, run context (the rollout choke point), evidence
  writer, gateway registration; the optimizer does no more than evaluate.
- `harness_gepa`: `execute_run` with our GEPA, a budget of `--rollouts`, minibatch 4 and
  `parallel_proposals` = 4 x concurrency / 4 (rollouts are instant, so the proposer's round
  trip through the gateway is the wait to overlap), the scripted proposer behind the gateway.

Every arm runs on uvloop's event loop, as a harness run does (`harness.run.run_sync`).
Each arm's CPU per rollout is read by process (this one: the harness run or the bare loop;
the container, the gateway, the scripted model) from /proc around it; a harness arm's is its
whole run's (preflight and evidence included) over its optimization rollouts. On a machine of a few
cores every process shares them, so the ratio is bounded by what the other processes spend:
`ceiling` is the ratio an arm would reach if the run process spent per rollout only what the
bare aiohttp loop's client does (the cores divided by the CPU per rollout of all processes,
against the bare loop's rate): how much of a gap is the harness's own, and how much is the
other processes' (a GEPA run's proposer calls through the gateway and the model server).

A harness rate counts optimization rollouts over the window from the first rollout's start
to the last one's end (from the rollouts table); the whole `execute_run` wall (preflight,
heldout, evidence write) is reported beside it.

    python -m benchmarks.perf.overhead [--concurrency 16,64] [--rollouts 1000] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import polars as pl
import uvloop

from benchmarks.perf.common import default_data_dir, median, process_cpu_s, process_tree, service_role, write_results
from harness.client import ContainerClient
from harness.context import OPTIMIZATION_STAGES
from harness.contract import PolicyBlock, RolloutRequest
from harness.gateway.models import GatewaySettings, LimitSettings
from harness.run import run_sync
from harness.services import Endpoints, Services
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, Pools, RunSpec

NAME = "overhead"
# the default gateway, with room for every call in flight (its default cap is 64 per upstream)
GATEWAY = GatewaySettings(limits=LimitSettings(max_concurrency=256))


def container_spec(data_dir: str) -> ContainerSpec:
    return ContainerSpec(name="instant", command=["python", "-m", "benchmarks.containers.instant"],
                         data_dir=data_dir, target_modules=["stage2_system"])


def scripted(max_tokens: int) -> ModelSpec:
    return ModelSpec(provider="scripted", model="scripted-rules", source="rules", max_tokens=max_tokens)


def run_spec(arm: str, data_dir: str, root: Path, rollouts: int, concurrency: int, seed: int,
             proposals_per_slot: float = 1.0) -> RunSpec:
    if arm == "harness_eval":
        algorithm = AlgorithmSpec(name="seed_only", params={})
        pools = Pools(train=("train:0",), pareto=tuple(f"train:{i}" for i in range(1, rollouts + 1)),
                      heldout=("test:0",))
    else:
        parallel = max(1, round(proposals_per_slot * concurrency / 4))
        algorithm = AlgorithmSpec(name="gepa", params={"minibatch_size": 4, "parallel_proposals": parallel})
        pools = Pools(train=tuple(f"train:{i}" for i in range(400)),
                      pareto=tuple(f"train:{i}" for i in range(400, 416)), heldout=("test:0",))
    return RunSpec(container=container_spec(data_dir), policy=scripted(24), proposer=scripted(4000),
                   algorithm=algorithm, pools=pools, budget=BudgetSpec(max_rollouts=rollouts), seed=seed,
                   concurrency=concurrency, evidence_root=str(root), sweep="overhead")


async def prepared_bodies(container_url: str, policy_url: str, n: int) -> list[dict[str, Any]]:
    """/rollout bodies for the seed candidate on train:1..n (the harness_eval rows)."""
    client = ContainerClient(container_url)
    try:
        program = await client.program()
        tasks = await client.tasks("train", [f"train:{i}" for i in range(1, n + 1)])
    finally:
        await client.aclose()
    policy = PolicyBlock(provider="scripted", model="scripted-rules", base_url=policy_url, max_tokens=24)
    return [RolloutRequest(rollout_id=f"raw-{t.task_id}", task_id=t.task_id, candidate=dict(program.seed_candidate),
                           task=t.model_dump(), policy=policy).model_dump(mode="json") for t in tasks]


async def raw_loop(container_url: str, bodies: list[dict[str, Any]], concurrency: int, salt: str) -> float:
    """Rollouts per second a bare async loop gets: bodies encoded before the clock starts,
    `concurrency` workers with a warm connection each, answers checked without parsing.
    One client per worker: a shared httpx pool costs more per request the more requests
    wait in it (at 64 in flight it, not the container, would set the rate)."""
    encoded = [json.dumps(dict(body, rollout_id=f"{salt}-{i}")).encode() for i, body in enumerate(bodies)]
    queue = list(reversed(encoded))
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [httpx.AsyncClient(base_url=container_url, timeout=60.0, limits=limits) for _ in range(concurrency)]

    async def post(http: httpx.AsyncClient, body: bytes) -> None:
        response = await http.post("/rollout", content=body, headers=headers)
        if response.status_code != 200 or b'"status":"ok"' not in response.content:
            raise RuntimeError(f"raw rollout failed: {response.text[:200]}")

    async def worker(http: httpx.AsyncClient) -> None:
        while queue:
            await post(http, queue.pop())

    try:
        await asyncio.gather(*(post(http, encoded[0]) for http in clients))  # open the connections
        started = time.perf_counter()
        await asyncio.gather(*(worker(http) for http in clients))
        return len(bodies) / (time.perf_counter() - started)
    finally:
        await asyncio.gather(*(http.aclose() for http in clients))


async def raw_aiohttp_loop(container_url: str, bodies: list[dict[str, Any]], concurrency: int, salt: str) -> float:
    """The same bare loop with aiohttp's client (one session, its flat pool): the client the
    harness's contract client uses. Its rate is the container's ceiling with the lighter
    client; the harness's ratio to it is the harness's own cost alone."""
    encoded = [json.dumps(dict(body, rollout_id=f"{salt}-{i}")).encode() for i, body in enumerate(bodies)]
    queue = list(reversed(encoded))
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def post(body: bytes) -> None:
            async with http.post(f"{container_url}/rollout", data=body, headers=headers) as response:
                content = await response.read()
            if response.status != 200 or b'"status":"ok"' not in content:
                raise RuntimeError(f"raw rollout failed: {content[:200]!r}")

        async def worker() -> None:
            while queue:
                await post(queue.pop())

        await asyncio.gather(*(post(encoded[0]) for _ in range(concurrency)))  # open the connections
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(bodies) / (time.perf_counter() - started)


def service_pids() -> dict[str, list[int]]:
    """This process's descendants (the Services' processes) by role, from their command lines."""
    roles: dict[str, list[int]] = {}
    for pid in process_tree(os.getpid()) - {os.getpid()}:
        try:
            role = service_role(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            continue
        if role is not None:
            roles.setdefault(role, []).append(pid)
    return roles


class CpuMeter:
    """CPU seconds spent by this process and by each role's processes while it is open."""

    def __init__(self, pids: dict[str, list[int]]):
        self._pids = pids

    def _now(self) -> dict[str, float]:
        return {"self": time.process_time(),
                **{role: sum(process_cpu_s(pid) or 0.0 for pid in pids) for role, pids in self._pids.items()}}

    def __enter__(self) -> "CpuMeter":
        self._start, self.spent = self._now(), {}
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._now()
        self.spent = {role: end[role] - self._start[role] for role in end}


def harness_rate(spec: RunSpec, endpoints: Endpoints) -> dict[str, float]:
    started = time.perf_counter()
    outcome = run_sync(spec, endpoints)
    wall = time.perf_counter() - started
    if outcome.status != "done":
        raise RuntimeError(f"{spec.algorithm.name} run failed: {outcome.error}")
    rows = pl.read_parquet(Path(outcome.evidence_dir) / "rollouts.parquet")
    optimizing = rows.filter(pl.col("stage").is_in(list(OPTIMIZATION_STAGES)))
    if optimizing.filter(pl.col("status") != "ok").height:
        raise RuntimeError(f"{spec.algorithm.name}: failed rollouts in a benchmark run")
    window = optimizing["elapsed_s"].max() - (optimizing["elapsed_s"] - optimizing["latency_s"]).min()
    return {"rate": optimizing.height / window, "wall_rate": optimizing.height / wall, "rollouts": optimizing.height}


def measure(concurrency: int, rollouts: int, rounds: int, data_dir: str,
            proposals_per_slot: float = 1.0) -> list[dict[str, Any]]:
    rates: dict[str, list[float]] = {"raw": [], "raw_aiohttp": [], "harness_eval": [], "harness_gepa": []}
    wall_rates: dict[str, list[float]] = {"harness_eval": [], "harness_gepa": []}
    cpu: dict[str, list[dict[str, float]]] = {arm: [] for arm in rates}  # CPU ms per rollout by role, per round
    with tempfile.TemporaryDirectory(prefix="overhead-bench-") as tmp, Services(Path(tmp) / "logs", gateway=GATEWAY) as services:
        probe = run_spec("harness_eval", data_dir, Path(tmp), rollouts, concurrency, 0)
        endpoints = services.endpoints(probe.container, probe.policy, probe.proposer)
        bodies = uvloop.run(prepared_bodies(endpoints.container_url, endpoints.policy_url, rollouts))
        uvloop.run(raw_loop(endpoints.container_url, bodies[:200], concurrency, "warmup"))
        pids = service_pids()

        def timed(arm: str, go: Any) -> float:
            with CpuMeter(pids) as meter:
                got = go()
            rate, n = (got["rate"], got["rollouts"]) if isinstance(got, dict) else (got, len(bodies))
            cpu[arm].append({role: 1000 * s / n for role, s in meter.spent.items()})
            if isinstance(got, dict):
                wall_rates[arm].append(got["wall_rate"])
            rates[arm].append(rate)
            return rate

        for r in range(rounds):
            timed("raw", lambda: uvloop.run(raw_loop(endpoints.container_url, bodies, concurrency, f"r{r}")))
            timed("raw_aiohttp", lambda: uvloop.run(raw_aiohttp_loop(endpoints.container_url, bodies, concurrency,
                                                                      f"a{r}")))
            for arm in ("harness_eval", "harness_gepa"):
                spec = run_spec(arm, data_dir, Path(tmp) / f"r{r}", rollouts, concurrency, r, proposals_per_slot)
                timed(arm, lambda: harness_rate(spec, endpoints))
            print(f"concurrency {concurrency} round {r}: "
                  + ", ".join(f"{arm} {v[-1]:.0f}/s" for arm, v in rates.items()), flush=True)
    raw, raw_aiohttp = median(rates["raw"]), median(rates["raw_aiohttp"])
    cores = len(os.sched_getaffinity(0))
    per_role = {arm: {role: median([c[role] for c in cpu[arm]]) for role in cpu[arm][0]} for arm in rates}
    client_ms = per_role["raw_aiohttp"]["self"]
    rows = []
    for arm, values in rates.items():
        others = [ms for role, ms in per_role[arm].items() if role != "self" and ms > 0]
        # the rate were the run process as light as the bare loop: every process shares the
        # cores, and none runs faster than its own CPU per rollout allows
        ceiling = min(1000 * cores / (client_ms + sum(others)), 1000 / max([client_ms, *others]))
        rows.append({"arm": arm, "concurrency": concurrency, "rollouts_per_round": rollouts, "rounds": rounds,
                     "rollouts_per_s": median(values), "wall_rollouts_per_s": median(wall_rates.get(arm, values)),
                     "ratio_vs_raw": median(values) / raw, "ratio_vs_raw_aiohttp": median(values) / raw_aiohttp,
                     "goal_ratio": 0.9, "cores": cores,
                     **{f"cpu_ms_per_rollout_{'this_process' if role == 'self' else role}": ms
                        for role, ms in per_role[arm].items()},
                     "ceiling_vs_raw_aiohttp": ceiling / raw_aiohttp})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="16,64", help="comma-separated rollouts in flight, e.g. 4,16,64")
    parser.add_argument("--rollouts", type=int, default=1000, help="rollouts per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default=None, help="datasets (default: $HARNESS_DATA_DIR or ../shared/datasets)")
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--proposals-per-slot", type=float, default=4.0,
                        help="GEPA's parallel_proposals = this x concurrency / minibatch (rollouts are instant "
                             "here: the proposer's round trip is the wait to overlap)")
    parser.add_argument("--quick", action="store_true", help="200 rollouts, 1 round: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.rollouts, args.rounds, args.concurrency = 200, 1, "16"
    data_dir = default_data_dir(args.data_dir)
    rows = [row for c in args.concurrency.split(",") for row in measure(int(c), args.rollouts, args.rounds, data_dir,
                                                                  args.proposals_per_slot)]
    where = write_results(NAME, rows, args.results_dir)
    print(f"\nrollouts/s against an instant-policy container ({args.rollouts} per arm, median of {args.rounds}):")
    for row in rows:
        shares = ", ".join(f"{k.removeprefix('cpu_ms_per_rollout_')} {v:.3f}" for k, v in row.items()
                           if k.startswith("cpu_ms_per_rollout_"))
        print(f"  c={row['concurrency']:<3} {row['arm']:<13} {row['rollouts_per_s']:8.1f}/s  "
              f"({row['ratio_vs_raw']:.2f} of raw, {row['ratio_vs_raw_aiohttp']:.2f} of raw_aiohttp; "
              f"whole-run wall {row['wall_rollouts_per_s']:.1f}/s); CPU ms per rollout: {shares}; "
              f"ceiling {row['ceiling_vs_raw_aiohttp']:.2f}")
    print(f"  written to {where}")


if __name__ == "__main__":
    main()
