"""bench/stream_window.py: the tiny mode runs both server configurations and
writes the JSON the docs quote; the coordinator's configuration is the one the
coordinator serves with."""

from __future__ import annotations

import pytest

from tests.support import run_bench


def test_coordinator_options_fix_the_stream_window() -> None:
    from bench.stream_window import options

    ours, auto = dict(options("coordinator")), dict(options("grpc_auto_tuning"))
    assert ours["grpc.http2.bdp_probe"] == 0
    assert ours["grpc.http2.lookahead_bytes"] == 1 << 20
    assert not {"grpc.http2.bdp_probe", "grpc.http2.lookahead_bytes"} & set(auto)
    assert {k: v for k, v in ours.items() if k in auto} == auto


@pytest.mark.integration  # starts real processes
@pytest.mark.timeout(600)
def test_tiny_run_measures_both_configurations(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = tmp_path_factory.mktemp("sw") / "sw.json"
    res = run_bench("bench.stream_window", out, timeout=600)
    assert res["tiny"] is True
    assert set(res["rows"]) == {"coordinator", "grpc_auto_tuning"}
    for row in res["rows"].values():
        assert row["median_seconds"] > 0 and len(row["repetitions"]) == 1
    assert res["bytes_waiting_mb"] == pytest.approx(4 * 8 * 1.048576, abs=0.1)
    assert res["setup"]["coordinator_options"]["grpc.http2.bdp_probe"] == 0
