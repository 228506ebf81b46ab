"""Readiness probe: wait until a coordinator's gRPC health service says SERVING."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def wait_healthy(
    address: str, timeout: float, *, credentials: grpc.ChannelCredentials | None = None
) -> None:
    """Block until ``address`` reports SERVING; TimeoutError if it never does."""
    end = time.monotonic() + timeout
    channel = (
        grpc.secure_channel(address, credentials)
        if credentials is not None
        else grpc.insecure_channel(address)
    )
    with channel as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > end:
                raise TimeoutError(
                    f"coordinator at {address} not healthy after {timeout}s"
                )
            time.sleep(0.2)
