"""Container health probe: ask the coordinator's gRPC health service.

The image's ``HEALTHCHECK`` runs this. The coordinator registers the standard
``grpc.health.v1.Health`` service and reports ``fedplat.v1.Coordinator`` as
SERVING while it accepts clients, so a process that is up but not serving (still
loading, or shutting down) counts as unhealthy, which a TCP port check would miss.

Address: ``FEDPLAT_HEALTH_ADDRESS``, else the one the coordinator binds
(``FEDPLAT__SERVER__ADDRESS``) with a wildcard host replaced by 127.0.0.1.
TLS: ``FEDPLAT_HEALTH_TLS_CA`` (PEM of the CA that signed the server
certificate; default: the CA ``fedplat certs init`` made in the volume,
``/var/lib/fedplat/pki/ca.pem``, when it exists), plus
``FEDPLAT_HEALTH_TLS_CERT``/``FEDPLAT_HEALTH_TLS_KEY`` when the coordinator
requires client certificates. Without a CA it speaks plaintext. Exit status
0 = healthy, 1 = not.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "fedplat.v1.Coordinator"
TIMEOUT_S = 4.0


def address() -> str:
    explicit = os.environ.get("FEDPLAT_HEALTH_ADDRESS")
    if explicit:
        return explicit
    bound = os.environ.get("FEDPLAT__SERVER__ADDRESS", "127.0.0.1:50051")
    host, _, port = bound.rpartition(":")
    if host in ("0.0.0.0", "[::]", "::", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"


DEFAULT_CA = Path("/var/lib/fedplat/pki/ca.pem")


def channel(target: str) -> grpc.Channel:
    ca = os.environ.get("FEDPLAT_HEALTH_TLS_CA") or (
        str(DEFAULT_CA) if DEFAULT_CA.is_file() else ""
    )
    if not ca:
        return grpc.insecure_channel(target)
    cert = os.environ.get("FEDPLAT_HEALTH_TLS_CERT")
    key = os.environ.get("FEDPLAT_HEALTH_TLS_KEY")
    creds = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )
    return grpc.secure_channel(target, creds)


def main() -> int:
    target = address()
    try:
        with channel(target) as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=TIMEOUT_S
            )
    except grpc.RpcError as exc:
        print(f"{target}: {exc.code().name}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{target}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
