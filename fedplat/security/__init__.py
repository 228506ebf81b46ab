"""Keys, signed statements and certificates: who may speak, and whose words these are.

:mod:`~fedplat.security.keys` keeps Ed25519 key files, :mod:`~fedplat.security.identity`
signs and verifies domain-separated statements, :mod:`~fedplat.security.certs` is a
small CA for TLS and mutual TLS (``fedplat certs``).
"""
