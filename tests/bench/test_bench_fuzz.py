"""Tiny mode of bench/fuzz.py: a short fuzz of live servers finds no crash, hang
or internal error, every call of both services is reached with valid and
invalid credentials, the store checks out and honest participants are served
afterwards; and docs/security.md quotes the committed fuzz.json."""

from __future__ import annotations

import json

import pytest

from tests.support import REPO, run_bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fuzz") / "fuzz.json"
    return run_bench("bench.fuzz", out, timeout=900)


@pytest.mark.integration  # starts real processes
def test_short_fuzz_finds_nothing_and_an_honest_round_follows(tiny: dict) -> None:
    assert tiny["benchmark"] == "fuzz" and tiny["tiny"] is True
    assert tiny["messages"] == 600
    for key in ("crashes", "hangs", "internal_errors", "store_check_failures"):
        assert tiny[key] == 0, (key, tiny["examples"])
    assert tiny["logged_tracebacks"] == 0
    assert tiny["honest_round_after"] is True
    assert tiny["goal_met"] is True


@pytest.mark.integration  # starts real processes
def test_every_call_is_reached_with_good_and_bad_credentials(tiny: dict) -> None:
    reached = {name.split(".", 1)[1] for name in tiny["per_rpc"]}
    assert reached == set(tiny["rpcs"]["coordinator"]) | set(tiny["rpcs"]["peer"])
    creds = {k.split(":", 1)[1] for k in tiny["per_credentials"]}
    assert {"valid", "bad_token", "unknown_client", "neighbour", "outsider"} <= creds
    # Mutations of valid messages mostly reach the handlers' own checks: more
    # refusals by the handlers than protobuf parse failures.
    refused = sum(
        n for k, n in tiny["outcomes"].items() if k not in ("OK", "parse_error")
    )
    assert refused > 2 * tiny["parse_errors"]


def test_docs_quote_the_committed_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is not an installed package
    from bench.fuzz import RESULTS, render_markdown

    doc = (REPO / "docs" / "security.md").read_text()
    begin, end = "<!-- fuzz-table:begin -->\n", "<!-- fuzz-table:end -->"
    quoted = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert quoted == render_markdown(json.loads(RESULTS.read_text()))
