"""The SDK's gRPC channel arguments (fedplat.transport.grpc)."""

from __future__ import annotations

import pytest

from fedplat.transport.grpc import ChannelOptions, MiB, channel_options


def test_default_window_is_fixed_at_4_mib() -> None:
    args = dict(channel_options(ChannelOptions()))
    # gRPC's window auto-tuning off, a 4 MiB receive window per stream.
    assert args["grpc.http2.bdp_probe"] == 0
    assert args["grpc.http2.lookahead_bytes"] == 4 * MiB
    assert args["grpc.max_receive_message_length"] == 16 * MiB


def test_no_window_leaves_grpc_auto_tuning() -> None:
    args = dict(channel_options(ChannelOptions(stream_window_bytes=None)))
    assert "grpc.http2.bdp_probe" not in args
    assert "grpc.http2.lookahead_bytes" not in args


@pytest.mark.parametrize("bad", [0, 64 * 1024 - 1, 64 * MiB + 1])
def test_window_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="stream_window_bytes"):
        ChannelOptions(stream_window_bytes=bad)


def test_client_passes_its_window_to_the_channel() -> None:
    from fedplat.client import Client
    from torch import nn

    def train(model: object, config: object) -> int:
        return 1

    for window in (None, 8 * MiB):
        c = Client("127.0.0.1:1", nn.Linear(2, 1), train, stream_window_bytes=window)
        conn = c._factory()
        try:
            assert conn.opts.stream_window_bytes == window
        finally:
            conn.close()
