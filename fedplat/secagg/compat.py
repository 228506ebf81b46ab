"""What a run may combine with secure aggregation, and why the rest is refused.

The server of a secure-aggregation round learns one vector: the sum of the
survivors' updates (:class:`fedplat.secagg.SecAggResult`). Every part of a run
that needs an individual update is therefore impossible, not merely slower, and
the run configuration must be refused before the first round with a message
naming the part and the reason (:func:`check_secagg_compatible`).
"""

from __future__ import annotations

from collections.abc import Iterable

from fedplat.secagg.errors import SecAggError

__all__ = ["LINEAR_COMPRESSORS", "ROW_RULES", "check_secagg_compatible"]

# Aggregators (fedplat.aggregators registry names) that need the [n, d] rows.
ROW_RULES: dict[str, str] = {
    "median": "a coordinate-wise median of the rows",
    "trimmed_mean": "the sorted rows of each coordinate",
    "meamed": "the rows closest to each coordinate's median",
    "krum": "pairwise distances between rows, then one row",
    "multi_krum": "pairwise distances between rows",
    "bulyan": "Krum selections and sorted coordinates of the rows",
    "geometric_median": "distances from a running centre to every row",
    "centered_clipping": "each row clipped around a centre at the server",
    "flag": "every row normalised and fitted by a subspace",
}
# Compressors whose client payloads add up coordinate by coordinate.
LINEAR_COMPRESSORS = frozenset(
    {"identity", "countsketch", "gaussian_sketch", "ams_sketch"}
)


def check_secagg_compatible(
    *,
    aggregator: str,
    weighted: bool,
    pre_aggregators: Iterable[str],
    compression: str,
    contribution_scoring: bool,
) -> None:
    """Raise :class:`SecAggError` naming the first part that needs individual rows.

    Parameters
    ----------
    aggregator : str
        The rule's registry name; only ``"fedavg"`` works on a sum.
    weighted : bool
        Weighting by client-reported example counts (the server cannot weight
        masked vectors; a client weighting itself is unverifiable).
    pre_aggregators : iterable of str
        Any pre-aggregator (clipping, nnm, bucketing) transforms rows.
    compression : str
        Compressor name; sparse payloads (top-k, DGC) select different
        coordinates per client and cannot be summed in a masked ring.
    contribution_scoring : bool
        Leave-one-out or Shapley scoring needs each client's update.
    """
    if aggregator != "fedavg":
        why = ROW_RULES.get(aggregator, "individual client updates")
        raise SecAggError(
            f"aggregator {aggregator!r} needs {why}; under secure aggregation the "
            "coordinator only sees the sum: use fedavg"
        )
    if weighted:
        raise SecAggError(
            "weighted fedavg needs per-client weights applied at the coordinator; "
            "under secure aggregation set aggregator.weighted: false"
        )
    pre = list(pre_aggregators)
    if pre:
        raise SecAggError(
            f"pre-aggregators {pre} transform individual updates; under secure "
            "aggregation clients must clip their own updates (privacy.clip_norm)"
        )
    if compression not in LINEAR_COMPRESSORS:
        raise SecAggError(
            f"compression {compression!r} is not linear in the update (per-client "
            f"index sets or casts); use one of {sorted(LINEAR_COMPRESSORS)}"
        )
    if contribution_scoring:
        raise SecAggError(
            "contribution scoring needs each client's update; turn it off under "
            "secure aggregation"
        )
