"""Robust aggregation rules on tiny hand-checkable inputs, registries and pipelines."""

from __future__ import annotations

import pytest
import torch
from fedplat.aggregators import (
    AggregationError,
    Bucketing,
    CenteredClipping,
    FlagAggregator,
    Krum,
    MultiKrum,
    Pipeline,
    StatelessAggregator,
    available_aggregators,
    available_pre_aggregators,
    build_aggregator,
    create_aggregator,
    create_pre_aggregator,
    register_aggregator,
    register_pre_aggregator,
)
from fedplat.aggregators.base import ClientDecision, check_updates
from fedplat.aggregators.kernels.bitonic import sort_columns


def col(*values: float) -> torch.Tensor:
    """One client per value, d = 1: ``[n, 1]``."""
    return torch.tensor([[v] for v in values], dtype=torch.float32)


def by_index(decisions: list[ClientDecision]) -> dict[int, ClientDecision]:
    return {d.index: d for d in decisions}


# --------------------------------------------------------------------------- rules


def test_fedavg_weighted() -> None:
    x = torch.tensor([[0.0, 2.0], [4.0, 6.0]])
    r = create_aggregator("fedavg")(x, torch.tensor([1.0, 3.0]))
    assert torch.allclose(r.aggregate, torch.tensor([3.0, 5.0]))
    assert [d.weight for d in r.decisions] == [0.25, 0.75]


def test_median_odd_even_and_participation() -> None:
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [100.0, -5.0]])
    r = create_aggregator("median")(x)
    assert torch.equal(r.aggregate, torch.tensor([2.0, 10.0]))
    d = by_index(r.decisions)
    # Row 1 is the median of column 0, row 0 of column 1, row 2 never.
    assert [d[i].score for i in range(3)] == [0.5, 0.5, 0.0]
    assert [d[i].weight for i in range(3)] == [0.5, 0.5, 0.0]
    assert "down-weighted" in d[2].flags and not d[2].selected
    even = create_aggregator("median")(col(1, 2, 3, 10))
    assert float(even.aggregate) == 2.5  # mean of the two middle values


def test_trimmed_mean() -> None:
    agg = create_aggregator("trimmed_mean", f=1)
    assert float(agg(col(1, 2, 3, 4, 100)).aggregate) == 3.0
    assert (
        float(create_aggregator("trimmed_mean", f=2)(col(1, 2, 3, 4, 100)).aggregate)
        == 3
    )
    with pytest.raises(AggregationError, match=r"2f < n.*f=3, n=5"):
        create_aggregator("trimmed_mean", f=3)(col(1, 2, 3, 4, 100))


def test_meamed_window_and_tie_rule() -> None:
    agg = create_aggregator("meamed", f=2)
    # median 2, the three closest values are 1, 2, 3
    assert float(agg(col(0, 1, 2, 3, 10)).aggregate) == 2.0
    # median 2; 0 and 4 tie at distance 2: the lower value is kept
    assert float(create_aggregator("meamed", f=1)(col(0, 2, 4)).aggregate) == 1.0


def test_krum_and_multi_krum_on_a_line() -> None:
    x = col(0, 1, 2, 10)
    # f=0: 2 neighbours. Scores: 0 -> 1+4, 1 -> 1+1, 2 -> 1+4, 10 -> 64+81.
    r = Krum(f=0)(x)
    assert float(r.aggregate) == 1.0
    assert [d.score for d in r.decisions] == [5.0, 2.0, 5.0, 145.0]
    assert [d.selected for d in r.decisions] == [False, True, False, False]
    assert r.decisions[3].flags == ("excluded",)
    # m=2: row 1, then the tie 0 vs 2 (score 5) goes to the lower index.
    assert float(MultiKrum(f=0, m=2)(x).aggregate) == 0.5
    # default m = n - f
    assert float(MultiKrum(f=0)(x).aggregate) == pytest.approx(13 / 4)


