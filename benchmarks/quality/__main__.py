"""`python -m benchmarks.quality`: our GEPA, the `gepa` library and seed-only on Banking77
and heart disease with the local models (policy and proposer Qwen2.5-Coder-1.5B), seeds
0, 1, 2, 500 optimization rollouts per run, the same 100 heldout rows for every arm.

It drives the `quality` sweep (configs/sweep/quality.yaml) one seed at a time, so every
cell gets its first seed before any gets its third, and the sweep's resume makes it
restartable: run the same command again and finished runs are skipped. Model responses are
kept in `results/.cache/` (not committed), so the seed's answers are computed once. Evidence goes to
`benchmarks/quality/results/evidence/` (committed with the table, so a later session on
another machine resumes too); the table to `results/summary.md`.

  --quick                smoke size: 1 seed, 60 rollouts, 20 heldout rows (results/quick/)
  --report-only          rebuild the table from the evidence without running anything
  --seeds 0,1            which seeds; -- OVERRIDES...: passed on to the harness
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.quality.table import Reference, arm_settings, write

RESULTS = Path(__file__).resolve().parent / "results"
QUICK = ["budget.max_rollouts=60", "budget.max_wall_s=900", "pools.heldout.count=20", "pools.train.count=20",
         "pools.pareto.start=20", "pools.pareto.count=10"]


def default_arms(quick: bool) -> Reference:
    """(task, algorithm) -> the settings of the runs the default command (`--quick`'s, with
    `quick`) plans: the table names every other configuration by how it differs from them."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.config import CONFIG_DIR, load_config, run_spec
    from harness.sweep.expand import grid, parse_sweep

    overrides = ["+sweep=quality", "sweep.seeds=[0]", *(QUICK if quick else [])]
    arms: Reference = {}
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        sweep = parse_sweep(OmegaConf.to_container(compose(config_name="config", overrides=overrides).sweep))
        for point in grid(sweep, overrides):
            raw = OmegaConf.to_container(compose(config_name="config", overrides=list(point.overrides)), resolve=True)
            spec = run_spec(load_config(raw))  # type: ignore[arg-type]
            pools = spec.pools
            rows = {name: pools.stratify[name].count if name in pools.stratify else len(getattr(pools, name))
                    for name in ("train", "pareto", "heldout")}
            arms[(spec.container.name, spec.algorithm.name)] = arm_settings(
                spec.algorithm.params, rows, {name: strata.field for name, strata in pools.stratify.items()},
                spec.heldout_candidates, max_rollouts=spec.budget.max_rollouts)
    return arms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2; --quick: 0)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/quality/results)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    args = parser.parse_args(argv)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    evidence = out / "evidence"
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    title = "Optimizer quality" + (" (quick)" if args.quick else "")
    reference = default_arms(args.quick)
    if not args.report_only:
        for seed in seeds:
            command = [sys.executable, "-m", "harness", "+sweep=quality", f"evidence_root={evidence}",
                       f"gateway.cache_path={out / '.cache' / 'responses.sqlite'}",
                       f"sweep.seeds=[{seed}]", *(QUICK if args.quick else []), *args.overrides]
            print(f"[quality] seed {seed}: {' '.join(command[1:])}", flush=True)
            started = time.monotonic()
            try:
                code = subprocess.run(command, check=False).returncode
            except KeyboardInterrupt:  # the harness stops its runs itself; keep what is done
                write(evidence / "quality", out, title, reference)
                print("[quality] interrupted: run the same command again to resume", flush=True)
                return 130
            print(f"[quality] seed {seed}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
            write(evidence / "quality", out, title, reference)  # the table so far, after every seed
            if code not in (0, 1):  # 1: some run failed (recorded, shown in the table); else: stop here
                return code
    cells = write(evidence / "quality", out, title, reference)
    print((out / "summary.md").read_text())
    return 0 if cells.height else 1


if __name__ == "__main__":
    raise SystemExit(main())
