"""The monitor's optional login: a password kept in a file, and a throttle on
guesses.

``fedplat monitor --password-file FILE`` (or ``$FEDPLAT_MONITOR_PASSWORD_FILE``)
turns it on. The file's first line is either the password itself or, better, a
hash line printed by ``fedplat monitor --hash-password`` (``scrypt$...``), so
the file on disk does not give the password away. Either way the app keeps only
a salted scrypt digest in memory and compares digests with
:func:`hmac.compare_digest`, whose time does not depend on where they differ.

Free of Streamlit: the CLI checks the file with it before it starts the server,
and :mod:`fedplat.ui.login` draws the form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

#: scrypt's cost (RFC 7914): N = 2**14, r = 8, p = 1 costs 16 MiB and about 50 ms
#: a guess, the interactive setting of the scrypt paper.
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
PREFIX = "scrypt"


class PasswordFileError(ValueError):
    """The password file is missing, unreadable, empty or malformed."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=256 * n * r * 2
    )


@dataclass(frozen=True)
class PasswordCheck:
    """A salted scrypt digest of the password, and the way to test a guess."""

    salt: bytes
    digest: bytes
    n: int = SCRYPT_N
    r: int = SCRYPT_R
    p: int = SCRYPT_P

    @classmethod
    def of(cls, password: str, salt: bytes | None = None) -> PasswordCheck:
        salt = os.urandom(SALT_BYTES) if salt is None else salt
        return cls(salt, _derive(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P))

    @classmethod
    def parse(cls, line: str) -> PasswordCheck:
        """Read ``scrypt$N$r$p$SALT$DIGEST`` (base64 salt and digest)."""
        parts = line.split("$")
        try:
            if len(parts) != 6 or parts[0] != PREFIX:
                raise ValueError("not scrypt$N$r$p$salt$digest")
            n, r, p = (int(x) for x in parts[1:4])
            salt = base64.b64decode(parts[4], validate=True)
            digest = base64.b64decode(parts[5], validate=True)
            if n < 2 or n & (n - 1) or r < 1 or p < 1 or not salt or not digest:
                raise ValueError("bad scrypt parameters")
        except ValueError as exc:
            raise PasswordFileError(f"malformed password hash: {exc}") from None
        return cls(salt, digest, n, r, p)

    def line(self) -> str:
        """The hash line :meth:`parse` reads."""
        fields = (self.n, self.r, self.p, _b64(self.salt), _b64(self.digest))
        return "$".join([PREFIX, *map(str, fields)])

    def matches(self, guess: str) -> bool:
        """Whether ``guess`` is the password (constant time in the digests)."""
        got = _derive(guess, self.salt, self.n, self.r, self.p)
        return hmac.compare_digest(got, self.digest)


def hash_password(password: str) -> str:
    """The line to put in a password file instead of the password itself."""
    if not password:
        raise ValueError("the password is empty")
    return PasswordCheck.of(password).line()


def load_password_file(path: str | Path) -> PasswordCheck:
    """The check for the password in ``path``: its first line, stripped of
    surrounding white space, a hash line or the password itself."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PasswordFileError(
            f"cannot read the password file {path}: {exc}"
        ) from None
    lines = text.splitlines()
    first = lines[0].strip() if lines else ""
    if not first:
        raise PasswordFileError(f"the password file {path} is empty")
    if first.startswith(PREFIX + "$"):
        return PasswordCheck.parse(first)
    return PasswordCheck.of(first)


def readable_by_others(path: str | Path) -> bool:
    """Whether users other than the owner may read ``path`` (POSIX modes)."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IRGRP | stat.S_IROTH))


@dataclass
class Throttle:
    """At most ``max_failures`` failed logins per ``window_s`` seconds, per key
    (an address) and in all (key ``"*"``, at ``total_failures``): past either,
    guesses are refused unchecked until the oldest failure leaves the window.

    A Streamlit session is cheap to open, so a limit per session would stop
    nobody; this one lives for the server process and is shared by its
    sessions (thread-safe).
    """

    max_failures: int = 5
    total_failures: int = 30
    window_s: float = 300.0
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _wait(self, key: str, limit: int, now: float) -> float:
        times = self._failures.get(key)
        if not times:
            return 0.0
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if len(times) < limit:
            return 0.0
        return self.window_s - (now - times[0])

    def locked_for(self, key: str, now: float | None = None) -> float:
        """Seconds until ``key`` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return max(
                self._wait(key, self.max_failures, now),
                self._wait("*", self.total_failures, now),
            )

    def failed(self, key: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            for k in (key, "*"):
                self._failures.setdefault(k, deque()).append(now)

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)


__all__ = [
    "PasswordCheck",
    "PasswordFileError",
    "Throttle",
    "hash_password",
    "load_password_file",
    "readable_by_others",
]
