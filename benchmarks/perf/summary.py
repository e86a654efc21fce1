"""The performance table: one markdown line per figure, read from the benchmarks' Parquet
results (whichever exist), written to `<results>/summary.md`.

    python -m benchmarks.perf.summary [--results-dir DIR]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import polars as pl

from benchmarks.perf.common import RESULTS_DIR

Line = tuple[str, str, str]  # what, figure, goal


def _overhead(df: pl.DataFrame) -> list[Line]:
    out = []
    for row in df.filter(pl.col("arm").str.starts_with("harness")).sort("concurrency", "arm").iter_rows(named=True):
        raw = df.filter((pl.col("arm") == "raw") & (pl.col("concurrency") == row["concurrency"]))["rollouts_per_s"][0]
        what = {"harness_eval": "evaluation only (seed-only)", "harness_gepa": "GEPA, parallel proposals"}[row["arm"]]
        lighter = row.get("ratio_vs_raw_aiohttp")
        beside = "" if lighter is None else f"; {lighter:.2f} of the bare loop on aiohttp"
        if row.get("ceiling_vs_raw_aiohttp") is not None:
            roles = {"this_process": "run", "container": "container", "gateway": "gateway", "model": "model"}
            split = ", ".join(f"{name} {row[f'cpu_ms_per_rollout_{role}']:.2f}" for role, name in roles.items()
                              if (row.get(f"cpu_ms_per_rollout_{role}") or 0) > 0)
            beside += (f"; CPU ms per rollout: {split}; {row['ceiling_vs_raw_aiohttp']:.2f} if the run process "
                       f"cost what the bare loop's client does, on {row['cores']} cores")
        out.append((f"overhead: harness vs bare loop, instant-policy container, {row['concurrency']} in flight, {what}",
                    f"{row['rollouts_per_s']:.0f} vs {raw:.0f} rollouts/s (**{row['ratio_vs_raw']:.2f}**{beside})",
                    ">= 0.90"))
    return out


def _overlap(df: pl.DataFrame) -> list[Line]:
    names = {"gepa": "our GEPA", "gepa_sequential": "our GEPA, one iteration at a time", "gepa_ai": "gepa library"}
    out = []
    for row in df.sort("concurrency", "arm").iter_rows(named=True):
        library = "" if row["arm"] == "gepa_ai" or row["ratio_to_library"] is None else \
            f"; {row['ratio_to_library']:.2f}x the library's time"
        goal = "<= 1.5x limit" if row["concurrency"] in (16, 64) and row["arm"] == "gepa" else ""
        rounds = row.get("rounds") or 1
        spread = f" (median of {rounds} runs, {row['ratio_min']:.2f}x-{row['ratio_max']:.2f}x)" if rounds > 1 else ""
        out.append((f"overlap: {names.get(row['arm'], row['arm'])}, {row['latency_s'] * 1000:.0f} ms per model call, "
                     f"concurrency {row['concurrency']}",
                     f"{row['optimization_s']:.1f} s for {row['rollouts']} rollouts, "
                     f"**{row['ratio_to_limit']:.2f}x** the {row['limit_s']:.1f} s limit{spread}"
                     f"{_factors(row)}{library}", goal))
    return out


def _factors(row: dict) -> str:
    """The ratio to the limit is exactly (a rollout's time / the model call's) x (1 / the slots'
    occupancy): rollouts slowed by the machine's CPU, and slots the schedule left idle."""
    if row["arm"] != "gepa" or not row.get("slot_occupancy"):
        return ""
    return (f" = {row['mean_rollout_s'] / row['latency_s']:.2f} (a rollout took {row['mean_rollout_s']:.2f} s) "
            f"x {1 / row['slot_occupancy']:.2f} (slots {row['slot_occupancy']:.0%} busy)")


def _scale(df: pl.DataFrame) -> list[Line]:
    out = []
    for row in df.sort("runs").iter_rows(named=True):
        vs_one = row.get("rollouts_per_s_vs_1_run")
        ratio = f" ({vs_one:.2f}x 1 run)" if vs_one is not None else ""
        # the harness's own cost apart from the containers' and models' on the same cores
        per_cpu = row.get("rollouts_per_harness_cpu_s")
        own = f", {per_cpu:.0f} rollouts per harness CPU-second" if per_cpu is not None else ""
        out.append((f"scale: {row['runs']} runs on Ray ({row['max_runs_in_flight']} in flight), fake endpoints",
                    f"{row['rollouts_per_s']:.0f} rollouts/s{ratio}{own}, "
                    f"driver peak RSS {row['driver_peak_rss_mib']:.0f} MiB", ""))
    return out


def _local_model(df: pl.DataFrame) -> list[Line]:
    out = []
    for row in df.iter_rows(named=True):
        if row["benchmark_part"] == "slots":
            out.append((f"local model {row['model']}: {row['slots']} slot(s), {row['slots']} in flight",
                        f"{row['rows_per_s']:.2f} rows/s ({row['ratio_vs_1_slot']:.2f}x 1 slot)", ""))
        else:
            state = "on" if row["cache_prompt"] else "off"
            out.append((f"local model {row['model']}: prefix cache {state}, shared system prompt",
                        f"{row['rows_per_s']:.2f} rows/s, {row['prompt_tokens_evaluated_per_row']:.0f} prompt tokens "
                        f"evaluated per row ({row['ratio_vs_no_cache']:.2f}x no cache)", ""))
    return out


