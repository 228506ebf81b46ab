"""Operators of a coordinator: who may call its control API, and as what.

An operator holds a client certificate from the deployment's CA (``fedplat
certs operator NAME --role ROLE``) whose subject alternative names carry one
URI, ``urn:fedplat:operator-role:ROLE``. Device and peer certificates from the
same CA carry no such URI, so they can never act as operators; the role is
signed by the CA, so a holder cannot raise it.

Roles, each allowed what the ones before it are:

- ``viewer``: read runs, devices, tokens (never their secrets) and the audit log;
- ``operator``: also stop runs;
- ``admin``: also create and revoke enrolment tokens, revoke devices and
  revoke operators.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedplat.security.certs import (
    _NAME,
    CertError,
    Issued,
    _issue,
    _load_pem,
    fingerprint,
)

Role = Literal["viewer", "operator", "admin"]
#: In increasing order of what they may do.
ROLES: tuple[Role, ...] = get_args(Role)
ROLE_URI_PREFIX = "urn:fedplat:operator-role:"


@dataclass(frozen=True)
class Operator:
    """A caller of the control API, from its verified certificate."""

    name: str
    role: Role
    fingerprint: str

    def may(self, needed: Role) -> bool:
        """Whether this operator's role includes ``needed``."""
        return ROLES.index(self.role) >= ROLES.index(needed)


def check_role(role: str) -> Role:
    if role not in ROLES:
        raise CertError(f"role {role!r}: use one of {', '.join(ROLES)}")
    return role


def issue_operator(
    directory: str | os.PathLike[str], name: str, *, role: str, days: int = 365
) -> Issued:
    """Write ``NAME.pem``/``NAME.key``: a client certificate (clientAuth) for
    operator ``name`` with ``role`` signed into its SANs."""
    return _issue(
        Path(directory),
        name,
        [ExtendedKeyUsageOID.CLIENT_AUTH],
        (),
        days,
        uris=(ROLE_URI_PREFIX + check_role(role),),
    )


def is_operator_certificate(cert_pem: bytes) -> bool:
    """Whether a PEM certificate carries an operator role (a device API refuses
    it: an operator's certificate is never a device's)."""
    try:
        cert = _load_pem(cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (CertError, x509.ExtensionNotFound, ValueError):
        return False
    uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    return any(u.startswith(ROLE_URI_PREFIX) for u in uris)


def operator_from_pem(cert_pem: bytes) -> Operator:
    """The operator a (CA-verified) certificate names; :class:`CertError` if it
    is not an operator certificate (no role URI, two of them, or no clientAuth)."""
    cert = _load_pem(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    roles = [
        u.removeprefix(ROLE_URI_PREFIX) for u in uris if u.startswith(ROLE_URI_PREFIX)
    ]
    if len(roles) != 1:
        raise CertError("not an operator certificate (no single operator role)")
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        client_auth = ExtendedKeyUsageOID.CLIENT_AUTH in usage.value
    except x509.ExtensionNotFound:
        client_auth = False
    if not client_auth:
        raise CertError("not an operator certificate (no clientAuth usage)")
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(cns[0].value) if cns else ""
    if not _NAME.match(name):
        # What `fedplat certs` issues; a CA that signs any name cannot put
        # newlines or escape sequences into the audit trail through it.
        raise CertError(
            "operator certificate name: 1-64 letters, digits, '.', '_', '-'"
        )
    return Operator(name, check_role(roles[0]), fingerprint(cert_pem))


__all__ = [
    "ROLES",
    "ROLE_URI_PREFIX",
    "Operator",
    "Role",
    "check_role",
    "is_operator_certificate",
    "issue_operator",
    "operator_from_pem",
]
