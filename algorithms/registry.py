"""Optimizers by name. Apart from `algorithms.protocol`, so that an engine importing the
protocol does not import every other engine back."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import ValidationError

from algorithms.protocol import Optimizer
from harness.errors import ConfigError, first_error
from harness.specs import ContainerSpec


class OptimizerClass(Protocol):
    def from_params(self, params: dict[str, Any]) -> Optimizer: ...


def _registry() -> dict[str, OptimizerClass]:
    # Imported lazily so that building one optimizer does not import every engine.
    from algorithms.gepa.optimizer import GepaOptimizer
    from algorithms.seed_only import SeedOnly

    engines: dict[str, OptimizerClass] = {"gepa": GepaOptimizer, "seed_only": SeedOnly}
    try:
        from algorithms.gepa_ai import GepaLibraryOptimizer
    except ImportError:
        pass
    else:
        engines["gepa_ai"] = GepaLibraryOptimizer
    return engines


def algorithm_names() -> list[str]:
    return sorted(_registry())


def params_from_container(name: str, params: dict[str, Any], container: ContainerSpec) -> dict[str, Any]:
    """`params` with the container settings the optimizer takes as params (its class's
    `container_params`, param -> ContainerSpec field) that the config left out and the
    container sets. A fact about a container's rows, declared once in its config, so reaches
    only the optimizers that read it, and only their run ids; unchanged otherwise."""
    engine = _registry().get(name)
    taken = getattr(engine, "container_params", {})
    extra = {param: getattr(container, field) for param, field in taken.items()
             if param not in params and getattr(container, field, None) is not None}
    return {**params, **extra} if extra else params


def build_optimizer(name: str, params: dict[str, Any]) -> Optimizer:
    registry = _registry()
    if name not in registry:
        raise ConfigError(f"unknown algorithm {name!r}; known: {', '.join(sorted(registry))}")
    try:
        return registry[name].from_params(params)
    except ValidationError as exc:
        error = first_error(exc)
        what = (f"unknown param '{error.where}' (misspelled?)" if error.kind == "extra_forbidden"
                else f"{error.where}: {error.message}" if error.where else error.message)
        raise ConfigError(f"algorithm {name!r}: invalid params: {what}") from exc
    except ValueError as exc:
        raise ConfigError(f"algorithm {name!r}: invalid params: {exc}") from exc
