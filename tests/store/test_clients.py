"""Clients of a run, their identities and revocation, and enrolment tokens, on
SQLite and PostgreSQL (see ``conftest.py``).

A public key or certificate fingerprint is one client's identity within a run;
an enrolment token admits one client, once, before it expires, unless revoked.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from fedplat.store import Store, StoreError
from fedplat.store.clients import MAX_TOKENS_PER_CALL, TokenError
from tests.support.store import deadline, public_key, race, run_with_clients, sql


def test_client_crud(store: Store) -> None:
    run = store.create_run("r", {}, {}, 2)
    c = store.upsert_client(
        run.id, "c1", name="phone", num_examples=12, info={"os": "a"}
    )
    assert (c.run_id, c.id, c.name, c.status, c.num_examples) == (
        run.id,
        "c1",
        "phone",
        "enrolled",
        12,
    )
    assert c.info == {"os": "a"}
    assert c.last_seen is not None and c.enrolled_at.tzinfo is not None

    again = store.upsert_client(
        run.id, "c1", name="phone2", num_examples=30, status="active"
    )
    assert again.enrolled_at == c.enrolled_at
    assert (again.name, again.num_examples, again.status) == ("phone2", 30, "active")
    assert again.info == {"os": "a"}  # info=None keeps the stored info

    store.touch_client(run.id, "c1", status="dropped")
    touched = store.get_client(run.id, "c1")
    assert touched is not None and touched.status == "dropped"
    assert touched.last_seen is not None and again.last_seen is not None
    assert touched.last_seen >= again.last_seen

    store.upsert_client(run.id, "c0", name="other", num_examples=0)
    assert [x.id for x in store.list_clients(run.id)] == ["c0", "c1"]
    assert store.count_clients(run.id) == 2 and store.count_clients("no-run") == 0
    assert store.get_client(run.id, "zz") is None
    assert store.list_clients("no-run") == []

    with pytest.raises(StoreError, match="unknown client"):
        store.touch_client(run.id, "zz")
    with pytest.raises(StoreError, match="unknown run"):
        store.upsert_client("no-run", "c", name="c", num_examples=1)
    with pytest.raises(StoreError, match="status must be one of"):
        store.upsert_client(run.id, "c", name="c", num_examples=1, status="zombie")
    with pytest.raises(StoreError, match="status must be one of"):
        store.touch_client(run.id, "c1", status="zombie")
    with pytest.raises(StoreError, match=">= 0"):
        store.upsert_client(run.id, "c", name="c", num_examples=-1)
    with pytest.raises(StoreError, match="integer"):
        store.upsert_client(run.id, "c", name="c", num_examples=True)


def test_touch_clients(store: Store) -> None:
    run_id = run_with_clients(store, 3)
    store.revoke_client(run_id, "c2")
    assert store.touch_clients(run_id, []) == 0
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    # One statement for many clients; unknown ids are not counted.
    assert store.touch_clients(run_id, ["c0", "c1", "ghost"], when=when) == 2
    c0 = store.get_client(run_id, "c0")
    assert c0 is not None and (c0.last_seen, c0.status) == (when, "enrolled")
    # A status change never reaches a revoked client.
    assert store.touch_clients(run_id, ["c0", "c1", "c2"], status="active") == 2
    status = {c.id: c.status for c in store.list_clients(run_id)}
    assert status == {"c0": "active", "c1": "active", "c2": "revoked"}
    with pytest.raises(StoreError, match="status must be one of"):
        store.touch_clients(run_id, ["c0"], status="zombie")


# --------------------------------------------------------------------------- #
# Identities and revocation                                                    #
# --------------------------------------------------------------------------- #


def test_an_identity_belongs_to_one_client_per_run(store: Store) -> None:
    run_id = run_with_clients(store, 0)
    key, cert = public_key(), public_key()
    c0 = store.upsert_client(
        run_id,
        "c0",
        name="phone",
        num_examples=5,
        public_key=key,
        cert_fingerprint=cert,
        max_examples=50,
        token_id="tok1",
    )
    assert (c0.public_key, c0.cert_fingerprint) == (key, cert)
    assert (c0.max_examples, c0.token_id, c0.revoked_at) == (50, "tok1", None)
    # Re-enrolling with its own identity, or without naming it, keeps it.
    again = store.upsert_client(run_id, "c0", name="p", num_examples=6, public_key=key)
    assert (again.public_key, again.cert_fingerprint, again.max_examples) == (
        key,
        cert,
        50,
    )
    store.upsert_client(run_id, "c0", name="p", num_examples=6)
    assert store.find_client(run_id, public_key=key) == store.get_client(run_id, "c0")
    found = store.find_client(run_id, cert_fingerprint=cert)
    assert found is not None and found.id == "c0"
    assert store.find_client(run_id, public_key=public_key()) is None

    for kwargs in ({"public_key": key}, {"cert_fingerprint": cert}):
        with pytest.raises(StoreError, match="already registered to another client"):
            store.upsert_client(run_id, "c1", name="thief", num_examples=1, **kwargs)
    assert store.get_client(run_id, "c1") is None
    # Uniqueness is per run: another run may know the same device.
    other = run_with_clients(store, 0)
    twin = store.upsert_client(other, "c9", name="p", num_examples=1, public_key=key)
    assert twin.public_key == key

    for kwargs, match in (
        ({"public_key": key.upper()}, "lower-case hexadecimal"),
        ({"public_key": key[:-2]}, "lower-case hexadecimal"),
        ({"cert_fingerprint": "zz" * 32}, "lower-case hexadecimal"),
        ({"max_examples": 0}, ">= 1"),
    ):
        with pytest.raises(StoreError, match=match):
            store.upsert_client(run_id, "c2", name="x", num_examples=1, **kwargs)
    with pytest.raises(StoreError, match="give public_key or cert_fingerprint"):
        store.find_client(run_id)
    assert store.count_clients(run_id) == 1


def test_racing_registrations_of_one_key_one_wins(store: Store) -> None:
    """Clients enrolling at once with the same key: exactly one gets it, and the
    others are not written at all."""
    n = 4
    run_id = run_with_clients(store, 0)
    key = public_key()
    won, errors = race(
        n,
        lambda t: store.upsert_client(
            run_id, f"c{t}", name=f"c{t}", num_examples=1, public_key=key
        ),
    )
    assert len(won) == 1 and len(errors) == n - 1
    # SQLite serialises the writers, so the losers see the winner's row;
    # PostgreSQL's unique constraint stops those that checked too early.
    for e in errors:
        assert "already registered" in str(e) or "integrity violation" in str(e)
    owner = store.find_client(run_id, public_key=key)
    assert owner is not None and owner.id == f"c{won[0]}"
    assert store.count_clients(run_id) == 1


def test_a_key_registered_mid_enrolment_is_refused(store: Store, db_url: str) -> None:
    """Provoked deterministically: just before the store's INSERT, a second
    connection registers the same key to another client and commits. The
    check-then-insert cannot see it; the unique constraint refuses the second
    owner. Only PostgreSQL can interleave like this; SQLite serialises writers
    with BEGIN IMMEDIATE."""
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers; there is no race to provoke")
    run_id = run_with_clients(store, 0)
    key = public_key()
    other = sa.create_engine(db_url)
    fired: list[str] = []

    def sneak_in(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO clients ") and not fired:
            fired.append(statement)
            with other.begin() as c:
                c.execute(
                    sa.text(
                        "INSERT INTO clients (run_id, id, name, status, enrolled_at,"
                        " num_examples, info_json, public_key) VALUES (:run, 'first',"
                        " 'first', 'enrolled', now(), 1, '{}', :key)"
                    ),
                    {"run": run_id, "key": key},
                )

    sa.event.listen(store._engine, "before_cursor_execute", sneak_in)
    try:
        with pytest.raises(StoreError, match="integrity violation"):
            store.upsert_client(
                run_id, "second", name="s", num_examples=1, public_key=key
            )
    finally:
        sa.event.remove(store._engine, "before_cursor_execute", sneak_in)
        other.dispose()
    assert fired
    owner = store.find_client(run_id, public_key=key)
    assert owner is not None and owner.id == "first"
    assert store.get_client(run_id, "second") is None


def test_revoke_client_and_list_revoked(store: Store) -> None:
    run_id = run_with_clients(store, 3)
    assert store.list_revoked(run_id) == []
    revoked = store.revoke_client(run_id, "c1")
    assert (revoked.status, revoked.id) == ("revoked", "c1")
    assert revoked.revoked_at is not None and revoked.revoked_at.tzinfo is not None
    # Revoking again keeps the first time.
    assert store.revoke_client(run_id, "c1").revoked_at == revoked.revoked_at
    store.revoke_client(run_id, "c2")
    assert sorted(store.list_revoked(run_id)) == ["c1", "c2"]
    # Revocation is the revoked_at stamp: a later upsert does not lift it.
    store.upsert_client(run_id, "c1", name="back", num_examples=3)
    again = store.get_client(run_id, "c1")
    assert again is not None and again.revoked_at == revoked.revoked_at
    assert sorted(store.list_revoked(run_id)) == ["c1", "c2"]
    assert store.list_revoked("no-run") == []
    with pytest.raises(StoreError, match="unknown client"):
        store.revoke_client(run_id, "ghost")


# --------------------------------------------------------------------------- #
# Enrolment tokens                                                             #
# --------------------------------------------------------------------------- #


def _token(store: Store, **kwargs: Any) -> str:
    kwargs.setdefault("expires_at", deadline(60))
    [(_, secret)] = store.create_tokens(1, **kwargs)
    return secret


def test_tokens_are_single_use_and_only_their_hash_is_stored(
    store: Store, db_url: str
) -> None:
    run = store.create_run("fleet", {}, {}, 1)
    expires = datetime(2099, 1, 1, tzinfo=UTC)
    made = store.create_tokens(3, expires_at=expires, max_examples=50, note="batch")
    assert {r.id for r, _ in made} == {r.id for r in store.list_tokens()}
    for record, secret in made:
        assert secret.startswith(f"fpt1.{record.id}.")
        assert (record.expires_at, record.max_examples, record.note) == (
            expires,
            50,
            "batch",
        )
        assert record.state(datetime.now(UTC)) == "valid"
    rows = sql(db_url, "SELECT * FROM enrolment_tokens")
    secrets_ = [s for _, s in made]
    assert not any(s in str(row) for row in rows for s in secrets_)
    stored = {r for (r,) in sql(db_url, "SELECT token_hash FROM enrolment_tokens")}
    assert stored == {hashlib.sha256(s.encode()).hexdigest() for s in secrets_}

    (first, secret), *_ = made
    used = store.consume_token(secret, run_id=run.id, run_name="fleet", client_id="c7")
    assert (used.id, used.used_run_id, used.used_client_id) == (first.id, run.id, "c7")
    assert used.used_at is not None and used.state(datetime.now(UTC)) == "used"
    with pytest.raises(TokenError, match="already used"):
        store.consume_token(secret, run_id=run.id, run_name="fleet", client_id="c8")
    # Only the token used is spent.
    spent = {r.id for r in store.list_tokens() if r.used_at is not None}
    assert spent == {first.id}


def test_tokens_expire_can_be_revoked_and_scoped_to_a_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = store.create_run("fleet", {}, {}, 1)

    def use(secret: str, run_name: str = "fleet") -> Any:
        return store.consume_token(
            secret, run_id=run.id, run_name=run_name, client_id="c"
        )

    expiring = _token(store, expires_at=deadline(1))
    record = store.list_tokens()[0]
    later = datetime.now(UTC) + timedelta(minutes=2)
    assert record.state(later) == "expired"
    monkeypatch.setattr("fedplat.store.clients._now", lambda: later)
    with pytest.raises(TokenError, match="expired"):
        use(expiring)
    monkeypatch.undo()

    revoked = _token(store)
    rid = revoked.split(".")[1]  # fpt1.<id>.<secret>
    first = store.revoke_token(rid)
    assert first.revoked_at is not None and first.state(datetime.now(UTC)) == "revoked"
    assert store.revoke_token(rid).revoked_at == first.revoked_at
    with pytest.raises(TokenError, match="was revoked"):
        use(revoked)
    with pytest.raises(StoreError, match="no enrolment token"):
        store.revoke_token("nope")

    scoped = _token(store, run_name="fleet")
    with pytest.raises(TokenError, match="for another run"):
        use(scoped, run_name="other")
    assert use(scoped).run_name == "fleet"
    assert use(_token(store)).run_name is None  # unscoped: any run

    for bad, match in (
        ("fpt1.abc.def", "unknown enrolment token"),
        ("not-a-token", "not an enrolment token"),
        (None, "not an enrolment token"),
    ):
        with pytest.raises(TokenError, match=match):
            use(bad)  # type: ignore[arg-type]
    # Only the two accepted tokens were spent; refused ones were not.
    assert sum(t.used_at is not None for t in store.list_tokens()) == 2
    assert issubclass(TokenError, StoreError)


@pytest.mark.parametrize(
    "count, kwargs, match",
    [
        (0, {}, ">= 1"),
        (MAX_TOKENS_PER_CALL + 1, {}, "at most"),
        (1, {"expires_at": datetime.now(UTC) - timedelta(seconds=1)}, "future"),
        (1, {"expires_at": datetime(2099, 1, 1)}, "timezone-aware"),
        (1, {"max_examples": 0}, ">= 1"),
        (1, {"run_name": " "}, "non-empty"),
        (1, {"note": "x" * 256}, "at most 255"),
    ],
)
def test_create_tokens_validation(
    store: Store, count: int, kwargs: dict[str, Any], match: str
) -> None:
    kwargs.setdefault("expires_at", deadline(60))
    with pytest.raises(StoreError, match=match):
        store.create_tokens(count, **kwargs)
    assert store.list_tokens() == []


def test_racing_enrolments_with_one_token_one_wins(store: Store) -> None:
    n = 6
    run = store.create_run("fleet", {}, {}, 1)
    secret = _token(store)
    won, errors = race(
        n,
        lambda t: store.consume_token(
            secret, run_id=run.id, run_name="fleet", client_id=f"c{t}"
        ),
    )
    assert len(won) == 1, won
    assert len(errors) == n - 1
    assert all(isinstance(e, TokenError) and "already used" in str(e) for e in errors)
    [record] = store.list_tokens()
    assert record.used_client_id == f"c{won[0]}"


def test_counts_wider_than_the_columns_are_refused(store: Store) -> None:
    """PostgreSQL's INTEGER is int4: the store refuses what it would overflow,
    the same way on every backend (a StoreError, not a failed transaction)."""
    run = store.create_run("r", {}, {}, 2)
    store.upsert_client(run.id, "c1", name="a", num_examples=2**31 - 1)
    with pytest.raises(StoreError, match="num_examples must be <= 2147483647"):
        store.upsert_client(run.id, "c2", name="b", num_examples=2**31)
    assert store.get_client(run.id, "c2") is None


def test_a_client_the_store_refuses_does_not_spend_its_token(store: Store) -> None:
    run = store.create_run("r", {}, {}, 2)
    expires = datetime.now(UTC) + timedelta(hours=1)
    (_, secret), (_, other) = store.create_tokens(2, expires_at=expires, max_examples=7)
    key, key2 = public_key(), public_key()
    first = store.enrol_with_token(
        secret, run_id=run.id, run_name="r", client_id="c1", name="a",
        num_examples=5, public_key=key,
    )  # fmt: skip
    assert (first.max_examples, first.status) == (7, "active")
    # The same key for another client: refused, and the token stays unused.
    with pytest.raises(StoreError, match="public key"):
        store.enrol_with_token(
            other, run_id=run.id, run_name="r", client_id="c2", name="b",
            num_examples=5, public_key=key,
        )  # fmt: skip
    with pytest.raises(StoreError, match="num_examples"):
        store.enrol_with_token(
            other, run_id=run.id, run_name="r", client_id="c2", name="b",
            num_examples=2**31, public_key=key2,
        )  # fmt: skip
    assert store.token_problem(other, run_name="r") is None
    second = store.enrol_with_token(
        other, run_id=run.id, run_name="r", client_id="c2", name="b",
        num_examples=5, public_key=key2,
    )  # fmt: skip
    assert second.token_id is not None
    with pytest.raises(TokenError, match="already used"):
        store.enrol_with_token(
            other, run_id=run.id, run_name="r", client_id="c3", name="c",
            num_examples=5, public_key=public_key(),
        )  # fmt: skip
