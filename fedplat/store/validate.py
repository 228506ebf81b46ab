"""Input checks of the store boundary: every bad value becomes a StoreError."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from numbers import Real
from typing import Any, cast

from sqlalchemy import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fedplat.store.models import (
    Base,
)

# Column widths of the schema; longer values would be truncated by some backends
# and rejected by others, so they are rejected here with a clear message.
_ID_MAX = 64
_NAME_MAX = 255
_KIND_MAX = 64
_SHA256_HEX_LEN = 64


class StoreError(RuntimeError):
    """Invalid input, a missing or conflicting row, or a database failure."""


# --------------------------------------------------------------------------- #
# Validation helpers                                                           #
# --------------------------------------------------------------------------- #


def _now() -> datetime:
    return datetime.now(UTC)


def _choice(field: str, value: object, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise StoreError(f"{field} must be one of {list(allowed)}, got {value!r}")
    return value


def _text(field: str, value: object, max_len: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise StoreError(f"{field} must be a non-empty string, got {value!r}")
    if len(value) > max_len:
        raise StoreError(f"{field} must be at most {max_len} characters")
    return value


def _opt_text(field: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise StoreError(f"{field} must be a string or None, got {value!r}")
    return value


#: The widest values of the schema's INTEGER and BIGINT columns (PostgreSQL's
#: int4 and int8; SQLite would store more, so the bound is checked here).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _count(
    field: str, value: object, *, minimum: int = 0, maximum: int = INT32_MAX
) -> int:
    # bool is an int subclass; True as a byte count is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreError(f"{field} must be an integer, got {value!r}")
    if value < minimum:
        raise StoreError(f"{field} must be >= {minimum}, got {value}")
    if value > maximum:
        raise StoreError(f"{field} must be <= {maximum}, got {value}")
    return value


def _finite(field: str, value: object, *, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise StoreError(f"{field} must be a real number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise StoreError(f"{field} must be finite, got {result}")
    if nonneg and result < 0:
        raise StoreError(f"{field} must be >= 0, got {result}")
    return result


def _opt_finite(field: str, value: object, *, nonneg: bool = False) -> float | None:
    return None if value is None else _finite(field, value, nonneg=nonneg)


def _aware(field: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise StoreError(f"{field} must be a datetime, got {value!r}")
    # A naive datetime is ambiguous (local time? UTC?); guessing would silently
    # shift deadlines by the host's UTC offset.
    if value.tzinfo is None or value.utcoffset() is None:
        raise StoreError(f"{field} must be timezone-aware (e.g. datetime.now(UTC))")
    return value.astimezone(UTC)


def _opt_aware(field: str, value: object) -> datetime | None:
    return None if value is None else _aware(field, value)


def _json_default(value: Any) -> Any:
    # numpy / torch scalars (e.g. a score computed by an aggregator) expose
    # .item(); anything else is a caller bug and must not be stringified.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def _check_keys(field: str, value: Any) -> None:
    # json.dumps silently turns 1 into "1"; the round trip would then differ and
    # lookups by the original key would fail far from the cause.
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if not isinstance(key, str):
                raise StoreError(f"{field}: JSON object keys must be str, got {key!r}")
            _check_keys(field, inner)
    elif isinstance(value, list | tuple):
        for inner in value:
            _check_keys(field, inner)


def _encode(field: str, value: object) -> str:
    if not isinstance(value, Mapping):
        raise StoreError(f"{field} must be a dict, got {type(value).__name__}")
    _check_keys(field, value)
    try:
        # allow_nan=False: NaN/Infinity are not JSON and break the monitor's parser.
        return json.dumps(dict(value), allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{field} is not JSON-serializable: {exc}") from exc


def _decode(text: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(text))


_HEX = frozenset("0123456789abcdef")
_SIGNATURE_HEX_MAX = 128


def _sha_hex(field: str, value: object) -> str:
    # Lower-case only: the chain compares hashes as strings.
    if (
        not isinstance(value, str)
        or len(value) != _SHA256_HEX_LEN
        or not set(value) <= _HEX
    ):
        raise StoreError(f"{field} must be 64 lower-case hexadecimal characters")
    return value


def _opt_signature(field: str, value: object) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or len(value) > _SIGNATURE_HEX_MAX
        or not set(value) <= _HEX
    ):
        raise StoreError(
            f"{field} must be None or at most {_SIGNATURE_HEX_MAX} lower-case "
            "hexadecimal characters"
        )
    return value


def _rowcount(result: object) -> int:
    return cast(CursorResult[Any], result).rowcount


def _try_insert(session: Session, row: Base) -> bool:
    """Insert ``row`` inside a savepoint; ``False`` if a unique key already exists.

    Another thread or process may insert the same key between our read and our
    insert. The savepoint keeps the surrounding transaction usable (PostgreSQL
    aborts the whole transaction on an error otherwise), so the caller can fall
    back to updating the row that won the race.
    """
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        return False
    return True
