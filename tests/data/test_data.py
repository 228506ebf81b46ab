"""Tests for fedplat.data: IDX parsing, dataset loaders, partitioners."""

from __future__ import annotations

import gzip
import logging
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.data import (
    Dataset,
    DatasetError,
    DatasetNotFoundError,
    available_datasets,
    available_partitioners,
    dirichlet,
    fashion_mnist_available,
    iid,
    label_sorted,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    parse_idx,
    partition,
    read_idx,
    shards,
    sized,
    write_idx,
)

# --------------------------------------------------------------------------- IDX


def _idx_bytes(code: int, dims: tuple[int, ...], payload: bytes) -> bytes:
    header = bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)
    return header + payload


def _write_gz(path: Path, data: bytes) -> Path:
    with gzip.open(path, "wb") as fh:
        fh.write(data)
    return path


def test_parse_hand_built_uint8_idx(tmp_path: Path) -> None:
    payload = bytes(range(24))
    path = _write_gz(tmp_path / "a-idx3-ubyte.gz", _idx_bytes(0x08, (2, 3, 4), payload))
    arr = read_idx(path)
    assert arr.shape == (2, 3, 4)
    assert arr.dtype == np.uint8
    np.testing.assert_array_equal(arr.reshape(-1), np.arange(24))
    assert not arr.flags.writeable  # shared through the per-process cache


def test_parse_big_endian_int32_and_float() -> None:
    ints = parse_idx(_idx_bytes(0x0C, (3,), struct.pack(">3i", 1, -2, 70000)))
    np.testing.assert_array_equal(ints, [1, -2, 70000])
    floats = parse_idx(_idx_bytes(0x0D, (2,), struct.pack(">2f", 0.5, -1.25)))
    np.testing.assert_array_equal(floats, np.array([0.5, -1.25], dtype=np.float32))


@pytest.mark.parametrize(
    "dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]
)
def test_write_read_roundtrip(tmp_path: Path, dtype: type) -> None:
    arr: np.ndarray = (np.arange(60).reshape(3, 4, 5) % 100).astype(dtype)
    for name in ("x.idx", "x.idx.gz"):
        write_idx(tmp_path / name, arr)
        out = read_idx(tmp_path / name)
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x01\x00\x08\x01" + struct.pack(">I", 2) + b"\x00\x00", "magic"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 2) + b"\x00\x00", "type code"),
        (b"\x00\x00\x08\x00", "zero dimensions"),
        (b"\x00\x00", "too short"),
        (b"\x00\x00\x08\x03" + struct.pack(">I", 2), "truncated IDX header"),
        (_idx_bytes(0x08, (2, 28, 28), bytes(100)), "truncated or corrupt"),
        (_idx_bytes(0x08, (2,), bytes(3)), "truncated or corrupt"),  # trailing junk
    ],
)
def test_malformed_idx_raises(tmp_path: Path, data: bytes, match: str) -> None:
    path = _write_gz(tmp_path / "bad.gz", data)
    with pytest.raises(DatasetError, match=match):
        read_idx(path)


def test_truncated_gzip_stream_raises(tmp_path: Path) -> None:
    good = gzip.compress(_idx_bytes(0x08, (1000,), bytes(1000)))
    path = tmp_path / "cut.gz"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(DatasetError, match="cannot read"):
        read_idx(path)


def test_missing_idx_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "nope.gz")


def _fake_fashion(root: Path, n_train: int = 12, n_test: int = 5) -> None:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(
            root / f"{prefix}-images-idx3-ubyte.gz",
            rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        )
        write_idx(
            root / f"{prefix}-labels-idx1-ubyte.gz",
            (np.arange(n) % 10).astype(np.uint8),
        )


