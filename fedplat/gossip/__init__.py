"""fedplat."""
