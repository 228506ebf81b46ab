"""Fixtures of the gossip tests (helpers live in :mod:`tests.support.gossip`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedplat.gossip.scenario import DataSpec
from fedplat.gossip.setup import NodeData, load_node_data
from tests.support import REPO

TABULAR = REPO / "examples" / "tabular"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Many tiny matmuls: intra-op threads only add contention on 2 shared cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data() -> NodeData:
    """Digits split IID among 4 nodes (the in-process peers' data)."""
    return load_node_data(DataSpec(dataset="digits"), 4, 0)


@pytest.fixture
def tabular_app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``examples/tabular`` importable as ``app`` for one test (``sys.path`` and
    ``sys.modules["app"]`` are restored after it); yields the folder."""
    monkeypatch.setattr(sys, "path", [str(TABULAR), *sys.path])
    before = sys.modules.pop("app", None)
    yield TABULAR
    sys.modules.pop("app", None)
    if before is not None:
        sys.modules["app"] = before
