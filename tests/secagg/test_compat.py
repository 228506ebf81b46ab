"""Rules that need individual updates are refused under secure aggregation."""

from __future__ import annotations

import pytest
from fedplat.aggregators import available_aggregators

from fedplat.compression import available_compressors
from fedplat.secagg.compat import (
    LINEAR_COMPRESSORS,
    ROW_RULES,
    check_secagg_compatible,
)
from fedplat.secagg.errors import SecAggError

OK = {
    "aggregator": "fedavg",
    "weighted": False,
    "pre_aggregators": [],
    "compression": "identity",
    "contribution_scoring": False,
}


def test_plain_fedavg_with_linear_compression_is_allowed() -> None:
    for name in sorted(LINEAR_COMPRESSORS):
        check_secagg_compatible(**{**OK, "compression": name})


def test_every_registered_robust_rule_is_refused_with_its_reason() -> None:
    rules = set(available_aggregators()) - {"fedavg"}
    assert rules == set(ROW_RULES)  # a new rule must say why it is refused
    for rule in sorted(rules):
        with pytest.raises(SecAggError, match=f"{rule!r} needs"):
            check_secagg_compatible(**{**OK, "aggregator": rule})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"weighted": True}, "weighted: false"),
        ({"pre_aggregators": ["clipping"]}, "clients must clip"),
        ({"compression": "dgc"}, "not linear"),
        ({"compression": "topk"}, "not linear"),
        ({"contribution_scoring": True}, "contribution scoring"),
    ],
)
def test_row_dependent_parts_are_refused(change: dict, match: str) -> None:
    with pytest.raises(SecAggError, match=match):
        check_secagg_compatible(**{**OK, **change})


def test_every_compressor_is_classified() -> None:
    assert set(available_compressors()) >= LINEAR_COMPRESSORS