def _report_scale(df: pl.DataFrame) -> list[Line]:
    out = []
    for row in df.iter_rows(named=True):
        ratio, low, rounds = row.get("ratio_vs_compute"), row.get("ratio_vs_compute_min"), row.get("repeats")
        spread = "" if low is None else f", range {low:.2f}-{row['ratio_vs_compute_max']:.2f} over {rounds} rounds"
        versus = "" if ratio is None or row["phase"] == "compute" else \
            f" (**{ratio:.2f}x** compute{spread}; CPU {row['cpu_ratio_vs_compute']:.2f}x)"
        if rounds is not None and rounds > 1:
            versus = f" median{versus}"
        goal = "<= 2x compute" if row["phase"].startswith("write_report") else ""
        out.append((f"report over {row['rollout_rows']:,} rollout rows: {row['phase']}",
                    f"{row['seconds']:.1f} s{versus}, peak RSS {row['peak_rss_mib']:.0f} MiB", goal))
    return out


def _gateway(df: pl.DataFrame) -> list[Line]:
    row = df.row(0, named=True)
    return [(f"gateway vs direct to a fake upstream, {row['concurrency']} concurrent calls",
             f"{row['gateway_per_s']:.0f} vs {row['direct_per_s']:.0f} completions/s "
             f"(**{row['ratio_gateway_vs_direct']:.2f}**); cache hit {row['gateway_cache_hit_per_s']:.0f}/s"
             + _gateway_cpu(row) + _bare_proxy(row), ">= 0.90")] + _slow_gateway(row)


def _slow_gateway(row: dict) -> list[Line]:
    """The same comparison with an upstream that takes as long as a hosted model, when measured."""
    if row.get("slow_gateway_per_s") is None:
        return []
    return [(f"gateway vs direct to a fake upstream answering in {row['slow_latency_s'] * 1000:.0f} ms, "
             f"{row['concurrency']} concurrent calls",
             f"{row['slow_gateway_per_s']:.0f} vs {row['slow_direct_per_s']:.0f} completions/s "
             f"(**{row['ratio_slow_gateway_vs_direct']:.2f}**); p50 latency {row['slow_gateway_p50_ms']:.1f} vs "
             f"{row['slow_direct_p50_ms']:.1f} ms", "")]


def _bare_proxy(row: dict) -> str:
    """The floor of a gateway on its stack (a proxy with no logic), when the run measured it."""
    if row.get("bare_proxy_per_s") is None:
        return ""
    return (f"; a bare proxy on the same stack {row['bare_proxy_per_s']:.0f}/s "
            f"(**{row['ratio_bare_proxy_vs_direct']:.2f}** of direct, its CPU "
            f"{row['bare_proxy_cpu_ms_per_call_proxy']:.2f} ms per call): the gateway is "
            f"{row['ratio_gateway_vs_bare_proxy']:.2f} of it")


def _gateway_cpu(row: dict) -> str:
    """The gateway's own CPU per call beside the upstream's, when the run measured it."""
    gateway, upstream = row.get("gateway_cpu_ms_per_call_gateway"), row.get("direct_cpu_ms_per_call_upstream")
    if gateway is None or upstream is None:
        return ""
    return f"; gateway CPU {gateway:.2f} ms per call (upstream {upstream:.2f}, load generator " \
           f"{row['direct_cpu_ms_per_call_load']:.2f} direct)"


def _cluster(df: pl.DataFrame) -> list[Line]:
    out = []
    for row in df.sort("nodes").iter_rows(named=True):
        if row["point"].startswith("estimate"):
            out.append((f"cluster, paper estimate: {row['runs']} hosted-model runs on {row['nodes']} nodes "
                        "(assumptions in `estimate_json`)",
                        f"{row['wall_s'] / 60:.1f} min at {row['rollouts_per_s']:.0f} rollouts/s", ""))
        else:
            per_node = row.get("cpu_s_per_node")
            extra = f", +{per_node:.0f} CPU s per added node" if per_node is not None else ""
            out.append((f"cluster: the same {row['runs']} scripted runs on {row['nodes']} simulated node(s), one host",
                        f"{row['rollouts_per_s']:.0f} rollouts/s, {row['cpu_ms_per_rollout']:.0f} CPU ms per rollout"
                        f"{extra}, startup {row['startup_s']:.0f} s", ""))
    return out


SECTIONS: dict[str, Callable[[pl.DataFrame], list[Line]]] = {
    "overhead": _overhead, "overlap": _overlap, "scale": _scale, "local_model": _local_model,
    "report_scale": _report_scale, "gateway_overhead": _gateway, "cluster": _cluster,
}


def summary_table(results_dir: Path) -> str:
    lines, machines = [], set()
    for name, render in SECTIONS.items():
        path = results_dir / f"{name}.parquet"
        if not path.exists():
            continue
        df = pl.read_parquet(path)
        machines.update(f"{r['cpus']} CPUs, Python {r['python']}, measured {r['measured_at'][:10]}"
                        for r in df.select("cpus", "python", "measured_at").iter_rows(named=True))
        lines.extend(render(df))
    if not lines:
        raise SystemExit(f"no benchmark results in {results_dir}")
    table = ["| what | figure | goal |", "|---|---|---|", *(f"| {w} | {f} | {g} |" for w, f, g in lines)]
    return "\n".join([*table, "", "Machines: " + "; ".join(sorted(machines)) + "."])


def write_summary(results_dir: Path) -> str:
    table = summary_table(results_dir)
    (results_dir / "summary.md").write_text(table + "\n")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    print(write_summary(parser.parse_args(argv).results_dir))


if __name__ == "__main__":
    main()
