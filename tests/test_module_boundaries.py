"""The import picture, enforced: no circle among the project's modules, and the package
rules README.md's Architecture section states. The graph is grimp's (TYPE_CHECKING imports
and imports inside functions count: a lazy import is still a dependency)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from graphlib import CycleError, TopologicalSorter

import grimp
import pytest

from algorithms.protocol import RunView
from harness.context import RunContext

PACKAGES = ("harness", "algorithms", "benchmarks")
# What an optimizer may import from the harness: the value types it handles, the run's
# errors and its budget authority; never how a run is built (harness.context, harness.run, Ray, Hydra).
ALGORITHMS_MAY_IMPORT = frozenset({
    "harness.budget", "harness.candidates", "harness.contract", "harness.errors", "harness.llm", "harness.run_state", "harness.specs",
})
# The faces of `algorithms` the rest of the project may use.
ALGORITHMS_FACES = frozenset({"algorithms.registry", "algorithms.protocol"})


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)


def _internal(graph: grimp.ImportGraph) -> list[str]:
    return sorted(m for m in graph.modules if m.split(".")[0] in PACKAGES)


def _imports(graph: grimp.ImportGraph, prefix: str) -> list[tuple[str, str]]:
    """(importer, imported) for every direct import made by a module of `prefix`."""
    return sorted((m, imported) for m in _internal(graph) if _under(m, prefix)
                  for imported in graph.find_modules_directly_imported_by(m))


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_circle(graph: grimp.ImportGraph) -> None:
    internal = set(_internal(graph))
    sorter = TopologicalSorter({m: graph.find_modules_directly_imported_by(m) & internal for m in internal})
    try:
        sorter.prepare()
    except CycleError as exc:
        # CycleError lists each module before the one that imports it: reversed, A -> B reads "A imports B"
        pytest.fail(f"import circle: {' -> '.join(reversed(exc.args[1]))}", pytrace=False)


def test_the_harness_never_imports_benchmarks(graph: grimp.ImportGraph) -> None:
    assert [pair for pair in _imports(graph, "harness") if _under(pair[1], "benchmarks")] == []


def test_algorithms_import_only_the_harness_value_types(graph: grimp.ImportGraph) -> None:
    wrong = [pair for pair in _imports(graph, "algorithms")
             if (_under(pair[1], "harness") and pair[1] not in ALGORITHMS_MAY_IMPORT) or _under(pair[1], "benchmarks")]
    assert wrong == []


@pytest.mark.parametrize("external", ["ray", "hydra", "omegaconf"])
def test_algorithms_never_reach_ray_or_hydra(graph: grimp.ImportGraph, external: str) -> None:
    chain = graph.find_shortest_chain(importer="algorithms", imported=external, as_packages=True)
    assert chain is None, f"algorithms reach {external}: {' -> '.join(chain or ())}"


def test_only_the_registry_and_protocol_of_algorithms_are_imported_from_outside(graph: grimp.ImportGraph) -> None:
    outside = [pair for pair in _imports(graph, "harness") + _imports(graph, "benchmarks")
               if _under(pair[1], "algorithms") and pair[1] not in ALGORITHMS_FACES]
    assert outside == []
    assert ("harness.run", "algorithms.registry") in _imports(graph, "harness.run")  # the rule has a subject


def test_the_report_reads_only_evidence_from_the_harness(graph: grimp.ImportGraph) -> None:
    wrong = [pair for pair in _imports(graph, "benchmarks.report")
             if _under(pair[1], "harness") and not _under(pair[1], "harness.evidence") and pair[1] != "harness.atomic"]
    assert wrong == []


RUN_MACHINERY = ("harness.context", "harness.run", "harness.sweep", "harness.services", "harness.gateway",
                 "harness.evidence")


def test_containers_never_import_algorithms_or_the_run_machinery(graph: grimp.ImportGraph) -> None:
    wrong = [pair for pair in _imports(graph, "benchmarks.containers")
             if any(_under(pair[1], forbidden) for forbidden in ("algorithms", *RUN_MACHINERY))]
    assert wrong == []


def _self_attributes(cls: type) -> set[str]:
    """Names the class assigns as `self.NAME = ...` in any of its methods."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self"}


def _view_members() -> dict[str, object]:
    return {name: value for name, value in vars(RunView).items() if not name.startswith("_")}


def test_the_run_context_offers_every_member_of_the_run_view() -> None:
    members = _view_members()
    assert {"evaluate", "propose", "stop_reason", "rollouts_left", "record_proposal"} <= set(members)
    attributes = _self_attributes(RunContext)
    for name, member in members.items():
        if isinstance(member, property):
            assert name in attributes or hasattr(RunContext, name), f"RunContext has no {name!r}"
            continue
        implemented = getattr(RunContext, name, None)
        assert callable(implemented), f"RunContext has no method {name!r}"
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(member), name
        wanted = [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]
        found = [(p.name, p.kind) for p in inspect.signature(implemented).parameters.values()]
        assert found == wanted, f"RunContext.{name}{inspect.signature(implemented)} is not RunView.{name}"
