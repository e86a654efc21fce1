"""Local model benchmark (not a test): embedded llama-server rows/s by slots, and its prefix cache.

Banking77 rows per second of the embedded llama.cpp server at 1, 2 and 4 parallel slots on
this machine, and what its prefix cache of the shared prompt (system + label list) saves.

The server is `harness.local_model.LocalModelServer`, started exactly as a run starts it
(`-np S`, `-c S x 4096`, threads = the CPUs this process may use, `--cache-prompt`), one
server per configuration, stopped before the next. Each row is the request a Banking77
rollout sends to the policy: the container's own rendering of the seed candidate
(`Banking77.render`: system prompt, then the 77 labels, then the customer message, so
every row shares a ~430-token prefix), temperature 0 and max_tokens 24 as in
`configs/policy/local_1_5b.yaml`, posted straight to llama-server's chat endpoint (the body
ChatClient sends, plus `cache_prompt` where an arm sets it; raw httpx because ChatClient
does not expose llama-server's `timings`: prompt_n, cache_n, prompt_ms, predicted_n, ...).

1. slots: for S in --slots, warm every slot (S requests in flight on rows outside the
   measured ones, so each slot holds the shared prefix, as in a long run), then send the
   R rows with S in flight; rows/s is R over the wall time. ratio_vs_1_slot = rows/s / rows/s at S=1.
2. prefix_cache: one slot, the same R rows with `cache_prompt: true` (the server default)
   and `false`, interleaved row by row (cached first, so the uncached request can not hand
   the cached one its own prompt) so drift on a busy machine hits both arms alike; rows/s
   is R over the summed latencies of the arm. prompt_tokens_evaluated_per_row comes from
   timings.prompt_n: with the cache only the suffix after the shared prefix is evaluated.

Figures are printed and written to benchmarks/perf/results/local_model.parquet (one row per
configuration, with the machine columns of benchmarks.perf.common). A 2-core machine that
is doing anything else gives noisy absolute figures: read them with load_1m_when_written.

    python -m benchmarks.perf.local_model [--model qwen2.5-coder-1.5b] [--rows 24] [--slots 1,2,4]
        [--quick] [--data-dir DIR] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.containers.banking77 import Banking77  # noqa: E402
from benchmarks.containers.kit import policy_result  # noqa: E402
from benchmarks.perf.common import write_results  # noqa: E402
from harness.llm import ChatMessage  # noqa: E402
from harness.local_model import LocalModelServer, LocalServerSettings  # noqa: E402

NAME = "local_model"
MAX_TOKENS = 24  # configs/policy/local_1_5b.yaml
TEMPERATURE = 0.0
REQUEST_TIMEOUT_S = 600.0
QUICK = {"model": "qwen2.5-coder-0.5b", "rows": 4, "slots": [1, 2]}


def default_data_dir() -> Path:
    """$HARNESS_DATA_DIR, else the workspace's `shared/datasets` next to the repository."""
    configured = os.environ.get("HARNESS_DATA_DIR")
    return Path(configured) if configured else REPO.parent / "shared" / "datasets"


@dataclass(frozen=True)
class Row:
    index: int  # train:<index>, also the request seed
    row: dict[str, Any]
    messages: list[ChatMessage]


@dataclass(frozen=True)
class Call:
    """One answered request: client latency and what llama-server reported for it."""

    latency_s: float
    prompt_tokens: int  # the whole prompt (usage)
    completion_tokens: int
    prompt_n: float  # prompt tokens evaluated (timings); NaN if the server gave no timings
    cache_n: float  # prompt tokens taken from the slot's cache
    prompt_ms: float
    predicted_ms: float
    reward: float


def banking77_rows(container: Banking77, start: int, count: int) -> list[Row]:
    """Train rows start..start+count-1 rendered for the seed candidate, as a rollout renders them."""
    candidate = dict(container.program().seed_candidate)
    rows = container.splits()["train"]
    if start + count > len(rows):
        raise SystemExit(f"banking77 train has {len(rows)} rows; asked for {start + count}")
    return [Row(i, rows[i], container.render(candidate, rows[i])) for i in range(start, start + count)]


