"""Image classification datasets as in-memory tensors.

Every loader returns a :class:`Dataset` holding the whole split as two tensors:
``x`` (``float32 [N, C, H, W]``, scaled to ``[0, 1]``) and ``y`` (``int64 [N]``).
The datasets used here are small (Fashion-MNIST is 188 MB as ``float32``), so
holding them in memory and indexing them directly is much faster on CPU than a
``DataLoader`` and keeps client subsets cheap views of one array.

Sources (both work offline):

* Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (gzipped IDX
  files under ``/usr/share/datasets/fashion-mnist``);
* scikit-learn's bundled ``load_digits`` (1,797 8x8 images), for fast tests.
"""

from __future__ import annotations

import functools
import gzip
import inspect
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedplat.registry import Registry

logger = logging.getLogger(__name__)

FASHION_MNIST_DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_ENV_VAR = "FEDPLAT_FASHION_MNIST_DIR"
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
SPLITS = ("train", "test")

# IDX type codes (third byte of the magic number) -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES = {dt: code for code, dt in _IDX_DTYPES.items()}


class DatasetError(ValueError):
    """A dataset is malformed, unknown, or asked for with invalid arguments."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """The files of a dataset are not installed (catchable as FileNotFoundError)."""


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no boolean equality
class Dataset:
    """One split of a classification dataset, held in memory.

    Attributes
    ----------
    x : torch.Tensor
        ``float32 [N, C, H, W]`` inputs, values in ``[0, 1]``.
    y : torch.Tensor
        ``int64 [N]`` labels in ``[0, num_classes)``.
    name : str
        Dataset name, e.g. ``"fashion_mnist"`` or ``"digits"``.
    num_classes : int
        Number of classes (labels of a subset may cover fewer).
    """

    x: torch.Tensor
    y: torch.Tensor
    name: str
    num_classes: int

    def __post_init__(self) -> None:
        if self.x.dim() != 4 or self.x.dtype != torch.float32:
            raise DatasetError(
                f"Dataset {self.name!r}: x must be float32 [N, C, H, W], got "
                f"{self.x.dtype} {tuple(self.x.shape)}"
            )
        if self.y.dim() != 1 or self.y.dtype != torch.int64:
            raise DatasetError(
                f"Dataset {self.name!r}: y must be int64 [N], got "
                f"{self.y.dtype} {tuple(self.y.shape)}"
            )
        if self.x.shape[0] != self.y.shape[0]:
            raise DatasetError(
                f"Dataset {self.name!r}: {self.x.shape[0]} inputs but "
                f"{self.y.shape[0]} labels"
            )
        if self.num_classes < 1:
            raise DatasetError(f"Dataset {self.name!r}: num_classes must be >= 1")
        if self.y.numel() and (
            int(self.y.min()) < 0 or int(self.y.max()) >= self.num_classes
        ):
            raise DatasetError(
                f"Dataset {self.name!r}: labels must lie in [0, {self.num_classes})"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input, ``(C, H, W)``."""
        return tuple(int(s) for s in self.x.shape[1:])

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, n={len(self)}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes})"
        )

    def subset(self, indices: np.ndarray | torch.Tensor | Sequence[int]) -> Dataset:
        """Return the items at ``indices`` (any order, repeats allowed).

        Parameters
        ----------
        indices : array-like of int, shape ``[M]``
            Non-negative positions in ``[0, len(self))``.

        Returns
        -------
        Dataset
            ``x`` of shape ``[M, C, H, W]`` and ``y`` of shape ``[M]`` (copies).

        Raises
        ------
        IndexError
            If an index is negative or ``>= len(self)``.
        """
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64).reshape(-1))
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= len(self)):
            raise IndexError(
                f"subset indices must lie in [0, {len(self)}), got range "
                f"[{int(idx.min())}, {int(idx.max())}]"
            )
        return Dataset(
            x=self.x[idx], y=self.y[idx], name=self.name, num_classes=self.num_classes
        )


