"""Aggregation rules over ``[n, d]`` update stacks (``fedplat.aggregators``).

Rules (``create_aggregator(name, **params)``), pre-aggregators
(``create_pre_aggregator``) and pipelines of both (``build_aggregator``) are
registered explicitly below; attacks live in :mod:`fedplat.aggregators.attacks`.
"""

from fedplat.aggregators.base import (
    AggregationError,
    AggregationResult,
    Aggregator,
    ClientDecision,
    PreAggregator,
    PreOutput,
    RowReport,
    Rule,
    RuleOutput,
    StatelessAggregator,
    check_updates,
)
from fedplat.aggregators.bulyan import Bulyan
from fedplat.aggregators.cclip import CenteredClipping
from fedplat.aggregators.coordinatewise import CoordinateMedian, MeaMed, TrimmedMean
from fedplat.aggregators.fedavg import FedAvg
from fedplat.aggregators.flag import FlagAggregator
from fedplat.aggregators.geomed import GeometricMedian
from fedplat.aggregators.krum import Krum, MultiKrum
from fedplat.aggregators.pipeline import Pipeline, build_aggregator
from fedplat.aggregators.preaggregators import (
    Bucketing,
    NearestNeighborMixing,
    NormClipping,
)
from fedplat.aggregators.registry import (
    available_aggregators,
    available_pre_aggregators,
    create_aggregator,
    create_pre_aggregator,
    register_aggregator,
    register_pre_aggregator,
)

register_aggregator("fedavg", FedAvg)
register_aggregator("median", CoordinateMedian)
register_aggregator("trimmed_mean", TrimmedMean)
register_aggregator("meamed", MeaMed)
register_aggregator("krum", Krum)
register_aggregator("multi_krum", MultiKrum)
register_aggregator("bulyan", Bulyan)
register_aggregator("geometric_median", GeometricMedian)
register_aggregator("centered_clipping", CenteredClipping)
register_aggregator("flag", FlagAggregator)

register_pre_aggregator("clipping", NormClipping)
register_pre_aggregator("nnm", NearestNeighborMixing)
register_pre_aggregator("bucketing", Bucketing)

__all__ = [
    "AggregationError",
    "AggregationResult",
    "Aggregator",
    "Bucketing",
    "Bulyan",
    "CenteredClipping",
    "ClientDecision",
    "CoordinateMedian",
    "FedAvg",
    "FlagAggregator",
    "GeometricMedian",
    "Krum",
    "MeaMed",
    "MultiKrum",
    "NearestNeighborMixing",
    "NormClipping",
    "Pipeline",
    "PreAggregator",
    "PreOutput",
    "RowReport",
    "Rule",
    "RuleOutput",
    "StatelessAggregator",
    "TrimmedMean",
    "available_aggregators",
    "available_pre_aggregators",
    "build_aggregator",
    "check_updates",
    "create_aggregator",
    "create_pre_aggregator",
    "register_aggregator",
    "register_pre_aggregator",
]
