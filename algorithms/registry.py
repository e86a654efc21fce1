"""Optimizers by name. Apart from `algorithms.protocol`, so that an engine importing the
protocol does not import every other engine back."""

from __future__ import annotations

from typing import Any, Callable

from pydantic import ValidationError

from algorithms.protocol import Optimizer
from harness.errors import ConfigError, first_error

OptimizerFactory = Callable[[dict[str, Any]], Optimizer]


def _registry() -> dict[str, OptimizerFactory]:
    # Imported lazily so that building one optimizer does not import every engine.
    from algorithms.gepa.optimizer import GepaOptimizer
    from algorithms.seed_only import SeedOnly

    factories: dict[str, OptimizerFactory] = {
        "gepa": GepaOptimizer.from_params,
        "seed_only": SeedOnly.from_params,
    }
    try:
        from algorithms.gepa_ai import GepaLibraryOptimizer
    except ImportError:
        pass
    else:
        factories["gepa_ai"] = GepaLibraryOptimizer.from_params
    return factories


def algorithm_names() -> list[str]:
    return sorted(_registry())


def build_optimizer(name: str, params: dict[str, Any]) -> Optimizer:
    registry = _registry()
    if name not in registry:
        raise ConfigError(f"unknown algorithm {name!r}; known: {', '.join(sorted(registry))}")
    try:
        return registry[name](params)
    except ValidationError as exc:
        error = first_error(exc)
        what = (f"unknown param '{error.where}' (misspelled?)" if error.kind == "extra_forbidden"
                else f"{error.where}: {error.message}" if error.where else error.message)
        raise ConfigError(f"algorithm {name!r}: invalid params: {what}") from exc
    except ValueError as exc:
        raise ConfigError(f"algorithm {name!r}: invalid params: {exc}") from exc
