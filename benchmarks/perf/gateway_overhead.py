"""Gateway overhead benchmark (not a test): completions per second at a fixed number of
concurrent requests, straight to a fake OpenAI-compatible upstream vs through the
inference gateway to the same upstream, in one invocation; a third arm goes through a bare
proxy on the gateway's own stack (`bare_proxy.py`: uvicorn, raw ASGI, aiohttp, no logic),
the floor of any gateway built on it, so the gap to direct splits into the hop's cost and
the gateway's own.

The upstream is the scripted model (`harness.scripted_server`, a child process); the
gateway runs as Services runs it (a child process); the load comes from this process
through the harness's own ChatClient (what a container uses for its policy call), one
call per "rollout", each with its own attributed URL and a distinct prompt. Arms are
interleaved over rounds and the median is reported, so drift on a shared machine hits
both alike. Beside each rate, the CPU milliseconds per call of each process (this load
generator, the gateway, the upstream), read from /proc around the arm: on a small machine
all three share the cores, so the rate ratio says as much about the load generator's
weight as about the gateway's; the gateway's CPU per call is its own cost, and 1000 over it
the calls per second one gateway process can carry on one core. Results are printed and
written to benchmarks/perf/results/gateway_overhead.parquet.

    python -m benchmarks.perf.gateway_overhead [--concurrency 64] [--requests 1500] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.perf.bare_proxy import BareProxy  # noqa: E402
from benchmarks.perf.common import process_cpu_s, write_results  # noqa: E402
from harness.gateway.models import Announcement, GatewaySettings, LimitSettings, RunRegistration  # noqa: E402
from harness.gateway.server import GatewayServer  # noqa: E402
from harness.gateway.service import upstream_for  # noqa: E402
from harness.http_pool import SharedSession  # noqa: E402
from harness.llm import ChatClient, ChatMessage  # noqa: E402
from harness.scripted_server import ScriptedModelServer  # noqa: E402
from harness.specs import ModelSpec  # noqa: E402

SYSTEM = ("You are a banking customer-support intent classifier. Reply with the single intent label.\n"
          '- If the message mentions "card", answer: card_arrival')
LABELS = "Intent labels:\n" + "\n".join(f"label_{i}" for i in range(40))


def messages(i: int, salt: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content=SYSTEM),
            ChatMessage(role="user", content=f"{LABELS}\n\nCustomer message:\nrequest {salt}-{i} about my card")]


async def drive(urls: list[str], concurrency: int, salt: str) -> tuple[float, list[float]]:
    """(completions per second, per-call latencies) for one call to each URL, `concurrency` at a time,
    through the harness's own ChatClient on one shared session (what a container does)."""
    queue = list(enumerate(urls))
    latencies: list[float] = []
    session = SharedSession(timeout_s=120.0)
    base = ChatClient(urls[0], "scripted-rules", client=session)

    async def worker() -> None:
        while queue:
            i, url = queue.pop()
            started = time.perf_counter()
            await base.with_base_url(url).complete(messages(i, salt), max_tokens=8, seed=i)
            latencies.append(time.perf_counter() - started)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        await session.aclose()
    return len(urls) / elapsed, latencies


def cpu_ms_per_call(pids: dict[str, int | None], n: int, drive_arm: Callable[[], tuple[float, list[float]]]
                    ) -> tuple[float, list[float], dict[str, float]]:
    """drive_arm's (rate, latencies) and the CPU milliseconds per call each process spent on it."""
    before = {name: process_cpu_s(pid) if pid else None for name, pid in pids.items()}
    rate, latencies = drive_arm()
    per_call: dict[str, float] = {}
    for name, pid in pids.items():
        start, end = before[name], process_cpu_s(pid) if pid else None
        if start is not None and end is not None:  # a process gone meanwhile has no figure, not a zero
            per_call[name] = 1000 * (end - start) / n
    return rate, latencies, per_call


