"""The examples in the docstrings of ``fedplat.aggregators`` run, and every
registered rule, pre-aggregator and attack has one."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import fedplat.aggregators as aggregators
import pytest
from fedplat.aggregators.attacks.registry import _ATTACKS
from fedplat.aggregators.registry import _AGGREGATORS, _PRE_AGGREGATORS


def modules() -> list[ModuleType]:
    names = [aggregators.__name__] + [
        m.name
        for m in pkgutil.walk_packages(aggregators.__path__, aggregators.__name__ + ".")
    ]
    return [importlib.import_module(name) for name in sorted(names)]


@pytest.mark.parametrize("module", modules(), ids=lambda m: m.__name__)
def test_docstring_examples_run(module: ModuleType) -> None:
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0, f"{result.failed} example(s) failed in {module.__name__}"


@pytest.mark.parametrize(
    ("kind", "name"),
    [("aggregator", n) for n in _AGGREGATORS.available()]
    + [("pre-aggregator", n) for n in _PRE_AGGREGATORS.available()]
    + [("attack", n) for n in _ATTACKS.available()],
)
def test_every_registered_component_has_an_example(kind: str, name: str) -> None:
    registry = {
        "aggregator": _AGGREGATORS,
        "pre-aggregator": _PRE_AGGREGATORS,
        "attack": _ATTACKS,
    }[kind]
    doc = registry.get(name).__doc__ or ""
    assert ">>> " in doc, f"{kind} {name!r} has no example in its docstring"