async def ask(http: httpx.AsyncClient, server: LocalModelServer, container: Banking77, row: Row,
              cache_prompt: bool | None) -> Call:
    body: dict[str, Any] = {"model": server.model_name, "messages": [m.model_dump() for m in row.messages],
                            "temperature": TEMPERATURE, "max_tokens": MAX_TOKENS, "seed": row.index}
    if cache_prompt is not None:  # None: what a rollout sends (no field; the server default, on)
        body["cache_prompt"] = cache_prompt
    started = time.perf_counter()
    response = await http.post(f"{server.base_url}/chat/completions", json=body)
    latency = time.perf_counter() - started
    response.raise_for_status()
    payload = response.json()
    usage = payload.get("usage") or {}
    timings = payload.get("timings") or {}
    text = payload["choices"][0]["message"].get("content") or ""

    def timing(key: str) -> float:
        value = timings.get(key)
        return float(value) if value is not None else math.nan

    return Call(latency_s=latency, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0), prompt_n=timing("prompt_n"),
                cache_n=timing("cache_n"), prompt_ms=timing("prompt_ms"), predicted_ms=timing("predicted_ms"),
                reward=container.score(row.row, policy_result(text))[0])


async def bounded(server: LocalModelServer, container: Banking77, rows: list[Row], in_flight: int,
                  cache_prompt: bool | None = None) -> tuple[float, list[Call]]:
    """(wall seconds, calls) for `rows` with at most `in_flight` requests outstanding."""
    queue = list(reversed(rows))
    calls: list[Call] = []
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        async def worker() -> None:
            while queue:
                calls.append(await ask(http, server, container, queue.pop(), cache_prompt))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return time.perf_counter() - started, calls


async def interleaved(server: LocalModelServer, container: Banking77,
                      rows: list[Row]) -> dict[bool, list[Call]]:
    """Each row with the prompt cache, then without, one request at a time."""
    calls: dict[bool, list[Call]] = {True: [], False: []}
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
        for row in rows:
            for cache_prompt in (True, False):
                calls[cache_prompt].append(await ask(http, server, container, row, cache_prompt))
    return calls


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def summarize(calls: list[Call], seconds: float) -> dict[str, Any]:
    """Throughput over `seconds` plus per-row means of what the server reported."""
    evaluated = sum(c.prompt_n for c in calls)
    return {
        "rows": len(calls),
        "seconds": seconds,
        "rows_per_s": len(calls) / seconds,
        "p50_latency_s": statistics.median(c.latency_s for c in calls),
        "mean_latency_s": _mean([c.latency_s for c in calls]),
        "prompt_tokens_per_row": _mean([c.prompt_tokens for c in calls]),
        "prompt_tokens_evaluated_per_row": _mean([c.prompt_n for c in calls]),
        "prompt_tokens_cached_per_row": _mean([c.cache_n for c in calls]),
        "completion_tokens_per_row": _mean([c.completion_tokens for c in calls]),
        "prompt_eval_tokens_per_s": evaluated / seconds,
        "completion_tokens_per_s": sum(c.completion_tokens for c in calls) / seconds,
        "server_prompt_ms_per_row": _mean([c.prompt_ms for c in calls]),
        "server_predicted_ms_per_row": _mean([c.predicted_ms for c in calls]),
        "accuracy": _mean([c.reward for c in calls]),
    }


def threads_of(server: LocalModelServer) -> int:
    """The --threads the harness gives llama-server (its own default when settings leave it unset)."""
    cmd = server.command(Path("model.gguf"), Path("llama-server"))
    return int(cmd[cmd.index("--threads") + 1])


def measure_slots(model: str, slots: int, container: Banking77, rows: list[Row], warm: list[Row]) -> dict[str, Any]:
    settings = LocalServerSettings(model=model, slots=slots)
    with LocalModelServer(settings) as server:
        asyncio.run(bounded(server, container, warm[:slots], slots))  # every slot holds the shared prefix
        seconds, calls = asyncio.run(bounded(server, container, rows, slots))
    return {"benchmark_part": "slots", "model": model, "slots": slots, "ctx_per_slot": settings.ctx_per_slot,
            "threads": threads_of(server),
            "in_flight": slots, "cache_prompt": True, **summarize(calls, seconds)}


