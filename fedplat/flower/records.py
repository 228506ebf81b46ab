"""Flower records <-> fedplat's flat float32 vectors and payload bytes.

A Flower model travels as an ``ArrayRecord`` of named ``Array`` objects (NumPy
``.npy`` bytes). fedplat's algorithms see one flat float32 vector ``[d]`` plus a
:class:`~fedplat.vectors.Layout`; this module is the one place that converts
between the two, and the one place that packs a compressed update
(:class:`~fedplat.compression.Payload` bytes) into a Flower record.

Arrays from a reply are hostile: :func:`arrays_to_vector` parses each ``.npy``
header itself and checks dtype, shape and byte count against the layout before
reading any data, so a header that declares a huge shape cannot make NumPy
allocate it. Nothing is ever unpickled.
"""

from __future__ import annotations

import functools
import io

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from fedplat.vectors import Layout, TensorSpec, unflatten

__all__ = [
    "NUMPY_STYPE",
    "PAYLOAD_STYPE",
    "UPDATE_KEY",
    "RecordError",
    "arrays_to_vector",
    "layout_of_arrays",
    "payload_bytes",
    "payload_record",
    "vector_to_arrays",
]

#: Flower's serialization type of ``Array(ndarray)`` (``SType.NUMPY``).
NUMPY_STYPE = "numpy.ndarray"
#: Serialization type of an Array that holds ``Payload.to_bytes()`` verbatim.
PAYLOAD_STYPE = "fedplat.payload.v1"
#: Key of that Array inside the reply's ArrayRecord.
UPDATE_KEY = "fedplat.update"

# Floating-point dtypes a Flower Array can hold (NumPy has no bfloat16).
_FLOAT_DTYPES = ("float16", "float32", "float64")
# np.save writes a header padded to a multiple of 64 bytes; version 1.0 headers
# are at most 65,535 bytes, but a model's header is ~128 bytes. More than this is
# not a real tensor header.
_MAX_NPY_HEADER = 4096


class RecordError(ValueError):
    """A Flower record does not match the model's layout; the message says why."""


def layout_of_arrays(arrays: ArrayRecord) -> Layout:
    """The layout of the floating-point arrays of ``arrays``, in record order.

    Integer arrays (e.g. BatchNorm's ``num_batches_tracked``) are counters, not
    parameters: they are left out, as :func:`fedplat.vectors.layout_of` does, and
    :func:`vector_to_arrays` carries them over from a template.
    """
    specs = []
    for name, arr in arrays.items():
        if arr.dtype not in _FLOAT_DTYPES:
            continue
        specs.append(TensorSpec(name, tuple(int(s) for s in arr.shape), arr.dtype))
    return Layout(tuple(specs))


