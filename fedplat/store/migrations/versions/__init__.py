"""Schema revisions of the fedplat store, oldest first."""