def test_krum_is_multi_krum_with_m_1() -> None:
    assert issubclass(Krum, MultiKrum)
    assert Krum(f=1).m == 1


def test_krum_bound() -> None:
    with pytest.raises(
        AggregationError, match=r"krum needs n >= 2f \+ 3, got f=1, n=4"
    ):
        Krum(f=1)(col(0, 1, 2, 3))
    with pytest.raises(AggregationError, match=r"m <= n"):
        MultiKrum(f=0, m=5)(col(0, 1, 2, 3))


def test_bulyan_by_hand() -> None:
    # f=1, n=7: theta=5 rows picked by repeated Krum (2, 1, 3, 0, 4, see module
    # docstring), then per coordinate the beta=3 values closest to the median.
    x = col(0, 1, 2, 3, 4, 50, -50)
    r = create_aggregator("bulyan", f=1)(x)
    assert float(r.aggregate) == 2.0
    sel = [d.selected for d in r.decisions]
    assert sel == [True, True, True, True, True, False, False]
    assert "excluded" in r.decisions[5].flags
    with pytest.raises(AggregationError, match=r"n >= 4f \+ 3"):
        create_aggregator("bulyan", f=2)(x)


def test_geometric_median_symmetric_and_outlier() -> None:
    square = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    r = create_aggregator("geometric_median")(square)
    assert torch.allclose(r.aggregate, torch.zeros(2), atol=1e-6)
    # 1-D: the geometric median is the median (1), far from the mean (~3.7).
    r = create_aggregator("geometric_median", nu=1e-9, max_iter=2000, tol=1e-12)(
        col(0, 1, 10)
    )
    assert float(r.aggregate) == pytest.approx(1.0, abs=1e-3)
    d = by_index(r.decisions)
    assert d[2].weight < 0.01 and "down-weighted" in d[2].flags
    assert sum(x.weight for x in r.decisions) == pytest.approx(1.0)


def test_centered_clipping_by_hand_and_state() -> None:
    x = torch.tensor([[3.0, 4.0], [0.5, 0.0]])
    cc = CenteredClipping(tau=1.0, iterations=1)
    r = cc(x)
    # around 0: (3,4) has norm 5 -> (0.6, 0.8); (0.5, 0) is inside the ball
    assert torch.allclose(r.aggregate, torch.tensor([0.55, 0.4]))
    assert r.decisions[0].flags == ("clipped",) and r.decisions[1].flags == ()
    assert r.decisions[0].weight == pytest.approx(0.1)  # 0.5 * 1/5
    assert torch.allclose(cc.state_dict()["center"], torch.tensor([0.55, 0.4]))
    # second round starts from the carried reference point
    v = torch.tensor([0.55, 0.4])
    z = x - v
    s = (1.0 / z.norm(dim=1)).clamp(max=1.0)
    expect = v + (z * s[:, None]).mean(dim=0)
    assert torch.allclose(cc(x).aggregate, expect, atol=1e-6)
    # the state round-trips
    fresh = CenteredClipping(tau=1.0, iterations=1)
    fresh.load_state_dict(cc.state_dict())
    assert torch.allclose(fresh(x).aggregate, cc(x).aggregate)
    with pytest.raises(AggregationError, match="unknown state keys"):
        fresh.load_state_dict({"bogus": torch.zeros(1)})
    with pytest.raises(AggregationError, match="reference point has 2 entries"):
        fresh(torch.zeros(3, 5))


def test_flag_identical_gradients_give_parallel_output() -> None:
    g = torch.randn(64, generator=torch.Generator().manual_seed(3))
    x = g.repeat(5, 1)
    out = FlagAggregator(m=2)(x).aggregate
    cos = torch.nn.functional.cosine_similarity(out, g, dim=0)
    assert float(cos) == pytest.approx(1.0, abs=1e-5)
    # paper scaling: (1/m) * sum of the 5 unit directions
    assert float(out.norm()) == pytest.approx(5 / 2, rel=1e-5)
    scaled = FlagAggregator(m=2, rescale="median_norm")(x).aggregate
    assert torch.allclose(scaled, g, atol=1e-4)