def test_fashion_loader_on_synthetic_files(tmp_path: Path) -> None:
    _fake_fashion(tmp_path)
    ds = load_fashion_mnist("train", root=tmp_path)
    assert len(ds) == 12 and ds.input_shape == (1, 28, 28)
    assert ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
    assert float(ds.x.min()) >= 0.0 and float(ds.x.max()) <= 1.0
    raw = read_idx(tmp_path / "train-images-idx3-ubyte.gz")
    torch.testing.assert_close(ds.x[:, 0], torch.from_numpy(raw / np.float32(255)))
    assert len(load_fashion_mnist("test", root=tmp_path)) == 5


def test_fashion_root_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_fashion(tmp_path, n_train=7)
    monkeypatch.setenv("FEDPLAT_FASHION_MNIST_DIR", str(tmp_path))
    assert fashion_mnist_available()
    assert len(load_dataset("fashion-mnist")) == 7


def test_fashion_rejects_mismatched_counts(tmp_path: Path) -> None:
    _fake_fashion(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(3, dtype=np.uint8))
    with pytest.raises(DatasetError, match="12 images but 3 labels"):
        load_fashion_mnist(root=tmp_path)


def test_fashion_rejects_wrong_image_shape(tmp_path: Path) -> None:
    _fake_fashion(tmp_path)
    write_idx(
        tmp_path / "train-images-idx3-ubyte.gz", np.zeros((12, 8, 8), dtype=np.uint8)
    )
    with pytest.raises(DatasetError, match=r"\[N, 28, 28\]"):
        load_fashion_mnist(root=tmp_path)


def test_missing_fashion_falls_back_to_digits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(DatasetNotFoundError, match="apt-get install dataset-fashion"):
        load_fashion_mnist(root=tmp_path)
    with caplog.at_level(logging.WARNING, logger="fedplat.data.datasets"):
        ds = load_dataset("fashion_mnist", root=tmp_path)
    assert ds.name == "digits"
    assert "apt-get install dataset-fashion-mnist" in caplog.text
    with pytest.raises(DatasetNotFoundError):
        load_dataset("fashion_mnist", root=tmp_path, fallback=False)


REAL_FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(
    not fashion_mnist_available(REAL_FASHION),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist() -> None:
    train = load_fashion_mnist("train", root=REAL_FASHION)
    test = load_fashion_mnist("test", root=REAL_FASHION)
    assert (len(train), len(test)) == (60000, 10000)
    assert train.x.shape == (60000, 1, 28, 28) and train.input_shape == (1, 28, 28)
    assert train.num_classes == 10
    assert float(train.x.min()) == 0.0 and float(train.x.max()) == 1.0
    # Fashion-MNIST is exactly balanced: 6,000 / 1,000 items per class.
    assert torch.bincount(train.y).tolist() == [6000] * 10
    assert torch.bincount(test.y).tolist() == [1000] * 10


# ------------------------------------------------------------------------ digits


def test_digits_split_is_stratified_and_deterministic() -> None:
    train, test = load_digits("train"), load_digits("test")
    assert len(train) + len(test) == 1797
    assert len(test) == 360
    assert train.input_shape == (1, 8, 8) and train.num_classes == 10
    assert float(train.x.min()) == 0.0 and float(train.x.max()) == 1.0
    # Stratified: every class keeps ~20% of its items in the test split.
    frac = torch.bincount(test.y, minlength=10) / (
        torch.bincount(test.y, minlength=10) + torch.bincount(train.y, minlength=10)
    )
    assert torch.all((frac - 0.2).abs() < 0.02)
    torch.testing.assert_close(load_digits("train").x, train.x)
    assert not torch.equal(load_digits("train", seed=1).y, train.y)


def test_load_dataset_errors() -> None:
    assert available_datasets() == ["digits", "fashion_mnist"]
    with pytest.raises(DatasetError, match=r"unknown dataset 'mnist'.*digits"):
        load_dataset("mnist")
    with pytest.raises(DatasetError, match="split must be one of"):
        load_dataset("digits", split="val")
    with pytest.raises(DatasetError, match="does not take"):
        load_dataset("digits", sed=1)
    with pytest.raises(DatasetError, match="test_fraction"):
        load_digits(test_fraction=1.5)


def test_dataset_validation_and_subset() -> None:
    ds = load_digits("test")
    sub = ds.subset(np.array([3, 1, 3]))
    assert len(sub) == 3 and sub.name == ds.name
    torch.testing.assert_close(sub.x[0], ds.x[3])
    assert sub.y.tolist() == [ds.y[3], ds.y[1], ds.y[3]]
    assert len(ds.subset(np.array([], dtype=np.int64))) == 0
    with pytest.raises(IndexError):
        ds.subset([len(ds)])
    with pytest.raises(IndexError):
        ds.subset([-1])
    assert "n=360" in repr(ds)
    with pytest.raises(DatasetError, match="float32"):
        Dataset(
            x=torch.zeros(2, 4),
            y=torch.zeros(2, dtype=torch.int64),
            name="t",
            num_classes=2,
        )
    with pytest.raises(DatasetError, match="labels"):
        Dataset(
            x=torch.zeros(2, 1, 2, 2), y=torch.tensor([0, 5]), name="t", num_classes=2
        )


# ------------------------------------------------------------------ partitioners


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    assert all(p.dtype == np.int64 for p in parts)
    allidx = np.concatenate(parts)
    assert allidx.size == n  # disjoint (no repeats) ...
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))  # ... and covering