# --------------------------------------------------------------------------- IDX


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Parse the bytes of an (uncompressed) IDX file.

    The format (LeCun's MNIST page): two zero bytes, a type code, the number of
    dimensions ``k``, then ``k`` big-endian ``uint32`` sizes, then the values in
    row-major order.

    Parameters
    ----------
    data : bytes
        Raw file contents.
    source : str
        Name used in error messages.

    Returns
    -------
    np.ndarray
        Array of the declared shape, native byte order, read-only.

    Raises
    ------
    DatasetError
        On a bad magic number, unknown type code, or a size mismatch.
    """
    if len(data) < 4:
        raise DatasetError(f"{source}: too short for an IDX header ({len(data)} B)")
    if data[0] != 0 or data[1] != 0:
        raise DatasetError(
            f"{source}: bad IDX magic number 0x{data[:4].hex()} "
            "(the first two bytes must be zero)"
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise DatasetError(f"{source}: unknown IDX type code 0x{code:02x}")
    if ndim == 0:
        raise DatasetError(f"{source}: IDX file declares zero dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{source}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header
    if actual != expected:
        raise DatasetError(
            f"{source}: IDX payload is {actual} B but dims {dims} of "
            f"{dtype.name} need {expected} B (truncated or corrupt file)"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    arr = arr.astype(dtype.newbyteorder("="), copy=False)
    arr.setflags(write=False)  # shared through the cache: nobody may mutate it
    return arr


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file, gzipped (``.gz``) or not; cached per process.

    The cache key is the resolved path plus its size and modification time, so
    a rewritten file is read again.

    Returns
    -------
    np.ndarray
        Read-only array of the declared shape (copy it before mutating).

    Raises
    ------
    DatasetNotFoundError
        If the file does not exist.
    DatasetError
        If it is not a valid (gzipped) IDX file.
    """
    p = Path(path).resolve()
    try:
        st = p.stat()
    except FileNotFoundError as exc:
        raise DatasetNotFoundError(f"IDX file not found: {p}") from exc
    return _read_idx_cached(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_idx_cached(path: str, size: int, mtime_ns: int) -> np.ndarray:
    del size, mtime_ns  # only part of the cache key
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = Path(path).read_bytes()
    except (OSError, EOFError) as exc:  # gzip raises these on corrupt streams
        raise DatasetError(f"{path}: cannot read: {exc}") from exc
    return parse_idx(raw, source=path)


def write_idx(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzipped if ``path`` ends in ``.gz``).

    Supported dtypes: uint8, int8, int16, int32, float32, float64.
    """
    arr = np.asarray(array)
    if arr.ndim == 0 or arr.ndim > 255:
        raise DatasetError(f"IDX needs 1..255 dimensions, got {arr.ndim}")
    big = arr.dtype.newbyteorder(">")
    if big not in _IDX_CODES:
        raise DatasetError(f"dtype {arr.dtype} has no IDX type code")
    header = bytes([0, 0, _IDX_CODES[big], arr.ndim])
    header += np.asarray(arr.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(arr, dtype=big).tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(payload)
    else:
        Path(path).write_bytes(payload)


# ------------------------------------------------------------------ Fashion-MNIST


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise DatasetError(f"split must be one of {list(SPLITS)}, got {split!r}")
    return split


def fashion_mnist_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """Directory searched for Fashion-MNIST.

    ``root`` if given, else ``$FEDPLAT_FASHION_MNIST_DIR``, else
    ``/usr/share/datasets/fashion-mnist`` (Debian ``dataset-fashion-mnist``).
    """
    if root is not None:
        return Path(root)
    return Path(os.environ.get(FASHION_MNIST_ENV_VAR) or FASHION_MNIST_DEFAULT_DIR)


def _fashion_files(
    split: str, root: str | os.PathLike[str] | None
) -> tuple[Path, Path]:
    prefix = "train" if _check_split(split) == "train" else "t10k"
    d = fashion_mnist_dir(root)
    return (d / f"{prefix}-images-idx3-ubyte.gz", d / f"{prefix}-labels-idx1-ubyte.gz")


def fashion_mnist_available(root: str | os.PathLike[str] | None = None) -> bool:
    """Whether both Fashion-MNIST splits are present under :func:`fashion_mnist_dir`."""
    return all(p.is_file() for s in SPLITS for p in _fashion_files(s, root))


def load_fashion_mnist(
    split: str = "train", root: str | os.PathLike[str] | None = None
) -> Dataset:
    """Load Fashion-MNIST (Xiao et al. 2017) from gzipped IDX files.

    Parameters
    ----------
    split : {"train", "test"}
        60,000 training or 10,000 test images.
    root : path, optional
        Directory holding ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``;
        see :func:`fashion_mnist_dir` for the default.

    Returns
    -------
    Dataset
        ``x`` float32 ``[N, 1, 28, 28]`` in ``[0, 1]``, ``y`` int64 ``[N]``,
        10 classes (names in ``FASHION_MNIST_CLASSES``).

    Raises
    ------
    DatasetNotFoundError
        If the files are missing (install ``dataset-fashion-mnist``).
    DatasetError
        If a file is malformed or the images and labels disagree.
    """
    img_path, lbl_path = _fashion_files(split, root)
    for p in (img_path, lbl_path):
        if not p.is_file():
            raise DatasetNotFoundError(
                f"Fashion-MNIST file {p} not found; install it with "
                f"`apt-get install {FASHION_MNIST_PACKAGE}` or point "
                f"${FASHION_MNIST_ENV_VAR} at a directory holding the IDX files"
            )
    images = read_idx(img_path)
    labels = read_idx(lbl_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28) or images.dtype != np.uint8:
        raise DatasetError(
            f"{img_path}: expected uint8 images [N, 28, 28], got "
            f"{images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise DatasetError(
            f"{lbl_path}: expected uint8 labels [N], got {labels.dtype} {labels.shape}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(
            f"{img_path.parent}: {images.shape[0]} images but {labels.shape[0]} labels"
        )
    if labels.size and int(labels.max()) >= len(FASHION_MNIST_CLASSES):
        raise DatasetError(f"{lbl_path}: label {int(labels.max())} out of range 0..9")
    x_np = images.astype(np.float32)  # one 188 MB copy, then scaled in place
    x_np /= np.float32(255.0)
    x = torch.from_numpy(x_np.reshape(-1, 1, 28, 28))
    y = torch.from_numpy(labels.astype(np.int64))
    return Dataset(
        x=x, y=y, name="fashion_mnist", num_classes=len(FASHION_MNIST_CLASSES)
    )


# ------------------------------------------------------------------------ digits


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits as _load  # heavy import, only on use

    bunch = _load()
    images = np.asarray(bunch.images, dtype=np.float32)
    target = np.asarray(bunch.target, dtype=np.int64)
    images.setflags(write=False)
    target.setflags(write=False)
    return images, target


def load_digits(
    split: str = "train", seed: int = 0, test_fraction: float = 0.2
) -> Dataset:
    """Load scikit-learn's bundled handwritten digits (UCI, 1,797 images).

    The train/test split is stratified by label and deterministic given ``seed``.

    Parameters
    ----------
    split : {"train", "test"}
    seed : int
        ``random_state`` of the split.
    test_fraction : float
        Fraction of items in the test split, in ``(0, 1)``.

    Returns
    -------
    Dataset
        ``x`` float32 ``[N, 1, 8, 8]`` in ``[0, 1]`` (raw values 0..16 / 16),
        ``y`` int64 ``[N]``, 10 classes.
    """
    from sklearn.model_selection import train_test_split

    _check_split(split)
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in (0, 1), got {test_fraction}")
    images, target = _sklearn_digits()
    train_idx, test_idx = train_test_split(
        np.arange(len(target)),
        test_size=test_fraction,
        stratify=target,
        random_state=seed,
    )
    idx = np.sort(train_idx if split == "train" else test_idx)
    x = torch.from_numpy(images[idx][:, None] / np.float32(16.0))
    y = torch.from_numpy(target[idx].copy())
    return Dataset(x=x, y=y, name="digits", num_classes=10)


# ---------------------------------------------------------------------- registry

_LOADERS: Registry[Dataset] = Registry("dataset", DatasetError)
_LOADERS.register("fashion_mnist", load_fashion_mnist)
_LOADERS.register("digits", load_digits)


def available_datasets() -> list[str]:
    """Canonical names accepted by :func:`load_dataset` (whether installed or not)."""
    return _LOADERS.available()


def load_dataset(
    name: str, split: str = "train", *, fallback: bool = True, **kw: Any
) -> Dataset:
    """Load a dataset split by name.

    Parameters
    ----------
    name : str
        ``"fashion_mnist"`` (alias ``"fashion-mnist"``) or ``"digits"``.
    split : {"train", "test"}
    fallback : bool
        If Fashion-MNIST is not installed, log a warning and return ``digits``
        instead (check ``Dataset.name``). With ``False`` the error propagates.
    **kw
        Passed to the loader (``root`` for Fashion-MNIST; ``seed``,
        ``test_fraction`` for digits). Fashion-only keywords are dropped when
        falling back.

    Raises
    ------
    DatasetError
        Unknown name, invalid split or keywords, or (``fallback=False``) missing
        files (:class:`DatasetNotFoundError`).
    """
    key = name.replace("-", "_")  # "fashion-mnist" is accepted too
    loader = _LOADERS.get(key)
    _check_split(split)
    accepted = set(inspect.signature(loader).parameters) - {"split"}
    unknown = sorted(set(kw) - accepted)
    if unknown:  # never drop a misspelled keyword silently
        raise DatasetError(
            f"dataset {key!r} does not take {unknown}; it accepts {sorted(accepted)}"
        )
    try:
        return loader(split=split, **kw)
    except DatasetNotFoundError as exc:
        if key != "fashion_mnist" or not fallback:
            raise
        logger.warning(
            "Fashion-MNIST is not installed (%s). Install it with "
            "`apt-get install %s`. Falling back to scikit-learn digits.",
            exc,
            FASHION_MNIST_PACKAGE,
        )
        digits_kw = {k: v for k, v in kw.items() if k in ("seed", "test_fraction")}
        return load_digits(split=split, **digits_kw)