def register_run(gateway: GatewayServer, run_id: str, upstream: str, scopes: list[str]) -> list[str]:
    """Register and announce, as a run's driver does; the rollouts' capability URLs."""
    registration = RunRegistration(upstreams={"policy": upstream, "proposer": upstream})
    headers = gateway.admin_headers
    httpx.post(f"{gateway.url}/runs/{run_id}", content=registration.model_dump_json(),
               headers=headers).raise_for_status()
    announcement = Announcement(scopes={s: "c0000" for s in scopes}, candidates={"c0000": {"system": SYSTEM}})
    answer = httpx.post(f"{gateway.url}/runs/{run_id}/scopes", content=announcement.model_dump_json(), headers=headers)
    answer.raise_for_status()
    tokens = answer.json()["tokens"]
    return [f"{gateway.url}/c/{tokens[s]}/r/{run_id}/{s}/policy/v1" for s in scopes]


def slow_upstream(latency: float, concurrency: int, rounds: int, *, quick: bool) -> dict[str, float]:
    """Direct vs the gateway to an upstream that takes `latency` per answer, as a hosted model
    does (hundreds of milliseconds): what the gateway costs a run when the processes are not
    all busy on the same cores, the case of the instant upstream above. Ten waves of
    `concurrency` calls per arm and round, arms interleaved, medians."""
    n = (2 if quick else 10) * concurrency
    rates: dict[str, list[float]] = {"direct": [], "gateway": []}
    p50: dict[str, list[float]] = {"direct": [], "gateway": []}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-slow-") as tmp, \
            ScriptedModelServer(f"rules?latency_s={latency:g}", log_dir=Path(tmp)) as server:
        spec = ModelSpec(provider="scripted", model="scripted-slow", source=f"rules?latency_s={latency:g}")
        upstream = upstream_for(spec, server.base_url)
        gateway = GatewayServer(GatewaySettings(limits=LimitSettings(max_concurrency=max(64, concurrency))),
                                log_dir=Path(tmp))
        with gateway:
            gateway.register(upstream)
            for r in range(rounds):
                scopes = [f"slow{r}-c0000-train:{i}" for i in range(n)]
                arms = {"direct": [server.base_url] * n,
                        "gateway": register_run(gateway, f"slow{r}", upstream.name, scopes)}
                for arm, urls in arms.items():
                    rate, latencies = asyncio.run(drive(urls, concurrency, salt=f"slow{r}"))
                    rates[arm].append(rate)
                    p50[arm].append(statistics.median(latencies))
    median = {arm: statistics.median(v) for arm, v in rates.items()}
    return {"slow_latency_s": latency, "slow_requests_per_arm": n,
            **{f"slow_{arm}_per_s": value for arm, value in median.items()},
            **{f"slow_{arm}_p50_ms": statistics.median(v) * 1000 for arm, v in p50.items()},
            "ratio_slow_gateway_vs_direct": median["gateway"] / median["direct"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1500, help="calls per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--latency", type=float, default=0.2,
                        help="seconds a slow upstream takes per answer, for the realistic arm (0: none)")
    parser.add_argument("--quick", action="store_true", help="200 calls, 1 round: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 200, 1
    n, c = args.requests, args.concurrency
    rates: dict[str, list[float]] = {"direct": [], "bare_proxy": [], "gateway": [], "gateway_cache_miss": [],
                                     "gateway_cache_hit": []}
    p50: dict[str, list[float]] = {k: [] for k in rates}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in rates}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp, \
            ScriptedModelServer("rules", log_dir=Path(tmp)) as upstream_server:
        spec = ModelSpec(provider="scripted", model="scripted-rules", source="rules")
        upstream = upstream_for(spec, upstream_server.base_url)
        limits = LimitSettings(max_concurrency=max(64, c))
        plain = GatewayServer(GatewaySettings(limits=limits), log_dir=Path(tmp))
        cached = GatewayServer(GatewaySettings(limits=limits, cache="read_write", cache_path=f"{tmp}/store.sqlite"),
                               log_dir=Path(tmp))
        proxy = BareProxy(upstream_server.base_url.removesuffix("/v1"), log_dir=Path(tmp))
        with plain, cached, proxy:
            for gateway in (plain, cached):
                gateway.register(upstream)
            asyncio.run(drive([upstream_server.base_url] * 200, c, "warmup"))  # connections, imports, JIT-free warmup
            servers = {"direct": {}, "bare_proxy": {"proxy": proxy.pid}, "gateway": {"gateway": plain.pid},
                       "gateway_cache_miss": {"gateway": cached.pid}, "gateway_cache_hit": {"gateway": cached.pid}}
            processes = {arm: {"load": os.getpid(), "upstream": upstream_server.pid, **servers[arm]} for arm in rates}
            for r in range(args.rounds):
                run_id = f"bench{r}"
                scopes = [f"{run_id}-c0000-train:{i}" for i in range(n)]
                arms = {
                    "direct": [upstream_server.base_url] * n,
                    "bare_proxy": [proxy.base_url] * n,
                    "gateway": register_run(plain, run_id, upstream.name, scopes),
                    "gateway_cache_miss": register_run(cached, run_id, upstream.name, scopes),
                }
                # the last arm: the same requests again, new rollouts: every one served from the store
                arms["gateway_cache_hit"] = register_run(cached, f"{run_id}b", upstream.name, scopes)
                for arm, urls in arms.items():
                    rate, lat, per_call = cpu_ms_per_call(processes[arm], n,
                                                          lambda: asyncio.run(drive(urls, c, salt=f"r{r}")))
                    rates[arm].append(rate)
                    p50[arm].append(statistics.median(lat))
                    cpu[arm].append(per_call)
                print(f"round {r}: " + ", ".join(f"{arm} {v[-1]:.0f}/s" for arm, v in rates.items()), flush=True)
    slow = slow_upstream(args.latency, c, args.rounds, quick=args.quick) if args.latency > 0 else {}
    median = {arm: statistics.median(v) for arm, v in rates.items()}
    median_p50 = {arm: statistics.median(v) for arm, v in p50.items()}
    median_cpu = {arm: {name: statistics.median(r[name] for r in v if name in r) for name in v[0]}
                  for arm, v in cpu.items()}
    row = {
        "concurrency": c, "requests_per_arm": n, "rounds": args.rounds,
        **{f"{arm}_per_s": value for arm, value in median.items()},
        **{f"{arm}_p50_ms": value * 1000 for arm, value in median_p50.items()},
        **{f"{arm}_cpu_ms_per_call_{name}": ms for arm, by in median_cpu.items() for name, ms in by.items()},
        "ratio_gateway_vs_direct": median["gateway"] / median["direct"],
        "ratio_bare_proxy_vs_direct": median["bare_proxy"] / median["direct"],
        "ratio_gateway_vs_bare_proxy": median["gateway"] / median["bare_proxy"],
        "ratio_cache_miss_vs_direct": median["gateway_cache_miss"] / median["direct"],
        "ratio_cache_hit_vs_direct": median["gateway_cache_hit"] / median["direct"],
        **slow,
    }
    where = write_results("gateway_overhead", [row], args.results_dir)
    print(f"\ncompletions/s at {c} concurrent requests ({n} per arm, median of {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs):")
    for arm in rates:
        shares = ", ".join(f"{name} {ms:.2f}" for name, ms in median_cpu[arm].items())
        print(f"  {arm:<20} {median[arm]:8.1f}/s   p50 latency {median_p50[arm] * 1000:7.1f} ms   "
              f"CPU ms per call: {shares}")
    print(f"  gateway / direct     {row['ratio_gateway_vs_direct']:.2f}  (cache off, the default)")
    print(f"  bare proxy / direct  {row['ratio_bare_proxy_vs_direct']:.2f}  (the floor of a gateway on this stack)")
    print(f"  gateway / bare proxy {row['ratio_gateway_vs_bare_proxy']:.2f}  (the gateway's own work)")
    if slow:
        print(f"  with an upstream that takes {args.latency * 1000:.0f} ms: gateway {slow['slow_gateway_per_s']:.1f}/s vs "
              f"direct {slow['slow_direct_per_s']:.1f}/s ({slow['ratio_slow_gateway_vs_direct']:.3f}); p50 latency "
              f"{slow['slow_gateway_p50_ms']:.1f} vs {slow['slow_direct_p50_ms']:.1f} ms")
    print(f"  written to {where}")


if __name__ == "__main__":
    main()
