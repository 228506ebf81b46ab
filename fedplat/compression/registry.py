"""Explicit compressor registry: ``register_compressor`` / ``create_compressor``.

A :class:`fedplat.registry.Registry`: parameters are checked against the
factory's signature before it runs, so a misspelled key in a run config fails
loudly with the list of valid keys instead of being dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedplat.compression.base import CompressionError, Compressor
from fedplat.compression.basic import FP16, Identity, TopK
from fedplat.compression.dgc import DEFAULT_MIN_SPARSE_NUMEL, DGC
from fedplat.compression.sketch import AMSSketch, CountSketch, GaussianSketch
from fedplat.registry import Registry, accepted_params
from fedplat.vectors import Layout

__all__ = [
    "CompressorFactory",
    "available_compressors",
    "create_compressor",
    "register_compressor",
]

CompressorFactory = Callable[..., Compressor]

_REGISTRY: Registry[Compressor] = Registry("compressor", CompressionError)


def register_compressor(name: str, factory: CompressorFactory) -> None:
    """Add a compressor under ``name``; registering a name twice is an error."""
    _REGISTRY.register(name, factory)


def available_compressors() -> list[str]:
    return _REGISTRY.available()


def create_compressor(
    name: str, /, *, layout: Layout | None = None, **params: Any
) -> Compressor:
    """Build a registered compressor.

    ``layout`` is the model's tensor layout, context rather than a setting: it is
    handed to every factory that declares a ``layout`` parameter (DGC, which
    like the paper's code sparsifies only tensors with more than one dimension),
    including the inner compressor of a wrapper such as ``fp16``, unless
    ``params`` sets ``layout`` itself.

    Raises
    ------
    CompressionError
        Unknown name (lists the registered ones), unknown parameter (names it
        and lists the valid ones), or a value the compressor rejects.
    """
    takes_layout = "layout" in (accepted_params(_REGISTRY.get(name)) or [])
    if layout is not None and "layout" not in params and takes_layout:
        params["layout"] = layout
    return _REGISTRY.create(name, **params)


def _fp16(
    inner: str,
    inner_params: Mapping[str, Any] | None = None,
    layout: Layout | Mapping[str, Any] | None = None,
) -> Compressor:
    """``fp16`` wrapper: ``create_compressor("fp16", inner="topk",
    inner_params={"ratio": 0.01})``; ``layout`` is passed on to the inner one."""
    if isinstance(layout, Mapping):
        layout = Layout.from_dict(layout)
    return FP16(create_compressor(inner, layout=layout, **dict(inner_params or {})))


def _dgc(
    ratio: float = 0.001,
    *,
    momentum: float = 0.9,
    nesterov: bool = False,
    clip_norm: float | None = None,
    momentum_correction: bool = True,
    momentum_masking: bool = True,
    warmup_densities: list[float] | tuple[float, ...] | None = None,
    warmup_steps_per_stage: int = 1,
    sample_ratio: float = 0.01,
    upper_bound: float = 1.3,
    lower_bound: float = 0.8,
    max_passes: int = 10,
    layout: Layout | Mapping[str, Any] | None = None,
    seed: int = 0,
    min_sparse_numel: int = DEFAULT_MIN_SPARSE_NUMEL,
) -> Compressor:
    """DGC from config values: ``layout`` may be ``Layout.to_dict()`` output."""
    if isinstance(layout, Mapping):
        layout = Layout.from_dict(layout)
    extra: dict[str, Any] = {}
    if warmup_densities is not None:
        extra["warmup_densities"] = tuple(warmup_densities)
    return DGC(
        ratio,
        momentum=momentum,
        nesterov=nesterov,
        clip_norm=clip_norm,
        momentum_correction=momentum_correction,
        momentum_masking=momentum_masking,
        warmup_steps_per_stage=warmup_steps_per_stage,
        sample_ratio=sample_ratio,
        upper_bound=upper_bound,
        lower_bound=lower_bound,
        max_passes=max_passes,
        layout=layout,
        seed=seed,
        min_sparse_numel=min_sparse_numel,
        **extra,
    )


register_compressor("identity", Identity)
register_compressor("fp16", _fp16)
register_compressor("topk", TopK)
register_compressor("dgc", _dgc)
register_compressor("countsketch", CountSketch)
register_compressor("gaussian_sketch", GaussianSketch)
register_compressor("ams_sketch", AMSSketch)
