"""Shared test fixtures. Tests are offline: datasets come from a local folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_datasets_dir() -> Path:
    """$HARNESS_DATA_DIR, else the workspace's `shared/datasets` next to the repository."""
    configured = os.environ.get("HARNESS_DATA_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_datasets_dir()
    if not path.is_dir():
        pytest.skip(f"dataset folder {path} not found (set HARNESS_DATA_DIR)")
    return path
