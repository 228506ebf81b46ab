"""A coordinator serving its control API over mutual TLS, operators' profiles,
and the CLI run as an operator would (tests/control)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fedplat.server.app import BackgroundServer
from fedplat.server.config import parse_config

from fedplat.cli import main
from fedplat.security.certs import create_ca, issue
from fedplat.security.operators import issue_operator
from tests.support.configs import free_port, run_config


def make_pki(d: Path, operators: dict[str, str]) -> Path:
    """A CA in ``d`` with a server certificate, a device's (``device-0``) and
    one operator certificate per ``name: role``."""
    create_ca(d)
    issue(d, "server", server=True)
    issue(d, "device-0", server=False)
    for name, role in operators.items():
        issue_operator(d, name, role=role)
    return d


def serve(
    tmp: Path, pki: Path, **control: object
) -> tuple[BackgroundServer, dict, str]:
    """A coordinator over TLS with a 50-round run and its control API; returns
    the server, its run file and the control API's address."""
    address = f"localhost:{free_port()}"
    where = f"localhost:{free_port()}"
    raw = run_config(tmp, rounds=50, clients=2, address=address)
    raw["server"] = {
        "address": address,
        "tls": {"cert": str(pki / "server.pem"), "key": str(pki / "server.key")},
    }
    raw["control"] = {"address": where, "operator_ca": str(pki / "ca.pem"), **control}
    return BackgroundServer(parse_config(raw)).start(), raw, where


def profile(tmp: Path, pki: Path, who: str, service: str) -> str:
    """A profile file for operator ``who`` (its certificate in ``pki``)."""
    p = tmp / f"{who}.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "service": service,
                "ca": str(pki / "ca.pem"),
                "cert": str(pki / f"{who}.pem"),
                "key": str(pki / f"{who}.key"),
            }
        )
    )
    return str(p)


def cli(
    capsys: pytest.CaptureFixture[str], profile: str, *argv: str
) -> tuple[int, str, str]:
    """``fedplat ARGV --profile PROFILE``: exit code, stdout, stderr."""
    rc = main([*argv, "--profile", profile])
    out = capsys.readouterr()
    return rc, out.out, out.err
