"""Reference clients for demos, simulations, benchmarks and robustness evaluation.

Not part of the client SDK an edge app embeds: :mod:`fedplat.reference.clients`
trains a registered model on one partition of a bundled dataset, and
:mod:`fedplat.reference.byzantine` turns a client into an attacker (evaluation only).
"""