def test_flag_orthogonal_directions_and_report() -> None:
    x = torch.eye(3) * torch.tensor([[2.0], [3.0], [4.0]])
    r = FlagAggregator(m=3)(x)  # subspace holds every direction
    assert torch.allclose(r.aggregate, torch.full((3,), 1 / 3), atol=1e-5)
    assert all(d.score == pytest.approx(1.0) for d in r.decisions)
    with pytest.raises(AggregationError, match="rescale"):
        FlagAggregator(rescale="nope")


def test_flag_down_weights_an_outlier_direction() -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(200, generator=gen)
    honest = base + 0.1 * torch.randn(9, 200, generator=gen)
    x = torch.cat([honest, torch.randn(1, 200, generator=gen) * 50])
    r = FlagAggregator(m=1)(x)
    scores = [d.score for d in r.decisions]
    assert scores[9] < 0.1 < min(scores[:9])
    assert "down-weighted" in r.decisions[9].flags


def test_check_updates_rejects_bad_inputs() -> None:
    with pytest.raises(AggregationError, match=r"\[n, d\]"):
        check_updates(torch.zeros(3))
    with pytest.raises(AggregationError, match="floating"):
        check_updates(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(AggregationError, match="non-negative"):
        check_updates(torch.zeros(2, 2), torch.tensor([1.0, -1.0]))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("trimmed_mean", {"f": -1}),
        ("krum", {"f": True}),
        ("multi_krum", {"f": 1, "m": 0}),
        ("geometric_median", {"nu": 0.0}),
        ("geometric_median", {"tol": float("nan")}),
        ("centered_clipping", {"tau": -1.0}),
        ("centered_clipping", {"iterations": 0}),
        ("flag", {"m": 0}),
        ("flag", {"lam": -1.0}),
    ],
)
def test_settings_validated_in_init(name: str, params: dict[str, object]) -> None:
    with pytest.raises(AggregationError):
        create_aggregator(name, **params)


def test_sort_columns_matches_torch_sort_with_padding_and_infs() -> None:
    gen = torch.Generator().manual_seed(1)
    for n in (1, 2, 3, 7, 33, 64, 65, 300):
        x = torch.randn(n, 700, generator=gen)
        x[0, :3] = torch.tensor([float("inf"), -float("inf"), 0.0])
        assert torch.equal(sort_columns(x), torch.sort(x, dim=0).values), n


# ------------------------------------------------------------------- registries


def test_registered_names() -> None:
    assert available_aggregators() == sorted(
        [
            "bulyan",
            "centered_clipping",
            "fedavg",
            "flag",
            "geometric_median",
            "krum",
            "meamed",
            "median",
            "multi_krum",
            "trimmed_mean",
        ]
    )
    assert available_pre_aggregators() == ["bucketing", "clipping", "nnm"]


def test_registry_errors() -> None:
    with pytest.raises(AggregationError, match="already registered"):
        register_aggregator("Krum", Krum)
    with pytest.raises(AggregationError, match="already registered"):
        register_pre_aggregator("bucketing", Bucketing)
    with pytest.raises(AggregationError, match=r"unknown aggregator 'krumm'.*bulyan"):
        create_aggregator("krumm")
    with pytest.raises(AggregationError, match=r"unknown pre-aggregator.*nnm"):
        create_pre_aggregator("bucket")
    with pytest.raises(
        AggregationError, match=r"unknown parameter.*'q'.*accepted: f, m"
    ):
        create_aggregator("multi_krum", f=1, q=2)
    with pytest.raises(AggregationError, match="bad parameters"):
        create_aggregator("krum")  # f is required
    assert create_aggregator(" KRUM ", f=1).name == "krum"


