"""fedplat inside Flower (extra ``fedplat[flower]``).

* :class:`FedplatStrategy`: a Flower strategy (Message API) that runs any fedplat
  aggregator with its pre-aggregators, configured like a run file's
  ``aggregator:`` section, and reports per-client decisions in the round's
  metrics;
* :func:`uplink_mod`: a Flower client mod that compresses (DGC, top-k with error
  feedback, count-sketch, with or without local DP noise) the outgoing update as
  the strategy asks; the strategy decodes it;
* :class:`ContributionScoring`: optional GTG-Shapley, leave-one-out or cosine
  scores per round.

Updates travel as fedplat payload bytes or Flower's own ``.npy`` arrays, never
as pickles.
"""

from fedplat.flower.contribution import ContributionScoring
from fedplat.flower.mods import uplink_mod
from fedplat.flower.records import RecordError
from fedplat.flower.report import (
    NodeDecision,
    Rejection,
    RoundReport,
    decisions_from_metrics,
)
from fedplat.flower.strategy import FedplatStrategy
from fedplat.flower.uplink import UplinkError, UplinkSpec

__all__ = [
    "ContributionScoring",
    "FedplatStrategy",
    "NodeDecision",
    "RecordError",
    "Rejection",
    "RoundReport",
    "UplinkError",
    "UplinkSpec",
    "decisions_from_metrics",
    "uplink_mod",
]
