"""bench/stream_window.py: the tiny mode runs both server configurations and
writes the JSON the docs quote; the coordinator's configuration is the one the
coordinator serves with; and with it, uploads waiting for a decoding slot hold
about one receive window each, within the memory model, not their bytes.

The tiny mode (4 streams of 8 MiB, 33.6 MB waiting) cannot show the memory
claim: holding every waiting byte would stay within the model's 64 MB slack,
and gRPC's auto-tuned windows do not grow past the coordinator's fixed ones in
streams that short (growth 15-18 MB for both in three runs). The memory test
runs the benchmark's own :func:`bench.stream_window.run` on 16 streams of
32 MiB instead (537 MB waiting, seconds on loopback).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import REPO, run_bench


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


#: Enough waiting bytes that holding them would break the bound several times
#: over, and enough streams that auto-tuned windows (several MB each) would too:
#: at 8 streams of 64 MiB the auto-tuned server stayed within it once in three.
MEMORY_SETUP = {"streams": 16, "stream_mb": 32, "repetitions": 1}
RUN = """
import json, sys
from bench.stream_window import Setup, run
print(json.dumps(run(Setup(**json.loads(sys.argv[1])))))
"""


@pytest.mark.integration  # starts real processes
@pytest.mark.timeout(600)
def test_waiting_uploads_hold_one_window_each_not_their_bytes() -> None:
    from bench.round_overhead import SLACK, SLACK_MB, STREAM_WINDOW

    proc = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(MEMORY_SETUP)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.splitlines()[-1])
    ours = res["rows"]["coordinator"]["peak_growth_mb"]
    auto = res["rows"]["grpc_auto_tuning"]["peak_growth_mb"]
    # The model (docs/scale.md, bench/round_overhead.py predicted_mb): an upload
    # waiting for the slot holds one receive window, server.stream_window_bytes
    # (1 MiB); a peak fits when <= predicted x SLACK + SLACK_MB. Here predicted
    # is 16 windows (16.8 MB), so the bound is 82.5 MB, against 536.9 MB
    # waiting: a server holding more than ~15 % of the waiting bytes breaks it.
    streams = MEMORY_SETUP["streams"]
    bound = streams * STREAM_WINDOW / 1e6 * SLACK + SLACK_MB
    assert res["bytes_waiting_mb"] == pytest.approx(
        streams * MEMORY_SETUP["stream_mb"] * 1.048576, abs=0.1
    )
    assert res["bytes_waiting_mb"] > 6 * bound
    assert 0 < ours <= bound, res["rows"]
    # Not asserted: that gRPC's auto-tuned windows grow past the fixed ones
    # (177 to 395 MB against 33 to 37 MB in three runs of this setup). BDP
    # probing sizes windows from measured round trips, which a loaded machine
    # changes; the claim under test is the coordinator's bound.
    assert auto > 0, res["rows"]
