"""The coordinator (``fedplat.server``); see :mod:`fedplat.server.coordinator`."""
