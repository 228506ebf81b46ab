"""Alembic environment of the fedplat store (see :mod:`fedplat.store.schema`)."""
