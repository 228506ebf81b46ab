"""Fixtures of the gossip tests (helpers live in :mod:`tests.support.gossip`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from fedplat.gossip.scenario import DataSpec
from fedplat.gossip.setup import NodeData, load_node_data


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
