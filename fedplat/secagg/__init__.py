"""Secure aggregation: the server learns the sum of the updates, not the updates.

SecAgg (Bonawitz et al., CCS 2017) with the sparse-graph SecAgg+ variant (Bell et
al., CCS 2020). Pure protocol logic over explicit message objects: the
coordinator carries :mod:`fedplat.secagg.messages` (bytes via ``encode`` /
``decode``) between :class:`SecAggClient` objects and a :class:`SecAggServer`.
The threat model and its limits are in ``docs/privacy.md``.
"""

from fedplat.secagg.client import SecAggClient
from fedplat.secagg.compat import check_secagg_compatible
from fedplat.secagg.config import SecAggConfig
from fedplat.secagg.errors import SecAggAborted, SecAggError, SecAggRejected
from fedplat.secagg.graph import GraphParameters, harary_parameters, neighbours
from fedplat.secagg.messages import Message, decode, encode
from fedplat.secagg.quantize import FixedPoint
from fedplat.secagg.server import Rejection, SecAggResult, SecAggServer

__all__ = [
    "FixedPoint",
    "GraphParameters",
    "Message",
    "Rejection",
    "SecAggAborted",
    "SecAggClient",
    "SecAggConfig",
    "SecAggError",
    "SecAggRejected",
    "SecAggResult",
    "SecAggServer",
    "check_secagg_compatible",
    "decode",
    "encode",
    "harary_parameters",
    "neighbours",
]
