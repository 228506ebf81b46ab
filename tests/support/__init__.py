"""Helpers shared by the tests (imported as ``tests.support``); fixtures live in
``tests/conftest.py``. No test module imports another test module."""

from tests.support.aggregation import EVERY_RULE, ref_geometric_median
from tests.support.bench import run_bench
from tests.support.clients import digits_client
from tests.support.configs import (
    REPO,
    free_port,
    issue_tokens,
    run_config,
    write_config,
)
from tests.support.plain_torch import run_without_fedplat
from tests.support.procs import Procs, wait_for

__all__ = [
    "EVERY_RULE",
    "REPO",
    "Procs",
    "digits_client",
    "free_port",
    "issue_tokens",
    "ref_geometric_median",
    "run_bench",
    "run_config",
    "run_without_fedplat",
    "wait_for",
    "write_config",
]