@functools.lru_cache(maxsize=1024)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The exact header ``np.save`` writes for a C-ordered little-endian array."""
    buf = io.BytesIO()
    descr = np.dtype(dtype).newbyteorder("<").str
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def _read_npy(arr: Array, spec: TensorSpec) -> np.ndarray:
    """The ``.npy`` bytes of ``arr`` as a flat array, checked against ``spec``.

    Bytes that start with exactly the header ``np.save`` writes for ``spec``
    (what Flower's ``Array(ndarray)`` holds) skip parsing it: byte equality
    already says dtype, order and shape are the expected ones. Anything else is
    parsed and checked field by field.
    """
    if arr.stype != NUMPY_STYPE:
        raise RecordError(f"array {spec.name!r}: serialization {arr.stype!r}")
    if arr.dtype != spec.dtype or tuple(arr.shape) != spec.shape:
        raise RecordError(
            f"array {spec.name!r} is {arr.dtype}{list(arr.shape)}, "
            f"expected {spec.dtype}{list(spec.shape)}"
        )
    dtype = np.dtype(spec.dtype)
    body = spec.numel * dtype.itemsize
    data = arr.data
    expected = _npy_header(spec.dtype, spec.shape)
    if len(data) == len(expected) + body and data.startswith(expected):
        return np.frombuffer(data, dtype=dtype.newbyteorder("<"), offset=len(expected))
    if not body <= len(data) <= body + _MAX_NPY_HEADER:
        raise RecordError(f"array {spec.name!r}: {len(data)} bytes for {body}")
    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            shape, fortran, declared = np.lib.format.read_array_header_1_0(buf)
        elif version == (2, 0):
            shape, fortran, declared = np.lib.format.read_array_header_2_0(buf)
        else:
            raise RecordError(f"array {spec.name!r}: npy version {version}")
    except ValueError as exc:
        raise RecordError(f"array {spec.name!r}: bad npy header: {exc}") from exc
    if tuple(shape) != spec.shape or fortran or declared != dtype.newbyteorder("<"):
        raise RecordError(
            f"array {spec.name!r}: npy header says {declared}{list(shape)}"
            f"{' (Fortran order)' if fortran else ''}"
        )
    offset = buf.tell()
    if len(data) - offset != body:
        raise RecordError(f"array {spec.name!r}: {len(data) - offset} data bytes")
    return np.frombuffer(data, dtype=declared, count=spec.numel, offset=offset)


def arrays_to_vector(
    arrays: ArrayRecord,
    layout: Layout,
    out: torch.Tensor | None = None,
    minus: torch.Tensor | None = None,
) -> torch.Tensor:
    """Concatenate the arrays named by ``layout`` into one float32 vector ``[d]``.

    ``out`` (e.g. a row of the round's stack) receives the result when given;
    ``minus`` ``[d]`` is subtracted on the way, so a client's update
    ``new - global`` is written in one pass over its bytes.

    Raises
    ------
    RecordError
        A missing or extra floating-point array, a wrong dtype, shape, header or
        byte count.
    """
    names = set(layout.names)
    extra = sorted(
        k for k, a in arrays.items() if a.dtype in _FLOAT_DTYPES and k not in names
    )
    if extra:
        raise RecordError(f"unexpected arrays {extra[:5]}")
    if out is None:
        out = torch.empty(layout.numel, dtype=torch.float32)
    elif out.shape != (layout.numel,) or out.dtype != torch.float32:
        raise RecordError(f"out must be float32 [{layout.numel}]")
    view = out.numpy()  # shares memory: NumPy casts straight into the vector
    base = None if minus is None else minus.numpy()
    for spec, (a, b) in zip(layout.specs, layout.offsets(), strict=True):
        if spec.name not in arrays:
            raise RecordError(f"array {spec.name!r} is missing")
        flat = _read_npy(arrays[spec.name], spec)
        if base is None:
            view[a:b] = flat
        else:
            np.subtract(flat, base[a:b], out=view[a:b], casting="unsafe")
    return out


def vector_to_arrays(
    vec: torch.Tensor, layout: Layout, template: ArrayRecord
) -> ArrayRecord:
    """A new ArrayRecord in ``template``'s key order: the floating-point arrays
    from ``vec`` ``[d]`` (original dtypes), the others copied from ``template``."""
    tensors = unflatten(vec, layout)
    out = ArrayRecord()
    for name, arr in template.items():
        if name in tensors:
            out[name] = Array(np.ascontiguousarray(tensors[name].numpy()))
        else:
            out[name] = arr
    return out


def payload_record(data: bytes) -> ArrayRecord:
    """An ArrayRecord carrying ``Payload.to_bytes()`` as one opaque byte array."""
    return ArrayRecord(
        {
            UPDATE_KEY: Array(
                dtype="uint8", shape=(len(data),), stype=PAYLOAD_STYPE, data=data
            )
        }
    )


def payload_bytes(arrays: ArrayRecord) -> bytes | None:
    """The payload bytes of a :func:`payload_record`, or ``None`` for a record of
    model arrays."""
    arr = arrays.get(UPDATE_KEY)
    if arr is None:
        return None
    if len(arrays) != 1 or arr.stype != PAYLOAD_STYPE:
        raise RecordError(
            f"{UPDATE_KEY!r} must be the only array, serialized as {PAYLOAD_STYPE!r}"
        )
    return arr.data
