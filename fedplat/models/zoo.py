"""Small reference models and an explicit model registry.

A model factory is any callable ``factory(input_shape, num_classes, **params)``
returning an ``nn.Module`` that maps ``float32 [B, *input_shape]`` to logits
``float32 [B, num_classes]``. The classes below are factories themselves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedplat.registry import Registry, accepted_params

ModelFactory = Callable[..., nn.Module]


class ModelSpecError(ValueError):
    """A model name or import path cannot be resolved, or its parameters are bad."""


def _check_common(input_shape: Sequence[int], num_classes: int) -> tuple[int, ...]:
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"input_shape must be non-empty positive ints, got {shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return shape


class MLP(nn.Module):
    """Fully connected network: flatten -> (Linear -> ReLU) * k -> Linear.

    The default ``hidden=(200, 200)`` is the "2NN" of McMahan et al. 2017.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one input, e.g. ``(1, 28, 28)``.
    num_classes : int
    hidden : tuple of int
        Widths of the hidden layers (may be empty: then this is a linear model).

    Notes
    -----
    ``forward``: ``float32 [B, *input_shape]`` -> logits ``float32 [B, num_classes]``.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden: Sequence[int] = (200, 200),
    ) -> None:
        super().__init__()
        shape = _check_common(input_shape, num_classes)
        widths = [math.prod(shape), *(int(h) for h in hidden)]
        if any(w < 1 for w in widths[1:]):
            raise ValueError(f"hidden widths must be >= 1, got {tuple(hidden)}")
        layers: list[nn.Module] = [nn.Flatten()]
        for w_in, w_out in itertools.pairwise(widths):
            layers += [nn.Linear(w_in, w_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.net = nn.Sequential(*layers)
        self.input_shape = shape
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: flatten -> Linear (softmax in the loss).

    ``forward``: ``float32 [B, *input_shape]`` -> logits ``float32 [B, num_classes]``.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        shape = _check_common(input_shape, num_classes)
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(math.prod(shape), num_classes)
        self.input_shape = shape
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.flatten(x))


class CNN(nn.Module):
    """Two conv blocks and a two-layer head (after McMahan et al. 2017's CNN).

    ``[conv kxk (same padding) -> ReLU -> maxpool 2x2] * 2 -> flatten ->
    Linear(hidden) -> ReLU -> Linear(num_classes)``. Same padding keeps the
    spatial size until pooling, so 8x8 digits become 2x2 and 28x28
    Fashion-MNIST 7x7 before the head.

    Parameters
    ----------
    input_shape : tuple of int
        ``(C, H, W)`` with ``H, W >= 4``.
    num_classes : int
    channels : tuple of two ints
        Output channels of the two conv layers.
    hidden : int
        Width of the hidden linear layer.
    kernel_size : int
        Odd conv kernel size (3 or 5 are typical).

    Notes
    -----
    ``forward``: ``float32 [B, C, H, W]`` -> logits ``float32 [B, num_classes]``.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (32, 64),
        hidden: int = 128,
        kernel_size: int = 5,
    ) -> None:
        super().__init__()
        shape = _check_common(input_shape, num_classes)
        if len(shape) != 3:
            raise ValueError(f"CNN needs input_shape (C, H, W), got {shape}")
        c, h, w = shape
        if h < 4 or w < 4:
            raise ValueError(f"CNN needs H, W >= 4 (two 2x2 poolings), got {h}x{w}")
        ch = tuple(int(v) for v in channels)
        if len(ch) != 2 or min(ch) < 1:
            raise ValueError(f"channels must be two ints >= 1, got {tuple(channels)}")
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and >= 1, got {kernel_size}")
        pad = kernel_size // 2
        self.features = nn.Sequential(
            nn.Conv2d(c, ch[0], kernel_size, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(ch[0], ch[1], kernel_size, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = ch[1] * (h // 4) * (w // 4)  # each MaxPool2d(2) floors H and W by 2
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
        self.input_shape = shape
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# ---------------------------------------------------------------------- registry

_REGISTRY: Registry[nn.Module] = Registry("model", ModelSpecError, imports=True)


def register_model(name: str, factory: ModelFactory) -> None:
    """Register ``factory`` under ``name``.

    Raises
    ------
    ModelSpecError
        If ``name`` is empty, contains ``":"`` (reserved for import paths), or is
        already registered.
    TypeError
        If ``factory`` is not callable.
    """
    if not callable(factory):
        raise TypeError(f"factory for model {name!r} is not callable: {factory!r}")
    _REGISTRY.register(name, factory)


def available_models() -> list[str]:
    """Registered model names."""
    return _REGISTRY.available()


def resolve_model_factory(spec: str) -> ModelFactory:
    """Return the factory for a registered name or a ``"package.module:attr"`` path.

    ``attr`` may be dotted (``"pkg.mod:Outer.make"``). The module is imported
    with :func:`importlib.import_module`; nothing is registered as a side effect.

    Raises
    ------
    ModelSpecError
        (a ``ValueError``) for an unknown name, an unimportable module, a
        missing attribute, or an attribute that is not callable.
    """
    return _REGISTRY.get(spec)


def _check_params(factory: ModelFactory, spec: str, params: dict[str, Any]) -> None:
    """Reject keywords the factory does not take (no silent typos)."""
    names = accepted_params(factory)
    if names is None:
        return
    accepted = set(names) - {"input_shape", "num_classes"}
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ModelSpecError(
            f"model {spec!r} does not take {unknown}; it accepts {sorted(accepted)}"
        )


def create_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int | None = None,
    **params: Any,
) -> nn.Module:
    """Build a model by registered name or import path.

    Parameters
    ----------
    name : str
        A name from :func:`available_models` or ``"package.module:factory"``.
    input_shape : tuple of int
        Shape of one input, e.g. ``(1, 28, 28)``.
    num_classes : int
    seed : int, optional
        Seed for parameter initialisation. The global torch RNG state is forked
        and restored, so seeding here does not disturb the caller's stream.
    **params
        Model-specific keyword arguments (e.g. ``hidden=(64,)`` for ``"mlp"``).

    Returns
    -------
    nn.Module
        Maps ``float32 [B, *input_shape]`` to logits ``[B, num_classes]``.

    Raises
    ------
    ModelSpecError
        (a ``ValueError``) for an unknown name or an unknown keyword.
    TypeError
        If the factory does not return an ``nn.Module``.
    """
    factory = resolve_model_factory(name)
    _check_params(factory, name, params)
    shape = tuple(int(s) for s in input_shape)
    return _seeded_build(name, factory, seed, shape, num_classes, **params)


def build_from_factory(
    spec: str,
    params: dict[str, Any] | None = None,
    *,
    seed: int | None = None,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
) -> nn.Module:
    """Build an app's model from its factory ``"package.module:fn"``.

    The public plug-in of run files (``model.factory``): ``fn(**params)``, with
    ``input_shape`` and ``num_classes`` added when ``fn``'s signature names them
    (and ``params`` does not set them).

    Raises
    ------
    ModelSpecError
        Unimportable path, a keyword ``fn`` does not take, a declared
        ``input_shape``/``num_classes`` that nobody can supply, or a result that
        is not an ``nn.Module``.
    """
    factory = resolve_model_factory(spec)
    kwargs = dict(params or {})
    names = accepted_params(factory)
    if names is not None:
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise ModelSpecError(
                f"model factory {spec!r} does not take {unknown}; it accepts {names}"
            )
    context: dict[str, Any] = {"input_shape": input_shape, "num_classes": num_classes}
    for key, value in context.items():
        if names is None or key not in names or key in kwargs:
            continue
        if value is None:
            raise ModelSpecError(
                f"model factory {spec!r} takes {key}: set model.{key} in the run file"
            )
        kwargs[key] = tuple(int(s) for s in value) if key == "input_shape" else value
    return _seeded_build(spec, factory, seed, **kwargs)


def _seeded_build(
    name: str, factory: ModelFactory, seed: int | None, *args: Any, **kwargs: Any
) -> nn.Module:
    """``factory(*args, **kwargs)`` with the CPU RNG seeded by ``seed`` (forked and
    restored, so the caller's stream is not disturbed), checked to be a module."""
    if seed is None:
        model = factory(*args, **kwargs)
    else:
        # devices=[]: fork only the CPU generator (no CUDA initialisation).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = factory(*args, **kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model factory {name!r} returned {type(model).__name__}, not nn.Module"
        )
    return model


register_model("mlp", MLP)
register_model("cnn", CNN)
register_model("logreg", LogisticRegression)
