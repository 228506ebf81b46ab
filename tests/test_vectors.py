from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.vectors import (
    Layout,
    LayoutError,
    TensorSpec,
    all_finite,
    check_finite,
    flatten,
    layout_of,
    load_vector,
    unflatten,
)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.bn = torch.nn.BatchNorm1d(2)


def test_layout_skips_integer_buffers_and_orders_tensors() -> None:
    layout = layout_of(Net())
    assert layout.names == [
        "fc.weight",
        "fc.bias",
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
    ]
    assert "bn.num_batches_tracked" not in layout.names
    assert layout.numel == 6 + 2 + 2 + 2 + 2 + 2
    assert layout.offsets()[:2] == [(0, 6), (6, 8)]


def test_flatten_unflatten_hand_checked() -> None:
    sd = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([5.0])}
    layout = layout_of(sd)
    vec = flatten(sd, layout)
    assert vec.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    back = unflatten(vec, layout)
    assert torch.equal(back["a"], sd["a"]) and torch.equal(back["b"], sd["b"])


def test_load_vector_into_model() -> None:
    net = Net()
    layout = layout_of(net)
    v = torch.arange(layout.numel, dtype=torch.float32)
    load_vector(net, v, layout)
    assert torch.equal(flatten(net, layout), v)


def test_fp16_tensors_restore_dtype() -> None:
    sd = {"h": torch.tensor([1.5, -2.0], dtype=torch.float16)}
    layout = layout_of(sd)
    assert layout.specs[0].dtype == "float16"
    assert unflatten(flatten(sd), layout)["h"].dtype == torch.float16


def test_errors_are_clear() -> None:
    layout = Layout((TensorSpec("w", (2, 2)),))
    with pytest.raises(LayoutError, match=r"layout needs \[4\]"):
        unflatten(torch.zeros(5), layout)
    with pytest.raises(LayoutError, match="expected"):
        flatten({"w": torch.zeros(3)}, layout)
    with pytest.raises(LayoutError, match="duplicate"):
        Layout((TensorSpec("w", (1,)), TensorSpec("w", (1,))))
    with pytest.raises(LayoutError, match="unsupported dtype"):
        TensorSpec("w", (1,), "int8")
    with pytest.raises(LayoutError, match="malformed"):
        Layout.from_dict({"tensors": [{"shape": [1]}]})
    with pytest.raises(LayoutError, match="non-finite"):
        check_finite(torch.tensor([0.0, float("nan")]))


def test_mismatch_description_and_fingerprint() -> None:
    a = Layout((TensorSpec("w", (2, 3)), TensorSpec("b", (3,))))
    b = Layout((TensorSpec("w", (2, 4)), TensorSpec("b", (3,))))
    c = Layout((TensorSpec("w", (2, 3)),))
    assert a.describe_mismatch(a) is None
    assert "shape [2, 4], expected [2, 3]" in (a.describe_mismatch(b) or "")
    assert "missing tensors ['b']" in (a.describe_mismatch(c) or "")
    assert a.fingerprint() == Layout.from_dict(a.to_dict()).fingerprint()
    assert a.fingerprint() != b.fingerprint()


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 4), min_size=0, max_size=3), min_size=1, max_size=5
    )
)
def test_roundtrip_property(shapes: list[list[int]]) -> None:
    sd = {
        f"t{i}": torch.randn(*s) if s else torch.randn(()) for i, s in enumerate(shapes)
    }
    layout = layout_of(sd)
    vec = flatten(sd, layout)
    assert vec.numel() == layout.numel
    back = unflatten(vec, layout)
    for k, t in sd.items():
        assert torch.equal(back[k], t)
    assert Layout.from_dict(layout.to_dict()) == layout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_all_finite_matches_isfinite(dtype: torch.dtype) -> None:
    big = torch.finfo(dtype).max
    v = torch.full((1000,), big, dtype=dtype)  # finite, but its float32 sum is not
    assert all_finite(v)
    for bad in (math.inf, -math.inf, math.nan):
        w = v.clone()
        w[123] = bad
        assert not all_finite(w)
    w = v.clone()
    w[0], w[1] = math.inf, -math.inf  # would cancel to nan, still caught
    assert not all_finite(w)
    assert all_finite(torch.zeros(0, dtype=dtype))
