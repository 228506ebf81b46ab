"""server/admission.py: stateless challenges, the in-memory token prefilter and
the admission budget, with a hand-driven clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from fedplat.server.admission import (
    CHALLENGE_BYTES,
    REENROL_BURST,
    AdmissionLimits,
    Challenges,
    UsableTokens,
)
from hypothesis import given
from hypothesis import strategies as st

from fedplat.store import Store


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _why(ch: Challenges, challenge: bytes, client_id: str) -> tuple[str, str] | None:
    p = ch.problem(challenge, client_id)
    return None if p is None else (type(p).__name__, p.reason)


def test_a_challenge_enrols_only_the_id_it_was_issued_for_until_it_expires() -> None:
    clock = Clock()
    ch = Challenges(60.0, clock)
    c = ch.issue("abc")
    assert len(c.challenge) == CHALLENGE_BYTES and c.expires_unix == 1_060.0
    assert _why(ch, c.challenge, "abc") is None
    for other in ("", "abd", "abc "):
        kind, reason = _why(ch, c.challenge, other) or ("", "")
        assert kind == "PermissionDenied" and "another client id" in reason
    clock.t = 1_059.9
    assert _why(ch, c.challenge, "abc") is None
    clock.t = 1_060.0  # expired: the SDK asks for a fresh one (retryable)
    assert _why(ch, c.challenge, "abc") == (
        "Unauthenticated",
        "expired enrolment challenge; ask again",
    )


def test_a_challenge_of_another_coordinator_process_asks_for_a_fresh_one() -> None:
    # A restart between Challenge and Enroll must not stop an honest device
    # for good (PermissionDenied is final for the SDK).
    clock = Clock()
    c = Challenges(60.0, clock).issue("")
    kind, reason = _why(Challenges(60.0, clock), c.challenge, "") or ("", "")
    assert kind == "Unauthenticated" and "another coordinator process" in reason
    kind, _ = _why(Challenges(60.0, clock), c.challenge[:-1], "") or ("", "")
    assert kind == "PermissionDenied"


@given(st.integers(0, CHALLENGE_BYTES - 1), st.integers(1, 255))
def test_any_altered_byte_makes_a_challenge_unusable(at: int, flip: int) -> None:
    ch = Challenges(60.0, Clock(), key=b"k" * 32)
    c = bytearray(ch.issue("abc").challenge)
    c[at] ^= flip
    assert ch.problem(bytes(c), "abc") is not None


def test_a_spent_challenge_is_refused_and_forgotten_once_expired() -> None:
    clock = Clock()
    ch = Challenges(60.0, clock)
    a, b = ch.issue(""), ch.issue("")
    assert ch.spend(a.challenge)
    assert not ch.spend(a.challenge)  # a racing second enrolment loses
    assert _why(ch, a.challenge, "") == (
        "PermissionDenied",
        "enrolment challenge already used",
    )
    assert ch.problem(b.challenge, "") is None
    assert len(ch) == 1
    clock.t += 61
    c = ch.issue("")
    assert ch.spend(c.challenge)
    assert len(ch) == 1  # a's entry expired and was dropped


def test_issuing_challenges_holds_no_state() -> None:
    ch = Challenges(60.0, Clock())
    for _ in range(10_000):
        ch.issue("")
    assert len(ch) == 0


def _store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'db.sqlite'}")


def _tokens(store: Store, n: int, run: str | None = "r") -> list[str]:
    made = store.create_tokens(
        n, expires_at=datetime.now(UTC) + timedelta(hours=1), run_name=run
    )
    return [secret for _, secret in made]


def test_usable_tokens_reads_the_store_at_a_bounded_rate(tmp_path: Path) -> None:
    store = _store(tmp_path)
    (early,) = _tokens(store, 1)
    (other_run,) = _tokens(store, 1, run="another")
    (any_run,) = _tokens(store, 1, run=None)
    reads = []
    real = store.usable_token_hashes

    def counted(run_name: str) -> set[str]:
        reads.append(run_name)
        return real(run_name)

    store.usable_token_hashes = counted  # type: ignore[method-assign]
    clock = Clock()
    usable = UsableTokens(store, "r", clock, reloads_per_second=1.0, reload_burst=2)
    assert usable.known(early) and usable.known(any_run)
    assert usable.known("not-a-token") is False
    assert len(reads) == 1  # the start; hits and malformed tokens read nothing
    assert usable.known(other_run) is False  # a fresh read says no
    (late,) = _tokens(store, 1)
    assert usable.known(late) is True  # made after the start: found by a reload
    assert len(reads) == 3
    for _ in range(100):  # a flood of made-up tokens: the budget is spent
        assert usable.known("fpt1.abc.def") is None
    assert len(reads) == 3
    clock.t += 1.0
    assert usable.known("fpt1.abc.def") is False
    assert len(reads) == 4
    usable.discard(early)
    assert usable.known(early) is None  # consumed: no longer known in memory


def test_usable_token_hashes_leaves_out_used_revoked_and_expired(
    tmp_path: Path,
) -> None:
    from fedplat.store.clients import token_hash

    store = _store(tmp_path)
    used, revoked, fine = _tokens(store, 3)
    run = store.create_run("r", {}, {}, 1)
    store.consume_token(used, run_id=run.id, run_name="r", client_id="c1")
    store.revoke_token(revoked.split(".")[1])
    expired = store.create_tokens(
        1, expires_at=datetime.now(UTC) + timedelta(seconds=1), run_name="r"
    )[0][1]
    import time

    time.sleep(1.1)
    assert store.usable_token_hashes("r") == {token_hash(fine)}
    assert token_hash(expired) not in store.usable_token_hashes("r")


def test_new_clients_share_a_budget_and_each_known_client_has_its_own() -> None:
    clock = Clock()
    limits = AdmissionLimits(per_second=1.0, burst=2, clock=clock)
    assert limits.admit(None) and limits.admit(None)
    assert not limits.admit(None)  # the new-client budget is spent ...
    for _ in range(REENROL_BURST):
        assert limits.admit("a")  # ... known clients re-enrol from their own
    assert not limits.admit("a")
    assert limits.admit("b")  # another client's budget is untouched
    clock.t += 1.0
    assert limits.admit(None)
    assert not limits.admit("a")  # 0.1 per second: not back yet
    clock.t += 9.0
    assert limits.admit("a")
