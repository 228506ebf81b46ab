"""In-process simulation of many clients through the real round engine."""

from fedplat.sim.simulation import SimulationResult, VirtualClock, simulate

__all__ = ["SimulationResult", "VirtualClock", "simulate"]
