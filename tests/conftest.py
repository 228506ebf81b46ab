"""Fixtures shared by every test; helpers live in :mod:`tests.support`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    pr = Procs(logdir)
    yield pr
    pr.cleanup()
