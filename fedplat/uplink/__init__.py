"""Both halves of the uplink contract between a client and the coordinator.

:mod:`~fedplat.uplink.task` is the typed task config; :mod:`~fedplat.uplink.client`
compresses and privatises what a client sends; :mod:`~fedplat.uplink.body` holds
an upload's payload bytes; :mod:`~fedplat.uplink.decode` is the coordinator's one
decode path into a row; :mod:`~fedplat.uplink.server` is the run's plan (which
compressor, the DP noise and accountant).
"""

from fedplat.uplink.task import (
    CompressionSpec,
    PrivacySpec,
    TaskConfig,
    TaskConfigError,
    TrainingSettings,
)

__all__ = [
    "CompressionSpec",
    "PrivacySpec",
    "TaskConfig",
    "TaskConfigError",
    "TrainingSettings",
]
