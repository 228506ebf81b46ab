"""The one base for validated configuration and the one config-file reader.

Run files (:mod:`fedplat.server.config`), contribution settings and gossip
scenarios are pydantic models derived from :class:`Strict` (unknown keys are
errors, values are frozen) and read by :func:`read_mapping` (TOML or YAML).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """A frozen settings model that rejects unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def read_mapping(
    path: str | os.PathLike[str], what: str, error: type[Exception] = ValueError
) -> dict[str, Any]:
    """Parse a ``.toml``/``.yaml``/``.yml`` file holding a mapping.

    Every failure (missing file, wrong suffix, syntax error, not a mapping) is an
    ``error`` whose message names the file and the problem on one line.
    """
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} file {p} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} file {p}: {exc}") from exc
    try:
        if p.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise error(f"{what} file {p}: use .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise error(f"cannot parse {p}: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} file {p} must hold a mapping at the top level")
    return data


def validation_message(exc: ValidationError, header: str) -> str:
    """A pydantic error as ``header`` plus ``loc: message`` per problem: on the same
    line when there is one problem, one indented line each otherwise."""
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{loc}: {msg}")
    if len(problems) == 1:
        return f"{header} {problems[0]}"
    return "\n".join([header, *(f"  {p}" for p in problems)])


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, nested mappings merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = (
            deep_merge(out[k], v)
            if isinstance(v, dict) and isinstance(out.get(k), dict)
            else v
        )
    return out


def env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    """``FEDPLAT__SECTION__KEY=value`` overrides (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith("FEDPLAT__"):
            continue
        parts = [p.lower() for p in key[len("FEDPLAT__") :].split("__") if p]
        if not parts:
            continue
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return out


__all__ = [
    "Strict",
    "deep_merge",
    "env_overrides",
    "read_mapping",
    "validation_message",
]
