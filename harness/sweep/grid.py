"""The grid sweep.json records: this invocation's runs and the runs earlier invocations of
the same sweep left in its directory (other seeds, other overrides), so a report of the
sweep covers all of its evidence, not only what the last command asked for.

Runs of one cell (the same axes apart from the seed) whose configurations differ, say an
earlier invocation with `algorithm.params.minibatch_size=8`, would pool into one mean; the
grid then names each configuration on a `config` axis (harness/evidence/configs.py), as a
folder of single runs does."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from harness.evidence import configs
from harness.specs import RunSpec

NOT_CELL_AXES = ("run_id", "seed")


def planned_config(spec: RunSpec) -> dict[str, str]:
    """A planned run's configuration as its manifest will record it."""
    return configs.run_config({"identity": json.loads(json.dumps(spec.identity(), default=str))})


def sweep_grid(planned: list[RunSpec], earlier: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Grid points of the planned runs and of `earlier` (run id -> manifest of a run directory
    this invocation does not plan), a `config` axis added when a cell holds configurations
    that differ."""
    points = {s.run_id: {"run_id": s.run_id, **s.axes} for s in planned}
    found = {s.run_id: planned_config(s) for s in planned}
    for run_id, manifest in sorted(earlier.items()):  # none of them planned (SweepStore.earlier_runs)
        points[run_id] = {"run_id": run_id, **{k: str(v) for k, v in (manifest.get("axes") or {}).items()}}
        found[run_id] = configs.run_config(manifest)
    if earlier:
        labels = _labels_within_cells(points, found)
        if labels:
            for run_id, point in points.items():
                point[configs.CONFIG_AXIS] = labels.get(run_id, "-")
    return list(points.values())


def solved_thresholds(planned: list[RunSpec], earlier: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Container name -> the `solved_threshold` its config sets, for every run of the grid:
    earlier invocations' runs (from their manifests' specs) and this one's, which win where
    a container's config changed since."""
    containers = [(m.get("spec") or {}).get("container") or {} for _, m in sorted(earlier.items())]
    containers += [s.container.model_dump() for s in planned]
    found = {c.get("name"): c.get("solved_threshold") for c in containers if c.get("solved_threshold") is not None}
    return {str(name): float(value) for name, value in sorted(found.items())}


def _labels_within_cells(points: dict[str, dict[str, str]], found: dict[str, dict[str, str]]) -> dict[str, str]:
    """Run id -> its configuration's name, for the runs of cells holding more than one
    configuration (the axes already tell cells apart)."""
    cells: dict[tuple[tuple[str, str], ...], list[str]] = defaultdict(list)
    for run_id, point in points.items():
        cells[tuple(sorted((k, v) for k, v in point.items() if k not in NOT_CELL_AXES))].append(run_id)
    labels: dict[str, str] = {}
    for members in cells.values():
        labels.update(configs.config_labels({r: found[r] for r in members}) or {})
    return {r: label for r, label in labels.items() if label != "-"}
