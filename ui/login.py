"""The monitor's sign-in form, shown before any page when a password is set.

``app.py`` calls :func:`gate` before it builds the navigation: until the session
has signed in, nothing of the store is read or shown, not even its URL. Without
``$FEDPLAT_MONITOR_PASSWORD_FILE`` (``fedplat monitor --password-file``) the
gate is open, and ``fedplat monitor`` then serves only on loopback unless told
otherwise. A sign-in lasts for the browser session (a reload signs out).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import streamlit as st
from fedplat.ui import PASSWORD_FILE_ENV
from fedplat.ui.auth import (
    PasswordCheck,
    PasswordFileError,
    Throttle,
    load_password_file,
)

SIGNED_IN_KEY = "fedplat_signed_in"
#: Seconds a wrong password waits before its answer: slows one guesser down;
#: the :class:`~fedplat.ui.auth.Throttle` stops many.
FAIL_DELAY_S = 1.0


def password_file() -> str | None:
    """The configured password file, or ``None`` (no login)."""
    return os.environ.get(PASSWORD_FILE_ENV) or None


@st.cache_resource(show_spinner=False)
def _check(path: str, mtime_ns: int) -> PasswordCheck:
    # Keyed by the file's mtime too: a changed password needs no restart.
    return load_password_file(path)


@st.cache_resource(show_spinner=False)
def throttle() -> Throttle:
    """The server's one throttle on failed sign-ins."""
    return Throttle()


def _client_key() -> str:
    # Behind a reverse proxy every browser has the proxy's address: the limit
    # per address then acts as one more limit for everyone.
    try:
        address = st.context.ip_address
    except Exception:  # no request context (bare mode)
        address = None
    return address if isinstance(address, str) and address else "unknown"


def _attempt(check: PasswordCheck, guess: str) -> None:
    """Test ``guess``; sign the session in, or say why not."""
    key = _client_key()
    limiter = throttle()
    wait = limiter.locked_for(key)
    if wait > 0:
        st.error(
            f"Too many failed sign-ins. Try again in {wait:.0f} s.",
            icon=":material/lock_clock:",
        )
        return
    if guess and check.matches(guess):
        limiter.succeeded(key)
        st.session_state[SIGNED_IN_KEY] = True
        st.rerun()
    limiter.failed(key)
    time.sleep(FAIL_DELAY_S)
    st.error("Wrong password.", icon=":material/lock:")


def gate() -> bool:
    """Whether the pages may be shown; if not, draw the sign-in form.

    Fails closed: a password file that has become unreadable or empty keeps
    every session out (the CLI checked it at start).
    """
    path = password_file()
    if path is None or st.session_state.get(SIGNED_IN_KEY):
        return True
    st.title("fedplat monitor")
    try:
        check = _check(path, Path(path).stat().st_mtime_ns)
    except (OSError, PasswordFileError) as exc:
        st.error(
            "The monitor's password file cannot be read, so nobody can sign in "
            f"({type(exc).__name__}); the server's log and `fedplat monitor "
            "--password-file` say more.",
            icon=":material/lock:",
        )
        return False
    with st.form("fedplat_sign_in", border=True):
        guess = st.text_input("Password", type="password", max_chars=1024)
        submitted = st.form_submit_button("Sign in", type="primary")
    if submitted:
        _attempt(check, guess)
    return bool(st.session_state.get(SIGNED_IN_KEY))


def sign_out_button() -> None:
    """A sidebar button ending the session's sign-in (only with a login)."""
    if password_file() is None:
        return
    if st.sidebar.button("Sign out", icon=":material/logout:"):
        st.session_state.pop(SIGNED_IN_KEY, None)
        st.rerun()


__all__ = [
    "FAIL_DELAY_S",
    "SIGNED_IN_KEY",
    "gate",
    "password_file",
    "sign_out_button",
    "throttle",
]
