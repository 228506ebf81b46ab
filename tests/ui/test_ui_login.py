"""The monitor's optional login: the password file and its hash, the throttle on
guesses, and the sign-in form under AppTest (nothing of the store before it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fedplat.ui import APP_PATH, DB_ENV, PASSWORD_FILE_ENV, login
from fedplat.ui.auth import (
    PasswordCheck,
    PasswordFileError,
    Throttle,
    hash_password,
    load_password_file,
    readable_by_others,
)
from streamlit.testing.v1 import AppTest

from tests.support.ui_fixture import build_empty_db

pytestmark = pytest.mark.timeout(120)

PASSWORD = "correct horse battery staple"


# --------------------------------------------------------------------------- #
# The password file and the throttle (no Streamlit)                            #
# --------------------------------------------------------------------------- #


def test_hash_lines_round_trip_and_match_only_the_password() -> None:
    line = hash_password(PASSWORD)
    assert line.startswith("scrypt$16384$8$1$") and PASSWORD not in line
    check = PasswordCheck.parse(line)
    assert check.matches(PASSWORD)
    assert not check.matches(PASSWORD + " ") and not check.matches("")
    assert hash_password(PASSWORD) != line  # salted
    with pytest.raises(ValueError):
        hash_password("")


@pytest.mark.parametrize(
    "line",
    ["scrypt$16384$8$1$!!$AAAA", "scrypt$1000$8$1$AAAA$AAAA", "scrypt$x", "scrypt$$$"],
)
def test_malformed_hash_lines_are_refused(line: str) -> None:
    with pytest.raises(PasswordFileError, match="malformed"):
        PasswordCheck.parse(line)


def test_password_files_hold_a_password_or_its_hash(tmp_path: Path) -> None:
    plain_file = tmp_path / "plain.pw"
    plain_file.write_text(f"  {PASSWORD}\n")
    assert load_password_file(plain_file).matches(PASSWORD)
    hashed = tmp_path / "hashed.pw"
    hashed.write_text(hash_password(PASSWORD) + "\n")
    assert load_password_file(hashed).matches(PASSWORD)
    assert not load_password_file(hashed).matches(hashed.read_text().strip())
    empty = tmp_path / "empty.pw"
    empty.write_text("\n\n")
    with pytest.raises(PasswordFileError, match="empty"):
        load_password_file(empty)
    with pytest.raises(PasswordFileError, match="cannot read"):
        load_password_file(tmp_path / "missing.pw")


def test_group_or_world_readable_files_are_noticed(tmp_path: Path) -> None:
    path = tmp_path / "m.pw"
    path.write_text(PASSWORD)
    os.chmod(path, 0o600)
    assert not readable_by_others(path)
    os.chmod(path, 0o644)
    assert readable_by_others(path)


def test_throttle_locks_an_address_then_everyone() -> None:
    t = Throttle(max_failures=2, total_failures=3, window_s=60.0)
    t.failed("a", now=0.0)
    assert t.locked_for("a", now=1.0) == 0.0
    t.failed("a", now=1.0)
    assert t.locked_for("a", now=2.0) == pytest.approx(58.0)
    assert t.locked_for("b", now=2.0) == 0.0
    t.failed("b", now=2.0)  # the third failure in all
    assert t.locked_for("c", now=3.0) == pytest.approx(57.0)
    assert t.locked_for("c", now=60.0) == 0.0  # the first failure left the window
    t.succeeded("a")
    assert t.locked_for("a", now=61.5) == 0.0


# --------------------------------------------------------------------------- #
# The sign-in form (AppTest)                                                   #
# --------------------------------------------------------------------------- #


@pytest.fixture
def monitor_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty store and a password file; a fresh throttle, no delay."""
    db = tmp_path / "m.db"
    build_empty_db(db)
    monkeypatch.setenv(DB_ENV, str(db))
    pw = tmp_path / "monitor.pw"
    pw.write_text(hash_password(PASSWORD) + "\n")
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(pw))
    monkeypatch.setattr(login, "FAIL_DELAY_S", 0.0)
    login.throttle.clear()
    return db


def _sign_in(at: AppTest, password: str) -> AppTest:
    at.text_input[0].input(password)
    (button,) = [b for b in at.button if b.label == "Sign in"]
    button.click()
    return at.run()


def _texts(elements: object) -> str:
    return "\n".join(str(e.value) for e in elements)  # type: ignore[attr-defined]


def _shows_nothing_of_the_store(at: AppTest, db: Path) -> None:
    assert [t.value for t in at.title] == ["fedplat monitor"]
    assert not at.code and not at.dataframe and not at.selectbox
    assert str(db) not in _texts(at.markdown) + _texts(at.caption)


def test_a_wrong_password_is_refused(monitor_env: Path) -> None:
    at = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    assert not at.exception, at.exception
    _shows_nothing_of_the_store(at, monitor_env)
    assert at.text_input[0].label == "Password"
    _sign_in(at, "wrong")
    assert "Wrong password." in _texts(at.error)
    _shows_nothing_of_the_store(at, monitor_env)
    assert login.SIGNED_IN_KEY not in at.session_state


def test_the_right_password_shows_the_pages_until_sign_out(monitor_env: Path) -> None:
    at = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    _sign_in(at, PASSWORD)
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Runs"]
    assert str(monitor_env) in _texts(at.code)  # the sidebar's store
    assert "No runs in this database yet" in _texts(at.info)
    (sign_out,) = [b for b in at.button if b.label == "Sign out"]
    sign_out.click()
    at.run()
    _shows_nothing_of_the_store(at, monitor_env)


def test_guessing_is_throttled(monitor_env: Path) -> None:
    at = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    for _ in range(login.throttle().max_failures):
        _sign_in(at, "guess")
        assert "Wrong password." in _texts(at.error)
    _sign_in(at, PASSWORD)  # right, but refused unchecked while locked
    assert "Too many failed sign-ins" in _texts(at.error)
    _shows_nothing_of_the_store(at, monitor_env)


def test_an_unreadable_password_file_keeps_everyone_out(
    monitor_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(tmp_path / "gone.pw"))
    at = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    assert "cannot be read" in _texts(at.error)
    assert not at.text_input
    _shows_nothing_of_the_store(at, monitor_env)


def test_without_a_password_file_there_is_no_form(
    monitor_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSWORD_FILE_ENV)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    assert [t.value for t in at.title] == ["Runs"]
    assert not [b for b in at.button if b.label == "Sign out"]
