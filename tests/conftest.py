"""Fixtures shared by every test; helpers live in :mod:`tests.support`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    pr = Procs(logdir)
    yield pr
    pr.cleanup()


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright (see :mod:`tests.support.browser`)."""
    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="needs the playwright package (dev extra)"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(autouse=True)
def _fedplat_loggers_enabled() -> None:
    """A guard for tests that read the log: a ``logging.config`` call made in
    process with ``disable_existing_loggers`` (by any library an earlier test
    loads) would switch fedplat's loggers off for the rest of the session. Not
    seen to happen; the malformed-protobuf test's lost records were not traced
    to it."""
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("fedplat") and isinstance(logger, logging.Logger):
            logger.disabled = False
