"""The control API over real gRPC and mutual TLS: roles, refusals, the audit
trail, operator revocation, tokens and devices without the database, and an
operator's stop of the run (fedplat/control, `fedplat runs|devices|tokens|audit`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fedplat.server.config import ConfigError, parse_config

from fedplat.cli import main
from fedplat.control.audit import NEEDS
from fedplat.security.certs import CertError, fingerprint, issue_peer
from fedplat.security.operators import ROLES, issue_operator, operator_from_pem
from fedplat.store import Store
from tests.support import run_config, wait_for
from tests.support.control import cli, make_pki, profile, serve

pytestmark = pytest.mark.integration  # real sockets, TLS handshakes


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ops = {f"{role}-1": role for role in ROLES}
    return make_pki(tmp_path_factory.mktemp("pki"), {**ops, "admin-2": "admin"})


def test_roles_are_signed_into_operator_certificates(pki: Path) -> None:
    op = operator_from_pem((pki / "operator-1.pem").read_bytes())
    assert (op.name, op.role) == ("operator-1", "operator")
    assert op.may("viewer") and op.may("operator") and not op.may("admin")
    # A device's or a gossip peer's certificate from the same CA is no operator's.
    with pytest.raises(CertError, match="not an operator"):
        operator_from_pem((pki / "device-0.pem").read_bytes())
    issue_peer(pki, "peer-x")
    with pytest.raises(CertError, match="not an operator"):
        operator_from_pem((pki / "peer-x.pem").read_bytes())
    with pytest.raises(CertError, match="role"):
        issue_operator(pki, "root", role="root")
    assert set(NEEDS.values()) <= set(ROLES)


def test_control_needs_tls(tmp_path: Path, pki: Path) -> None:
    raw = run_config(tmp_path, rounds=1, clients=1)
    raw["control"] = {"operator_ca": str(pki / "ca.pem")}
    assert raw["server"].get("insecure") is True
    with pytest.raises(ConfigError, match=r"control needs server\.tls"):
        parse_config(raw)


def test_roles_refusals_audit_and_revocation(
    tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv, raw, control = serve(tmp_path, pki)
    viewer = profile(tmp_path, pki, "viewer-1", control)
    operator = profile(tmp_path, pki, "operator-1", control)
    admin = profile(tmp_path, pki, "admin-1", control)
    device = profile(tmp_path, pki, "device-0", control)
    try:
        rc, out, _ = cli(capsys, viewer, "runs", "ls")
        assert rc == 0 and raw["run"]["name"] in out and "(served here)" in out
        rc, out, _ = cli(capsys, viewer, "whoami")
        assert rc == 0 and out.startswith("viewer-1 (viewer)")

        # What a role does not allow: PERMISSION_DENIED, one line, exit 2.
        rc, _, err = cli(capsys, viewer, "runs", "stop", raw["run"]["name"])
        assert rc == 2 and err.startswith("fedplat: PERMISSION_DENIED: StopRun needs")
        assert err.count("\n") == 1
        rc, _, err = cli(capsys, operator, "tokens", "create", "--count", "2")
        assert rc == 2 and "CreateTokens needs the admin role" in err
        # A device's certificate is refused whatever it asks.
        rc, _, err = cli(capsys, device, "runs", "ls")
        assert rc == 2 and "not an operator certificate" in err

        # The admin makes tokens without the database's credentials.
        rc, out, _ = cli(capsys, admin, "tokens", "create", "--count", "2")
        secrets = out.split()
        assert (
            rc == 0
            and len(secrets) == 2
            and all(s.startswith("fpt1.") for s in secrets)
        )
        rc, out, _ = cli(capsys, viewer, "tokens", "list")
        assert rc == 0 and out.count("valid") == 2 and secrets[0] not in out
        rc, out, _ = cli(capsys, admin, "devices", "ls", "--run", raw["run"]["name"])
        assert rc == 0 and out == ""
        rc, _, err = cli(
            capsys, admin, "devices", "revoke", "nobody", "--run", raw["run"]["name"]
        )
        assert rc == 2 and err.startswith("fedplat: NOT_FOUND: no device 'nobody'")

        # Revoking an operator takes effect on its next call.
        fp = fingerprint((pki / "viewer-1.pem").read_bytes())
        rc, _, _ = cli(capsys, admin, "operators", "revoke", fp, "--name", "viewer-1")
        assert rc == 0
        rc, _, err = cli(capsys, viewer, "runs", "ls")
        assert rc == 2 and "was revoked" in err

        # Every call is in the audit log, allowed or refused, with who and what.
        rc, out, _ = cli(capsys, admin, "audit", "--limit", "100")
        assert rc == 0
        lines = out.splitlines()
        assert any(
            "viewer-1 (viewer)  StopRun" in x and "needs the operator role" in x
            for x in lines
        )
        assert any("operator-1 (operator)  CreateTokens" in x for x in lines)
        assert any(
            "device-0 (none" in x and "not an operator certificate" in x for x in lines
        )
        assert any("admin-1 (admin)  CreateTokens count=2: ok" in x for x in lines)
        assert any(
            "viewer-1 (viewer)  ListRuns" in x and "was revoked" in x for x in lines
        )
        assert any(
            "admin-1 (admin)  RevokeOperator" in x and x.endswith(": ok") for x in lines
        )
    finally:
        srv.stop()


def test_bad_input_is_refused_with_a_status(
    tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv, _raw, control = serve(tmp_path, pki)
    admin = profile(tmp_path, pki, "admin-2", control)
    try:
        rc, _, err = cli(capsys, admin, "runs", "show", "no-such-run")
        assert rc == 2 and err.startswith("fedplat: NOT_FOUND: no run named")
        rc, _, err = cli(capsys, admin, "tokens", "create", "--count", "5000")
        assert rc == 2 and "INVALID_ARGUMENT: count: 1 to 1000" in err
        rc, _, err = cli(capsys, admin, "operators", "revoke", "not-hex")
        assert rc == 2 and "INVALID_ARGUMENT" in err and "fingerprint" in err
        # No profile and no flags: one line, exit 2, before any connection.
        rc = main(["runs", "ls", "--profile", str(tmp_path / "missing.yaml")])
        assert rc == 2 and "profile" in capsys.readouterr().err
    finally:
        srv.stop()


def test_an_operator_stops_the_run(
    tmp_path: Path, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    srv, raw, control = serve(tmp_path, pki)
    operator = profile(tmp_path, pki, "operator-1", control)
    name = raw["run"]["name"]
    rc, out, _ = cli(capsys, operator, "runs", "stop", name, "--reason", "wrong data")
    assert rc == 0 and "is stopping" in out
    wait_for(lambda: srv.server.stop_event.is_set(), 30, "the stop")
    srv.stop()
    with Store(raw["store"]["url"]) as store:
        run = store.get_run_by_name(name)
        assert run is not None and run.status == "failed"
        assert run.reason == "stopped by operator operator-1: wrong data"
        audit = store.list_events(kind="audit")
        stops = [e for e in audit if e.details["method"] == "StopRun"]
        # Filed with no run (runs' own event feeds stay theirs), the run named.
        assert stops and all(e.run_id is None for e in stops)
        assert stops[0].details["run_id"] == run.id
