"""Flower records <-> flat vectors: exact round trips, hostile arrays refused."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedplat.flower.records import (
    PAYLOAD_STYPE,
    UPDATE_KEY,
    RecordError,
    arrays_to_vector,
    layout_of_arrays,
    payload_bytes,
    payload_record,
    vector_to_arrays,
)


def _model() -> ArrayRecord:
    return ArrayRecord(
        {
            "w": Array(np.arange(6, dtype=np.float32).reshape(2, 3)),
            "steps": Array(np.array(7, dtype=np.int64)),
            "b": Array(np.array([0.5, -1.0], dtype=np.float64)),
        }
    )


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def test_float_arrays_flatten_in_record_order_and_come_back() -> None:
    rec = _model()
    layout = layout_of_arrays(rec)
    assert layout.names == ["w", "b"]  # the int counter is not a parameter
    assert [s.dtype for s in layout.specs] == ["float32", "float64"]
    vec = arrays_to_vector(rec, layout)
    assert vec.tolist() == [0, 1, 2, 3, 4, 5, 0.5, -1.0]
    back = vector_to_arrays(vec + 1, layout, rec)
    assert list(back.keys()) == ["w", "steps", "b"]
    assert back["w"].numpy().tolist() == [[1, 2, 3], [4, 5, 6]]
    assert back["b"].numpy().dtype == np.float64
    assert back["b"].numpy().tolist() == [1.5, 0.0]
    assert back["steps"].numpy() == 7  # carried over from the template


def test_reply_arrays_must_match_the_layout() -> None:
    layout = layout_of_arrays(_model())
    wrong_shape = _model()
    wrong_shape["w"] = Array(np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(RecordError, match="expected float32"):
        arrays_to_vector(wrong_shape, layout)
    missing = _model()
    del missing["b"]
    with pytest.raises(RecordError, match="'b' is missing"):
        arrays_to_vector(missing, layout)
    extra = _model()
    extra["x"] = Array(np.zeros(2, dtype=np.float32))
    with pytest.raises(RecordError, match="unexpected arrays"):
        arrays_to_vector(extra, layout)


def test_a_lying_npy_header_is_refused_before_any_allocation() -> None:
    layout = layout_of_arrays(_model())
    rec = _model()
    # The Array's metadata says [2, 3] but the .npy header says [2, 3e9]:
    # np.load would allocate 24 GB before noticing the data is 24 bytes.
    buf = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": (2, 3_000_000_000)}
    np.lib.format.write_array_header_1_0(buf, header)
    forged = buf.getvalue() + np.zeros(6, dtype=np.float32).tobytes()
    rec["w"] = Array(dtype="float32", shape=(2, 3), stype="numpy.ndarray", data=forged)
    with pytest.raises(RecordError, match=r"header says float32\[2, 3000000000\]"):
        arrays_to_vector(rec, layout)


@pytest.mark.parametrize(
    "data",
    [
        _npy(np.zeros((2, 3), dtype=np.float32)) + b"\x00" * 4,  # trailing bytes
        _npy(np.zeros((2, 3), dtype=np.float32))[:-4],  # truncated
        _npy(np.asfortranarray(np.zeros((2, 3), dtype=np.float32))),
        _npy(np.zeros((2, 3), dtype=">f4")),  # big-endian
        _npy(np.zeros((3, 2), dtype=np.float32)),  # shape disagrees with metadata
        b"not an npy file at all, but long enough to pass the size check",
    ],
)
def test_malformed_npy_bytes_are_refused(data: bytes) -> None:
    layout = layout_of_arrays(_model())
    rec = _model()
    rec["w"] = Array(dtype="float32", shape=(2, 3), stype="numpy.ndarray", data=data)
    with pytest.raises(RecordError):
        arrays_to_vector(rec, layout)


def test_foreign_serialization_is_refused() -> None:
    layout = layout_of_arrays(_model())
    rec = _model()
    rec["w"] = Array(dtype="float32", shape=(2, 3), stype="pickle", data=rec["w"].data)
    with pytest.raises(RecordError, match="serialization 'pickle'"):
        arrays_to_vector(rec, layout)


def test_payload_bytes_travel_verbatim() -> None:
    rec = payload_record(b"FPW1-bytes")
    arr = rec[UPDATE_KEY]
    assert (arr.stype, arr.dtype, arr.shape) == (PAYLOAD_STYPE, "uint8", (10,))
    assert payload_bytes(rec) == b"FPW1-bytes"
    assert payload_bytes(_model()) is None
    mixed = payload_record(b"x")
    mixed["w"] = Array(np.zeros(1, dtype=np.float32))
    with pytest.raises(RecordError, match="only array"):
        payload_bytes(mixed)


def test_vector_round_trip_is_exact_for_float32() -> None:
    g = torch.Generator().manual_seed(0)
    rec = ArrayRecord(
        {
            "a": Array(torch.randn(4, 5, generator=g).numpy()),
            "b": Array(torch.randn(5, generator=g).numpy()),
        }
    )
    layout = layout_of_arrays(rec)
    vec = arrays_to_vector(rec, layout)
    again = arrays_to_vector(vector_to_arrays(vec, layout, rec), layout)
    assert torch.equal(vec, again)