def test_build_aggregator_validates_pre_specs() -> None:
    assert isinstance(build_aggregator("median"), type(create_aggregator("median")))
    with pytest.raises(AggregationError, match=r"unknown key\(s\) \['parms'\]"):
        build_aggregator("median", None, [{"name": "bucketing", "parms": {}}])
    with pytest.raises(AggregationError, match="has no 'name'"):
        build_aggregator("median", None, [{"params": {}}])
    with pytest.raises(AggregationError, match="unknown parameter"):
        build_aggregator("median", None, [{"name": "bucketing", "params": {"s": 2}}])
    with pytest.raises(AggregationError, match="cannot follow"):
        Pipeline([Bucketing()], StatelessAggregator())  # type: ignore[arg-type]


# -------------------------------------------------------------------- pipelines


def test_pipeline_bucketing_maps_weights_back_to_clients() -> None:
    x = col(0, 1, 2, 3)
    agg = build_aggregator("fedavg", {}, [{"name": "bucketing", "params": {"seed": 5}}])
    r = agg(x)
    assert float(r.aggregate) == pytest.approx(1.5)
    assert [d.weight for d in r.decisions] == pytest.approx([0.25] * 4)
    # Krum over the 2 buckets... needs 2f + 3 rows: the error names the stages.
    krum = build_aggregator("krum", {"f": 0}, [{"name": "bucketing", "params": {}}])
    with pytest.raises(
        AggregationError, match=r"n >= 2f \+ 3.*bucketing: 4 clients -> 2"
    ):
        krum(x)


def test_pipeline_krum_after_bucketing_selects_a_bucket() -> None:
    x = col(0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 100, 101)
    agg = build_aggregator("krum", {"f": 1}, [{"name": "bucketing", "params": {}}])
    assert isinstance(agg, Pipeline)
    r = agg(x)
    chosen = [d for d in r.decisions if d.selected]
    assert len(chosen) == 2 and all(d.weight == 0.5 for d in chosen)
    # the two members of the selected bucket share its score
    assert chosen[0].score == chosen[1].score
    assert all("excluded" in d.flags for d in r.decisions if not d.selected)
    assert float(r.aggregate) == pytest.approx(
        sum(float(x[d.index]) for d in chosen) / 2
    )


def test_pipeline_state_round_trip_reproduces_buckets() -> None:
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(0))
    spec = [{"name": "bucketing", "params": {"bucket_size": 3, "seed": 7}}]
    a = build_aggregator("centered_clipping", {"tau": 0.5}, spec)
    a(x)
    state = a.state_dict()
    assert sorted(state) == ["pre.0.rng", "rule.center"]
    b = build_aggregator("centered_clipping", {"tau": 0.5}, spec)
    b.load_state_dict(state)
    assert torch.equal(a(x).aggregate, b(x).aggregate)
    with pytest.raises(AggregationError, match="unknown state key"):
        b.load_state_dict({"pre.3.rng": state["pre.0.rng"]})


def test_pipeline_clipping_then_nnm_flags() -> None:
    x = torch.tensor([[10.0, 0.0], [0.0, 0.5], [0.5, 0.0]])
    agg = build_aggregator(
        "fedavg",
        {},
        [
            {"name": "clipping", "params": {"max_norm": 1.0}},
            {"name": "nnm", "params": {"f": 1}},
        ],
    )
    r = agg(x)
    assert r.decisions[0].flags == ("clipped",)
    # after clipping a=(1,0), b=(0,.5), c=(.5,0); squared distances ab=1.25,
    # ac=.25, bc=.5, so NNM (n-f=2, self included) mixes a+c, b+c, c+a
    a, b, c = torch.tensor([[1.0, 0.0], [0.0, 0.5], [0.5, 0.0]])
    mixed = torch.stack([(a + c) / 2, (b + c) / 2, (c + a) / 2])
    assert torch.allclose(r.aggregate, mixed.mean(dim=0))
    assert sum(d.weight for d in r.decisions) == pytest.approx(1.0)
