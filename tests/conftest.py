"""Shared fixtures. Converted real models live in `<repo>/var/test-data` so later runs reuse them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data folder for tests (`KVNOTES_DATA`): `<repo>/var/test-data`, kept between runs."""
    path = REPO / "var" / "test-data"
    path.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("KVNOTES_DATA")
    os.environ["KVNOTES_DATA"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("KVNOTES_DATA", None)
    else:
        os.environ["KVNOTES_DATA"] = previous
