"""Overlap benchmark (not a test): wall time of a fixed-budget optimization run when every
model call takes `--latency` seconds, at several rollout concurrencies, for our GEPA and for
the `gepa` library through its adapter, in one invocation.

Policy and proposer are the scripted model with injected latency (`rules?latency_s=0.2`)
behind the default gateway; the container is Banking77 (real rows and scoring; its policy
call is the 200 ms one). The limit a run can reach is rollouts x latency / concurrency (the
rollouts it spent, at most the budget, perfectly packed); each arm's optimization wall time (run start to its
last optimization rollout) is reported against it. Where the limit is under 10 s (concurrency 16
and 64 at the default budget) one run's figure moves by a tenth with the machine's other work
(a collection of the process's garbage alone is 50 ms), so each arm runs `--rounds` times there
and the median run counts; the minute-long runs at 1 and 4 in flight run once. Arms:

- `gepa`: ours with `parallel_proposals` = concurrency / minibatch, so the slots stay full,
  and a turn's proposer requests drawn together (`sample_together`: every attempt's request
  with its samples in one round trip; `--no-sample-together` measures without);
- `gepa_sequential`: ours with one iteration at a time (the loop before parallel proposals);
- `gepa_ai`: the reference library, which runs one iteration at a time by design.

    python -m benchmarks.perf.overlap [--concurrency 1,4,16,64] [--budget 320] [--latency 0.2] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks.perf.common import default_data_dir, optimization_window, write_results
from harness.context import OPTIMIZATION_STAGES
from harness.gateway.models import GatewaySettings, LimitSettings
from harness.run import run_sync
from harness.services import Services
from harness.specs import AlgorithmSpec, BudgetSpec, ContainerSpec, ModelSpec, Pools, RunSpec

NAME = "overlap"
MINIBATCH = 4
GATEWAY = GatewaySettings(limits=LimitSettings(max_concurrency=512))
ARMS = ("gepa", "gepa_sequential", "gepa_ai")
REPEAT_UNDER_S = 10.0  # runs whose limit is shorter are repeated (--rounds), the median kept


def run_spec(arm: str, concurrency: int, budget: int, latency: float, data_dir: str, root: Path,
             proposals_per_slot: float = 1.0, sample_together: bool = True) -> RunSpec:
    source = f"rules?latency_s={latency:g}"
    if arm == "gepa_ai":
        algorithm = AlgorithmSpec(name="gepa_ai", params={"minibatch_size": MINIBATCH})
    else:
        parallel = 1 if arm == "gepa_sequential" else max(1, round(proposals_per_slot * concurrency / MINIBATCH))
        params = {"minibatch_size": MINIBATCH, "parallel_proposals": parallel}
        if arm == "gepa":
            params["sample_together"] = sample_together
        algorithm = AlgorithmSpec(name="gepa", params=params)
    return RunSpec(
        container=ContainerSpec(name="banking77", command=["python", "-m", "benchmarks.containers.banking77"],
                                data_dir=data_dir, target_modules=["stage2_system"]),
        policy=ModelSpec(provider="scripted", model="scripted-latency", source=source, max_tokens=24),
        proposer=ModelSpec(provider="scripted", model="scripted-latency", source=source, max_tokens=4000),
        algorithm=algorithm,
        pools=Pools(train=tuple(f"train:{i}" for i in range(200)),
                    pareto=tuple(f"train:{i}" for i in range(200, 216)), heldout=("test:0",)),
        budget=BudgetSpec(max_rollouts=budget), concurrency=concurrency, evidence_root=str(root), sweep="overlap",
    )


def one_run(services: Services, spec: RunSpec) -> dict[str, Any]:
    endpoints = services.endpoints(spec.container, spec.policy, spec.proposer)
    started = time.perf_counter()
    outcome = run_sync(spec, endpoints)
    wall = time.perf_counter() - started
    if outcome.status != "done":
        raise RuntimeError(f"{spec.algorithm.name} at concurrency {spec.concurrency} failed: {outcome.error}")
    run_dir = Path(outcome.evidence_dir)
    table = pl.read_parquet(run_dir / "rollouts.parquet")
    rollouts, optimization_s = optimization_window(table)
    proposals = pl.read_parquet(run_dir / "proposals.parquet").height
    # A rollout slower than the model's latency, and slots busy while the run is still slow, say
    # the CPU, not the schedule, is the limit: then a larger --latency measures the schedule.
    spans = table.filter(pl.col("stage").is_in(list(OPTIMIZATION_STAGES)))["latency_s"]
    busy = float(spans.sum()) / (spec.concurrency * optimization_s) if optimization_s else 0.0
    return {"rollouts": rollouts, "optimization_s": optimization_s, "run_wall_s": wall, "proposals": proposals,
            "mean_rollout_s": float(spans.mean() or 0.0), "slot_occupancy": busy}


def to_limit(run: dict[str, Any], concurrency: int, latency_s: float) -> float:
    """A run's time over its limit: the rollouts it spent, perfectly packed into the slots."""
    return run["optimization_s"] * concurrency / (run["rollouts"] * latency_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64", help="comma-separated rollouts in flight")
    parser.add_argument("--budget", type=int, default=320, help="optimization rollouts per run")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds every model call takes")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--proposals-per-slot", type=float, default=1.0,
                        help="our parallel_proposals = this x concurrency / minibatch")
    parser.add_argument("--sample-together", action=argparse.BooleanOptionalAction, default=True,
                        help="the gepa arm sends a turn's proposer requests and samples at once")
    parser.add_argument("--rounds", type=int, default=3,
                        help=f"runs per arm where the limit is under {REPEAT_UNDER_S:g} s; the median counts")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="budget 48 at concurrency 1 and 16: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.budget, args.concurrency = 48, "1,16"
    data_dir = default_data_dir(args.data_dir)
    arms = [a for a in args.arms.split(",") if a]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="overlap-bench-") as tmp, \
            Services(Path(tmp) / "logs", gateway=GATEWAY) as services:
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            rounds = args.rounds if args.budget * args.latency / concurrency < REPEAT_UNDER_S else 1
            for arm in arms:
                runs = [one_run(services, run_spec(arm, concurrency, args.budget, args.latency, data_dir,
                                                   Path(tmp) / f"{arm}-{concurrency}-{r}", args.proposals_per_slot,
                                                   args.sample_together))
                        for r in range(rounds)]
                ratios = sorted(to_limit(run, concurrency, args.latency) for run in runs)
                got = sorted(runs, key=lambda run: to_limit(run, concurrency, args.latency))[len(runs) // 2]
                limit = got["rollouts"] * args.latency / concurrency
                row = {"arm": arm, "concurrency": concurrency, "budget": args.budget, "latency_s": args.latency,
                       "sample_together": arm == "gepa" and args.sample_together, "rounds": rounds,
                       "ratio_min": ratios[0], "ratio_max": ratios[-1],
                       "limit_s": limit, **got, "ratio_to_limit": to_limit(got, concurrency, args.latency)}
                rows.append(row)
                spread = f", {ratios[0]:.2f}x-{ratios[-1]:.2f}x over {rounds} runs" if rounds > 1 else ""
                print(f"c={concurrency:<3} {arm:<16} {got['optimization_s']:7.1f}s for {got['rollouts']} rollouts "
                      f"({row['ratio_to_limit']:.2f}x the {limit:.1f}s limit{spread}; a rollout took "
                      f"{got['mean_rollout_s']:.2f}s, slots {got['slot_occupancy']:.0%} busy)", flush=True)
    by_key = {(r["arm"], r["concurrency"]): r for r in rows}
    for row in rows:
        library = by_key.get(("gepa_ai", row["concurrency"]))
        row["ratio_to_library"] = row["optimization_s"] / library["optimization_s"] if library else None
    where = write_results(NAME, rows, args.results_dir)
    print(f"\noptimization wall time, budget {args.budget}, every model call {args.latency:g}s (limit = rollouts x latency"
          " / concurrency):")
    for row in rows:
        vs_library = f", {row['ratio_to_library']:.2f}x the library" if row["ratio_to_library"] else ""
        print(f"  c={row['concurrency']:<3} {row['arm']:<16} {row['optimization_s']:7.1f}s  "
              f"{row['ratio_to_limit']:.2f}x limit{vs_library}")
    print(f"  written to {where}")


if __name__ == "__main__":
    main()
