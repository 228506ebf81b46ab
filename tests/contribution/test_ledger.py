"""The contribution ledger: chaining, signatures, tampering, keys, CLI, store."""

from __future__ import annotations

import itertools
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedplat.cli import main as cli_main
from fedplat.contribution import (
    KeyFileError,
    key_id,
    load_or_create_signing_key,
    load_public_key,
    load_signing_key,
    public_key_pem,
    verify_run_ledger,
)
from fedplat.contribution.ledger import (
    GENESIS_HASH,
    LedgerHead,
    canonical_json,
    chain_entries,
    entry_hash,
    sign_head,
)
from fedplat.contribution.ledger_export import export_ledger
from fedplat.contribution.ledger_verify import verify_ledger
from fedplat.store import (
    Store,
    StoreError,
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from fedplat.store.engine import make_engine


def _contents(rounds: int = 3, clients: int = 2) -> list[dict[str, Any]]:
    return [
        {
            "round": r,
            "client_id": f"c{c}",
            "scores": {"gtg_shapley": 0.01 * (r + c), "cosine": 0.5},
            "flags": ["negative-score"] if c == 1 else [],
            "reward_share": 0.5,
        }
        for r in range(1, rounds + 1)
        for c in range(clients)
    ]


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def ledger_db(tmp_path: Path, key: Ed25519PrivateKey) -> Iterator[tuple[str, str]]:
    """A store with a run whose ledger has 6 signed entries (3 rounds x 2)."""
    url = str(tmp_path / "store.db")
    with Store(url) as store:
        run = store.create_run("ledgered", {}, {}, 3)
        prev, seq = GENESIS_HASH, 0
        for r in range(1, 4):
            rows = [c for c in _contents() if c["round"] == r]
            entries = chain_entries(
                run.id, rows, start_seq=seq + 1, prev_hash=prev, signing_key=key
            )
            seq, prev = entries[-1].seq, entries[-1].entry_hash
            store.append_ledger(run.id, entries, sign_head(run.id, seq, prev, key))
        yield url, run.id


def _sql(url: str, statement: str, **params: Any) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


def _verify(url: str, run_id: str, **kw: Any) -> Any:
    with Store(url, migrate=False) as store:
        return verify_run_ledger(store, run_id, **kw)


# --------------------------------------------------------------------- chain
def test_canonical_json_is_deterministic() -> None:
    a = canonical_json({"b": 0.1, "a": [1, "é"], "c": None})
    assert a == '{"a":[1,"é"],"b":0.1,"c":null}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_chain_links_and_signs(key: Ed25519PrivateKey) -> None:
    entries = chain_entries(
        "run", _contents(), start_seq=1, prev_hash=GENESIS_HASH, signing_key=key
    )
    assert [e.seq for e in entries] == list(range(1, 7))
    assert entries[0].prev_hash == GENESIS_HASH
    for before, after in itertools.pairwise(entries):
        assert after.prev_hash == before.entry_hash
    for e in entries:
        assert e.entry_hash == entry_hash(e.payload_json)
        assert e.payload["key_id"] == key_id(key.public_key())
        assert e.payload["run_id"] == "run" and e.payload["seq"] == e.seq
    head = sign_head("run", 6, entries[-1].entry_hash, key)
    report = verify_ledger("run", entries, head)
    assert report.ok and report.signed and report.entries == 6
    # The same entries do not verify as another run's ledger.
    moved = verify_ledger("other-run", entries, head)
    assert not moved.ok


def test_chain_rejects_bad_contents(key: Ed25519PrivateKey) -> None:
    with pytest.raises(ValueError, match="round"):
        chain_entries(
            "r", [{"client_id": "a"}], start_seq=1, prev_hash=GENESIS_HASH,
            signing_key=key,
        )  # fmt: skip
    with pytest.raises(ValueError, match="may not set"):
        chain_entries(
            "r", [{"round": 1, "client_id": "a", "seq": 9}], start_seq=1,
            prev_hash=GENESIS_HASH, signing_key=key,
        )  # fmt: skip
    # NaN scores are stored as null, never as invalid JSON.
    (e,) = chain_entries(
        "r", [{"round": 1, "client_id": "a", "s": float("nan")}], start_seq=1,
        prev_hash=GENESIS_HASH, signing_key=None,
    )  # fmt: skip
    assert e.payload["s"] is None and e.signature is None


def test_unsigned_ledger_is_reported_unless_allowed() -> None:
    entries = chain_entries(
        "r", _contents(1), start_seq=1, prev_hash=GENESIS_HASH, signing_key=None
    )
    head = sign_head("r", 2, entries[-1].entry_hash, None)
    assert [p.kind for p in verify_ledger("r", entries, head).problems] == ["unsigned"]
    assert verify_ledger("r", entries, head, require_signature=False).ok


# ----------------------------------------------------------------- tampering
def test_untouched_ledger_verifies(ledger_db: tuple[str, str]) -> None:
    url, run_id = ledger_db
    report = _verify(url, run_id)
    assert report.ok, report.problems
    assert (report.entries, report.head_seq) == (6, 6)


def test_edited_entry_is_detected_and_named(ledger_db: tuple[str, str]) -> None:
    url, run_id = ledger_db
    # Raise client c1's round-2 score (seq 4), leaving its stored hash alone.
    with Store(url, migrate=False) as s:
        text = s.list_ledger_entries(run_id)[3].payload_json
    forged = text.replace('"gtg_shapley":0.03', '"gtg_shapley":0.9')
    assert forged != text
    _sql(url, "UPDATE ledger_entries SET payload_json = :p WHERE seq = 4", p=forged)
    report = _verify(url, run_id)
    assert not report.ok
    assert {(p.kind, p.seq) for p in report.problems} >= {("edited", 4)}
    assert all(p.seq == 4 for p in report.problems)
    assert "round 2" in report.problems[0].message
    assert "'c1'" in report.problems[0].message


def test_edited_and_rehashed_entry_is_caught_by_its_signature(
    ledger_db: tuple[str, str],
) -> None:
    url, run_id = ledger_db
    with Store(url, migrate=False) as s:
        text = s.list_ledger_entries(run_id)[1].payload_json
    forged = text.replace('"reward_share":0.5', '"reward_share":1.0')
    _sql(
        url,
        "UPDATE ledger_entries SET payload_json = :p, entry_hash = :h WHERE seq = 2",
        p=forged,
        h=entry_hash(forged),
    )
    report = _verify(url, run_id)
    kinds = {(p.kind, p.seq) for p in report.problems}
    assert ("signature", 2) in kinds  # the re-hashed entry itself
    assert ("edited", 3) in kinds  # and its successor no longer links to it


def test_deleted_entries_are_detected(ledger_db: tuple[str, str]) -> None:
    url, run_id = ledger_db
    _sql(url, "DELETE FROM ledger_entries WHERE seq = 3")
    report = _verify(url, run_id)
    assert [(p.kind, p.seq) for p in report.problems] == [("deleted", 4)]
    assert "seq 3" in report.problems[0].message


def test_deleted_tail_is_detected_by_the_signed_head(
    ledger_db: tuple[str, str],
) -> None:
    url, run_id = ledger_db
    _sql(url, "DELETE FROM ledger_entries WHERE seq >= 5")
    report = _verify(url, run_id)
    assert [p.kind for p in report.problems] == ["deleted"]
    assert "5..6" in report.problems[0].message


def test_reordered_entries_are_detected(ledger_db: tuple[str, str]) -> None:
    url, run_id = ledger_db
    # Swap the positions of seq 2 and seq 5 (rows keep their signed content).
    _sql(url, "UPDATE ledger_entries SET seq = 100 WHERE seq = 2")
    _sql(url, "UPDATE ledger_entries SET seq = 2 WHERE seq = 5")
    _sql(url, "UPDATE ledger_entries SET seq = 5 WHERE seq = 100")
    report = _verify(url, run_id)
    reordered = {p.seq for p in report.problems if p.kind == "reordered"}
    assert reordered == {2, 5}
    messages = " ".join(p.message for p in report.problems)
    assert "written as seq 5" in messages and "written as seq 2" in messages


def test_swapped_contents_are_detected(ledger_db: tuple[str, str]) -> None:
    url, run_id = ledger_db
    cols = "payload_json, prev_hash, entry_hash, signature, round_number, client_id"
    _sql(url, f"CREATE TABLE tmp AS SELECT seq, {cols} FROM ledger_entries")
    for a, b in ((1, 2), (2, 1)):
        _sql(
            url,
            "UPDATE ledger_entries SET "
            + ", ".join(
                f"{c} = (SELECT {c} FROM tmp WHERE seq = {b})" for c in cols.split(", ")
            )
            + f" WHERE seq = {a}",
        )
    report = _verify(url, run_id)
    assert {p.seq for p in report.problems if p.kind == "reordered"} == {1, 2}


def test_head_resigned_with_another_key_is_detected(
    ledger_db: tuple[str, str], key: Ed25519PrivateKey
) -> None:
    url, run_id = ledger_db
    with Store(url, migrate=False) as s:
        head = s.get_ledger_head(run_id)
    assert head is not None
    mallory = Ed25519PrivateKey.generate()
    forged = sign_head(run_id, head.seq, head.head_hash, mallory)
    # 1) Only the signature replaced: fails against the stored public key.
    _sql(
        url,
        "UPDATE ledger_heads SET signature = :s WHERE run_id = :r",
        s=forged.signature,
        r=run_id,
    )
    report = _verify(url, run_id)
    assert [p.kind for p in report.problems] == ["signature"]
    assert report.problems[0].seq is None
    # 2) Signature, public key and key id replaced: the entries were signed by
    # the original key, so every one of them now fails, and the auditor's
    # pinned key rejects the head too.
    _sql(
        url,
        "UPDATE ledger_heads SET public_key_pem = :p, key_id = :k WHERE run_id = :r",
        p=forged.public_key_pem,
        k=forged.key_id,
        r=run_id,
    )
    report = _verify(url, run_id)
    assert not report.ok
    assert {p.seq for p in report.problems if p.kind == "signature"} == set(range(1, 7))
    pinned = _verify(url, run_id, public_key=key.public_key())
    assert any(
        p.kind == "key" and "not the given key" in p.message for p in pinned.problems
    )
    assert any(p.kind == "signature" and p.seq is None for p in pinned.problems)


def test_fully_resigned_chain_is_caught_only_by_a_pinned_key(tmp_path: Path) -> None:
    """Someone with write access re-creates the whole ledger with their own key.

    The stored chain is then self-consistent; only the coordinator's public
    key, pinned by the auditor, exposes it (docs/contribution.md, "Limits").
    """
    genuine, mallory = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    entries = chain_entries(
        "r", _contents(1), start_seq=1, prev_hash=GENESIS_HASH, signing_key=mallory
    )
    head = sign_head("r", 2, entries[-1].entry_hash, mallory)
    assert verify_ledger("r", entries, head).ok
    report = verify_ledger("r", entries, head, public_key=genuine.public_key())
    assert {p.kind for p in report.problems} >= {"key", "signature"}


# ---------------------------------------------------------------------- CLI
def test_cli_verify_and_export(
    ledger_db: tuple[str, str],
    key: Ed25519PrivateKey,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, run_id = ledger_db
    pub = tmp_path / "coordinator.pub"
    pub.write_text(public_key_pem(key.public_key()))
    assert cli_main(["ledger", "verify", "--db", url, "--run", "ledgered"]) == 0
    assert "OK, 6 entries" in capsys.readouterr().out
    args = ["ledger", "verify", "--db", url, "--run", run_id, "--public-key", str(pub)]
    assert cli_main(args) == 0

    out_csv = tmp_path / "ledger.csv"
    export = ["ledger", "export", "--db", url, "--run", "ledgered"]
    assert cli_main([*export, "--format", "csv", "--output", str(out_csv)]) == 0
    lines = out_csv.read_text().splitlines()
    assert lines[0].startswith("seq,round,client_id,attempt,score.cosine,")
    assert len(lines) == 7 and lines[4].split(",")[:3] == ["4", "2", "c1"]
    capsys.readouterr()
    assert cli_main([*export, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verification"]["ok"] is True
    assert [e["seq"] for e in doc["entries"]] == list(range(1, 7))
    assert doc["entries"][3]["scores"]["gtg_shapley"] == pytest.approx(0.03)

    _sql(url, "DELETE FROM ledger_entries WHERE seq = 3")
    assert cli_main(["ledger", "verify", "--db", url, "--run", "ledgered"]) == 1
    out = capsys.readouterr().out
    assert "[deleted]" in out and "seq 3" in out

    other = tmp_path / "other.pub"
    other.write_text(public_key_pem(Ed25519PrivateKey.generate().public_key()))
    bad_key = ["ledger", "verify", "--db", url, "--run", run_id]
    assert cli_main([*bad_key, "--public-key", str(other)]) == 1
    assert "not the given key" in capsys.readouterr().out
    assert cli_main(["ledger", "verify", "--db", url, "--run", "nope"]) == 2
    missing = str(tmp_path / "missing.db")
    assert cli_main(["ledger", "verify", "--db", missing, "--run", "x"]) == 2


def test_export_renders_without_a_head() -> None:
    entries = chain_entries(
        "r", _contents(1), start_seq=1, prev_hash=GENESIS_HASH, signing_key=None
    )
    doc = json.loads(export_ledger("r", entries, None, "json"))
    assert doc["head"] is None and len(doc["entries"]) == 2
    with pytest.raises(ValueError, match="unknown format"):
        export_ledger("r", entries, None, "xml")


# ---------------------------------------------------------------------- keys
def test_key_created_0600_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "ledger.pem"
    key = load_or_create_signing_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_signing_key(path)
    assert key_id(again.public_key()) == key_id(key.public_key())
    assert key_id(load_public_key(path)) == key_id(key.public_key())
    pub = tmp_path / "ledger.pub"
    pub.write_text(public_key_pem(key.public_key()))
    assert key_id(load_public_key(pub)) == key_id(key.public_key())


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.pem"
    load_or_create_signing_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signing_key(path)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    os.chmod(bad, 0o600)
    with pytest.raises(KeyFileError):
        load_signing_key(bad)
    with pytest.raises(KeyFileError):
        load_public_key(bad)


# --------------------------------------------------------------------- store
def test_store_append_keeps_the_chain_linear(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    with Store(str(tmp_path / "s.db")) as store:
        run = store.create_run("r", {}, {}, 2)
        first = chain_entries(
            run.id, _contents(1), start_seq=1, prev_hash=GENESIS_HASH,
            signing_key=key,
        )  # fmt: skip
        head = sign_head(run.id, 2, first[-1].entry_hash, key)
        stored = store.append_ledger(run.id, first, head)
        assert (stored.seq, stored.key_id) == (2, key_id(key.public_key()))
        # A second writer that read the ledger before `first` was appended.
        fork = chain_entries(
            run.id, _contents(1), start_seq=1, prev_hash=GENESIS_HASH,
            signing_key=key,
        )  # fmt: skip
        with pytest.raises(StoreError, match="next entry must be seq 3"):
            store.append_ledger(run.id, fork, head)
        wrong_link = chain_entries(
            run.id, _contents(1), start_seq=3, prev_hash=GENESIS_HASH,
            signing_key=key,
        )  # fmt: skip
        with pytest.raises(StoreError, match="does not link"):
            store.append_ledger(
                run.id, wrong_link, sign_head(run.id, 4, wrong_link[-1].entry_hash, key)
            )
        with pytest.raises(StoreError, match="last appended entry"):
            store.append_ledger(run.id, wrong_link, head)
        with pytest.raises(StoreError, match="unknown run"):
            store.append_ledger("nope", first, head)
        bad = LedgerHead(2, "XYZ", None, None, None)
        with pytest.raises(StoreError, match="hexadecimal"):
            store.append_ledger(run.id, [], bad)
        # Nothing of the failed calls was written.
        assert [e.seq for e in store.list_ledger_entries(run.id)] == [1, 2]
        assert [e.seq for e in store.list_ledger_entries(run.id, client_id="c1")] == [2]
        assert store.list_ledger_entries(run.id, round_number=2) == []
        # Re-signing the head with no new entries is allowed.
        store.append_ledger(run.id, [], head)


def test_migration_0002_adds_and_drops_only_the_ledger(tmp_path: Path) -> None:
    url = str(tmp_path / "m.db")
    migrate(url, "0002")  # later revisions add tables of their own
    engine = make_engine(url)
    try:
        assert current_revision(engine) == "0002"
        at_0002 = set(sa.inspect(engine).get_table_names())
        assert {"ledger_entries", "ledger_heads", "runs", "participations"} <= at_0002
        downgrade(engine, "0001")
        assert current_revision(engine) == "0001"
        at_0001 = set(sa.inspect(engine).get_table_names())
        assert at_0002 - at_0001 == {"ledger_entries", "ledger_heads"}
        assert at_0001 <= at_0002
        assert {"runs", "participations", "events"} <= at_0001
    finally:
        engine.dispose()
    migrate(url)  # and back up, through 0003, to the head
    engine = make_engine(url)
    try:
        assert current_revision(engine) == head_revision()
        assert at_0002 <= set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_runs_cascade_to_their_ledger(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    url = str(tmp_path / "c.db")
    with Store(url) as store:
        run = store.create_run("r", {}, {}, 1)
        entries = chain_entries(
            run.id, _contents(1), start_seq=1, prev_hash=GENESIS_HASH,
            signing_key=key,
        )  # fmt: skip
        store.append_ledger(
            run.id, entries, sign_head(run.id, 2, entries[-1].entry_hash, key)
        )
    _sql(url, "PRAGMA foreign_keys=ON")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM runs"))
            for table in ("ledger_entries", "ledger_heads"):
                count = conn.execute(sa.text(f"SELECT count(*) FROM {table}"))
                assert count.scalar() == 0
    finally:
        engine.dispose()