def measure_prefix_cache(model: str, container: Banking77, rows: list[Row], warm: list[Row]) -> list[dict[str, Any]]:
    settings = LocalServerSettings(model=model, slots=1)
    with LocalModelServer(settings) as server:
        asyncio.run(bounded(server, container, warm[:1], 1))
        calls = asyncio.run(interleaved(server, container, rows))
    out = []
    for cache_prompt in (True, False):
        seconds = sum(c.latency_s for c in calls[cache_prompt])
        out.append({"benchmark_part": "prefix_cache", "model": model, "slots": 1,
                    "ctx_per_slot": settings.ctx_per_slot, "threads": threads_of(server), "in_flight": 1,
                    "cache_prompt": cache_prompt,
                    **summarize(calls[cache_prompt], seconds)})
    cached, uncached = out
    cached["ratio_vs_no_cache"] = cached["rows_per_s"] / uncached["rows_per_s"]
    uncached["ratio_vs_no_cache"] = 1.0
    cached["seconds_per_row_saved"] = uncached["mean_latency_s"] - cached["mean_latency_s"]
    uncached["seconds_per_row_saved"] = 0.0
    saved = 1 - cached["prompt_tokens_evaluated_per_row"] / uncached["prompt_tokens_evaluated_per_row"]
    cached["prompt_tokens_saved_fraction"] = saved
    uncached["prompt_tokens_saved_fraction"] = 0.0
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.perf.local_model", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="built-in name, .gguf path or hf:...")
    parser.add_argument("--rows", type=int, default=24, help="measured rows per configuration")
    parser.add_argument("--slots", default="1,2,4", help="comma-separated parallel slot counts")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {QUICK['model']}, {QUICK['rows']} rows, slots "
                             f"{','.join(map(str, QUICK['slots']))}, both cache arms")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(),
                        help="folder holding banking77/ (default $HARNESS_DATA_DIR, else ../shared/datasets)")
    parser.add_argument("--results-dir", type=Path, help="default benchmarks/perf/results")
    args = parser.parse_args(argv)
    model, n_rows = args.model, args.rows
    slot_values = sorted({int(s) for s in args.slots.split(",") if s.strip()})
    if args.quick:
        model, n_rows, slot_values = QUICK["model"], QUICK["rows"], QUICK["slots"]
    if n_rows < 1 or not slot_values or min(slot_values) < 1:
        parser.error("--rows and every --slots value must be >= 1")

    container = Banking77(str(args.data_dir))
    rows = banking77_rows(container, 0, n_rows)
    warm = banking77_rows(container, n_rows, max(slot_values))  # never measured: no exact-prompt hit

    results: list[dict[str, Any]] = []
    for slots in slot_values:
        print(f"slots={slots}: {n_rows} rows of {model} ...", flush=True)
        results.append(measure_slots(model, slots, container, rows, warm))
        print(f"  {results[-1]['rows_per_s']:.3f} rows/s", flush=True)
    base = next((r["rows_per_s"] for r in results if r["slots"] == 1), math.nan)
    for r in results:
        r["ratio_vs_1_slot"] = r["rows_per_s"] / base
    print(f"prefix cache: {n_rows} rows of {model} with and without cache_prompt, 1 slot ...", flush=True)
    results += measure_prefix_cache(model, container, rows, warm)
    columns = list(dict.fromkeys(k for r in results for k in r))  # pyarrow takes the first row's keys
    results = [{k: r.get(k) for k in columns} for r in results]
    where = write_results(NAME, results, args.results_dir)

    print(f"\nBanking77 rows on {model} (max_tokens {MAX_TOKENS}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f} now):")
    print(f"  {'part':<13}{'slots':>6}{'cache':>7}{'rows':>6}{'rows/s':>9}{'ratio':>7}{'p50 s':>8}"
          f"{'prompt eval/row':>17}{'compl tok/s':>13}")
    for r in results:
        ratio = r["ratio_vs_1_slot"] if r["benchmark_part"] == "slots" else r["ratio_vs_no_cache"]
        print(f"  {r['benchmark_part']:<13}{r['slots']:>6}{'on' if r['cache_prompt'] else 'off':>7}{r['rows']:>6}"
              f"{r['rows_per_s']:>9.3f}{ratio:>7.2f}{r['p50_latency_s']:>8.2f}"
              f"{r['prompt_tokens_evaluated_per_row']:>17.1f}{r['completion_tokens_per_s']:>13.2f}")
    cached = next(r for r in results if r["benchmark_part"] == "prefix_cache" and r["cache_prompt"])
    print(f"  prefix cache saves {cached['seconds_per_row_saved']:.2f} s per row and "
          f"{cached['prompt_tokens_saved_fraction']:.0%} of the prompt tokens "
          f"({cached['prompt_tokens_per_row']:.0f} per row) from evaluation")
    print(f"  written to {where}")
    return results


if __name__ == "__main__":
    main()
