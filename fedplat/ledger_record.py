"""The shape of a contribution-ledger entry and of the chain head, shared by the
writer (:mod:`fedplat.contribution.ledger`) and the store
(:mod:`fedplat.store.ledger_rows`), which must not import each other."""

from __future__ import annotations

from typing import Protocol


class LedgerEntryLike(Protocol):
    """A ledger entry: what the store keeps and what verification reads back."""

    @property
    def seq(self) -> int: ...
    @property
    def round_number(self) -> int: ...
    @property
    def client_id(self) -> str: ...
    @property
    def payload_json(self) -> str: ...
    @property
    def prev_hash(self) -> str: ...
    @property
    def entry_hash(self) -> str: ...
    @property
    def signature(self) -> str | None: ...


class LedgerHeadLike(Protocol):
    """The chain head: the last entry's hash, signed."""

    @property
    def seq(self) -> int: ...
    @property
    def head_hash(self) -> str: ...
    @property
    def signature(self) -> str | None: ...
    @property
    def public_key_pem(self) -> str | None: ...
    @property
    def key_id(self) -> str | None: ...


__all__ = ["LedgerEntryLike", "LedgerHeadLike"]
