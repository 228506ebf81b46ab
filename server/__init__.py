"""Coordinator (imported as ``fedplat.server``)."""