def _label_entropy(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    ents = []
    for p in parts:
        counts = np.bincount(labels[p], minlength=int(labels.max()) + 1)
        q = counts[counts > 0] / counts.sum()
        ents.append(float(-(q * np.log(q)).sum()))
    return float(np.mean(ents))


LABELS = np.repeat(np.arange(10), 100)  # 1,000 items, 10 balanced classes


def test_iid_sizes_and_determinism() -> None:
    parts = iid(103, 10, seed=0)
    _assert_exact_cover(parts, 103)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(
        np.array_equal(a, b) for a, b in zip(parts, iid(103, 10, seed=0), strict=True)
    )
    assert not all(
        np.array_equal(a, b) for a, b in zip(parts, iid(103, 10, seed=1), strict=True)
    )


def test_dirichlet_skew_depends_on_alpha() -> None:
    skewed = dirichlet(LABELS, 10, alpha=0.1, seed=0, min_size=5)
    mixed = dirichlet(LABELS, 10, alpha=100.0, seed=0, min_size=5)
    for parts in (skewed, mixed):
        _assert_exact_cover(parts, LABELS.size)
        assert min(len(p) for p in parts) >= 5
    # log(10) = 2.30 is a perfectly mixed client.
    assert _label_entropy(LABELS, skewed) < 1.2 < 2.0 < _label_entropy(LABELS, mixed)
    again = dirichlet(LABELS, 10, alpha=0.1, seed=0, min_size=5)
    assert all(np.array_equal(a, b) for a, b in zip(skewed, again, strict=True))


def test_dirichlet_unbalanced_variant_and_errors() -> None:
    parts = dirichlet(LABELS, 5, alpha=0.5, seed=3, min_size=10, balance=False)
    _assert_exact_cover(parts, LABELS.size)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet(LABELS, 5, alpha=0.0, seed=0)
    with pytest.raises(ValueError, match="min_size"):
        dirichlet(LABELS, 10, alpha=1.0, seed=0, min_size=101)
    with pytest.raises(ValueError, match="n_clients"):
        dirichlet(LABELS, 0, alpha=1.0, seed=0)
    # Infeasible in practice: 100 clients, one class each at most, min_size 10.
    with pytest.raises(ValueError, match="no draw gave every one"):
        dirichlet(
            LABELS, 100, alpha=0.001, seed=0, min_size=10, balance=False, max_retries=5
        )


def test_shards_give_few_labels_per_client() -> None:
    parts = shards(LABELS, 20, shards_per_client=2, seed=0)
    _assert_exact_cover(parts, LABELS.size)
    assert all(len(p) == 50 for p in parts)
    # Each 50-item shard lies inside one 100-item class block.
    assert max(len(np.unique(LABELS[p])) for p in parts) <= 2
    with pytest.raises(ValueError, match="exceeds"):
        shards(LABELS, 600, shards_per_client=2, seed=0)


def test_label_sorted_is_contiguous() -> None:
    shuffled = np.random.default_rng(0).permutation(LABELS)
    parts = label_sorted(shuffled, 10)
    _assert_exact_cover(parts, LABELS.size)
    assert [np.unique(shuffled[p]).tolist() for p in parts] == [[k] for k in range(10)]
    with pytest.raises(ValueError, match="must not exceed"):
        label_sorted(LABELS[:3], 4)


def test_sized_counts_and_fractions() -> None:
    parts = sized(100, [10, 20, 30], seed=0)
    assert [len(p) for p in parts] == [10, 20, 30]
    assert np.unique(np.concatenate(parts)).size == 60
    parts = sized(101, [0.5, 0.3, 0.2], seed=0)
    assert sum(len(p) for p in parts) == 101
    _assert_exact_cover(parts, 101)
    assert [len(p) for p in sized(100, [0.5, 0.25], seed=0)] == [50, 25]
    with pytest.raises(ValueError, match="sum to"):
        sized(10, [6, 6], seed=0)
    with pytest.raises(ValueError, match="all ints"):
        sized(10, [1, 0.5], seed=0)
    with pytest.raises(ValueError, match="no items"):
        sized(10, [0.99, 0.01], seed=0)


def test_partition_dispatch() -> None:
    assert available_partitioners() == [
        "dirichlet",
        "iid",
        "label_sorted",
        "shards",
        "sized",
    ]
    ref = shards(LABELS, 10, 2, seed=4)
    got = partition("shards", LABELS, 10, seed=4, shards_per_client=2)
    assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True))
    _assert_exact_cover(
        partition("dirichlet", LABELS, 10, seed=0, alpha=1.0), LABELS.size
    )
    _assert_exact_cover(partition("label-sorted", LABELS, 10, seed=0), LABELS.size)
    _assert_exact_cover(partition("iid", LABELS, 7, seed=0), LABELS.size)
    with pytest.raises(ValueError, match=r"unknown partitioner 'pathological'"):
        partition("pathological", LABELS, 10, seed=0)
    with pytest.raises(ValueError, match="needs parameter"):
        partition("dirichlet", LABELS, 10, seed=0)
    with pytest.raises(ValueError, match=r"does not take \['alfa'\]"):
        partition("dirichlet", LABELS, 10, seed=0, alfa=0.5)
    with pytest.raises(ValueError, match="integers"):
        partition("iid", np.zeros(5), 2, seed=0)


@settings(max_examples=60, deadline=None)
@given(n_items=st.integers(1, 500), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_iid_property(n_items: int, data: st.DataObject, seed: int) -> None:
    n_clients = data.draw(st.integers(1, n_items))
    parts = iid(n_items, n_clients, seed)
    assert len(parts) == n_clients
    _assert_exact_cover(parts, n_items)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 9), min_size=1, max_size=300),
    data=st.data(),
    alpha=st.floats(0.05, 100.0),
    seed=st.integers(0, 2**32 - 1),
    balance=st.booleans(),
)
def test_dirichlet_property(
    labels: list[int], data: st.DataObject, alpha: float, seed: int, balance: bool
) -> None:
    y = np.asarray(labels)
    n_clients = data.draw(st.integers(1, min(20, y.size)))
    parts = dirichlet(y, n_clients, alpha, seed, min_size=0, balance=balance)
    assert len(parts) == n_clients
    _assert_exact_cover(parts, y.size)
