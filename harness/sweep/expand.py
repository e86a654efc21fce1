"""Sweep axes -> run specs. Hydra composes each grid point (through a callable handed in
by the entry point); this module only decides which points exist."""

from __future__ import annotations

import itertools
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import ConfigError, first_error

# axis name in the sweep file -> the Hydra override key it sets
AXES: dict[str, str] = {
    "containers": "container",
    "policies": "policy",
    "proposers": "proposer",
    "algorithms": "algorithm",
    "seeds": "seed",
}


class SweepSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    # a directory under evidence_root: no leading dot (`..`, `.`, hidden names stay out)
    name: str = Field(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$", max_length=128)
    description: str = ""
    containers: list[str] | None = None
    policies: list[str] | None = None
    proposers: list[str] | None = None
    algorithms: list[str] | None = None
    seeds: list[int] | None = None
    # axes that vary together (same length), e.g. [[policies, proposers]]
    zip: list[list[str]] = Field(default_factory=list)
    # grid points to leave out: each a mapping of override key -> value, all must match
    exclude: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "SweepSpec":
        zipped: set[str] = set()
        for group in self.zip:
            for axis in group:
                if axis not in AXES:
                    raise ValueError(f"zip names unknown axis {axis!r}; axes are {sorted(AXES)}")
                if axis in zipped:
                    raise ValueError(f"axis {axis!r} is zipped twice")
                if getattr(self, axis) is None:
                    raise ValueError(f"zip names axis {axis!r} that the sweep does not set")
                zipped.add(axis)
            lengths = {len(getattr(self, axis)) for axis in group}
            if len(lengths) > 1:
                raise ValueError(f"zipped axes {group} have different lengths")
        for axis in AXES:
            values = getattr(self, axis)
            if values is not None and not values:
                raise ValueError(f"axis {axis!r} is empty")
        for rule in self.exclude:
            # a rule naming anything but an override key (e.g. the axis name `containers`) would
            # never match and silently exclude nothing
            unknown = sorted(set(rule) - set(AXES.values()))
            if unknown or not rule:
                raise ValueError(f"exclude rule {rule} must map override keys {sorted(AXES.values())} to values")
        return self


class GridPoint(BaseModel):
    model_config = ConfigDict(frozen=True)
    overrides: tuple[str, ...]
    axes: dict[str, str]


def parse_sweep(raw: dict[str, Any]) -> SweepSpec:
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as exc:
        error = first_error(exc)
        # a check of the whole sweep (an empty axis, a bad zip) has no field to name
        raise ConfigError(f"sweep '{error.where}': {error.message}" if error.where else f"sweep: {error.message}") \
            from exc


def pinned_keys(user_overrides: list[str]) -> dict[str, str]:
    """Axis keys the user fixed on the command line (e.g. container=heart_disease)."""
    pinned = {}
    for override in user_overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep and key in AXES.values():
            pinned[key] = value
    return pinned


def grid(sweep: SweepSpec, user_overrides: list[str]) -> list[GridPoint]:
    pinned = pinned_keys(user_overrides)
    blocks: list[list[dict[str, str]]] = []
    zipped = {axis for group in sweep.zip for axis in group}
    for group in sweep.zip:
        columns = [[str(v) for v in getattr(sweep, axis)] for axis in group]
        blocks.append([{AXES[a]: v for a, v in zip(group, row)} for row in zip(*columns)])
    for axis, key in AXES.items():
        values = getattr(sweep, axis)
        if axis in zipped or values is None:
            continue
        blocks.append([{key: str(v)} for v in values])
    points = []
    seen: set[tuple] = set()
    for combo in itertools.product(*blocks):
        axes: dict[str, str] = {}
        for part in combo:
            axes.update(part)
        axes.update({k: v for k, v in pinned.items() if k in axes})
        if any(all(str(axes.get(k)) == str(v) for k, v in rule.items()) for rule in sweep.exclude):
            continue
        key = tuple(sorted(axes.items()))
        if key in seen:
            continue
        seen.add(key)
        # grid values go last so they win over the user's non-axis overrides only on their own keys
        extra = [o for o in user_overrides if o.lstrip("+~").partition("=")[0] not in axes]
        points.append(GridPoint(overrides=tuple(extra + [f"{k}={v}" for k, v in axes.items()]), axes=axes))
    return points


def expand(sweep: SweepSpec, user_overrides: list[str], compose: Callable[[list[str]], dict[str, Any]]) -> list[tuple[GridPoint, dict[str, Any]]]:
    return [(point, compose(list(point.overrides))) for point in grid(sweep, user_overrides)]
