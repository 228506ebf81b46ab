"""Enrolment tokens for a run described by a raw run-file mapping, for tests and
benchmarks that start a coordinator in admission mode ``tokens``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any


def issue_tokens(
    cfg: dict[str, Any], count: int, *, valid: timedelta = timedelta(hours=6)
) -> list[str]:
    """``count`` single-use enrolment tokens for the run of ``cfg`` (its
    ``run.name``), written to its store (``store.url``); the secrets, in order."""
    from fedplat.store import Store

    with Store(cfg["store"]["url"]) as store:
        made = store.create_tokens(
            count, expires_at=datetime.now(UTC) + valid, run_name=cfg["run"]["name"]
        )
    return [secret for _, secret in made]


__all__ = ["issue_tokens"]
