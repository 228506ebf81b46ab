"""A Flower app using fedplat's strategy and uplink mod (see pyproject.toml)."""
