"""No product module imports another module's private names, or a library's private
modules (Hydra's `hydra._internal`, say): what a module keeps private may change without
notice. Parsed, not imported, so the check is fast and sees every file."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGES = ("harness", "algorithms", "benchmarks")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path) -> list[str]:
    """`file:line module name` for each private import in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [alias.name for alias in node.names if _private(alias.name)]
            if names or any(_private(part) for part in node.module.split(".")):
                listed = ", ".join(names or [alias.name for alias in node.names])
                found.append(f"{path.relative_to(REPO)}:{node.lineno} from {node.module} import {listed}")
        elif isinstance(node, ast.Import):
            found += [f"{path.relative_to(REPO)}:{node.lineno} import {alias.name}" for alias in node.names
                      if any(_private(part) for part in alias.name.split("."))]
    return found


def test_no_private_imports_in_the_product() -> None:
    files = [path for package in PACKAGES for path in (REPO / package).rglob("*.py")]
    assert len(files) > 50  # the packages were found
    offenders = [line for path in files for line in private_imports(path)]
    assert not offenders, "private imports:\n" + "\n".join(offenders)


def test_the_check_sees_a_private_import() -> None:
    sample = REPO / "tests" / "fixtures" / "private_import_sample.py"
    assert private_imports(sample) == [
        "tests/fixtures/private_import_sample.py:3 from hydra._internal.utils import get_args_parser",
        "tests/fixtures/private_import_sample.py:4 from harness.llm import _retry_after_seconds",
    ]
