"""Trust and typed outcomes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 00:00:00

- ``enrolment_tokens``: single-use, hashed enrolment tokens (admission "tokens").
- ``clients``: the registered Ed25519 public key, the mTLS certificate fingerprint,
  an operator weight cap, the admitting token and revocation time.
- ``runs``: the coordinator's heartbeat, phase, live-client count and a reason.
- ``rounds.num_aggregated``.
- ``participations``: the aggregator's verdict in typed columns (``selected``,
  ``score``, ``flags`` as a JSON list) instead of the ``flags_json`` object, whose
  data is migrated (its nested ``contribution`` part goes to ``contributions``).
- ``contributions``: one row per client and round with its contribution scores.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def _create_tokens() -> None:
    op.create_table(
        "enrolment_tokens",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("run_name", sa.String(length=255), nullable=True),
        sa.Column("note", sa.String(length=255), nullable=True),
        sa.Column("max_examples", sa.Integer(), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("used_at", _TS, nullable=True),
        sa.Column("used_run_id", sa.String(length=64), nullable=True),
        sa.Column("used_client_id", sa.String(length=64), nullable=True),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.CheckConstraint(
            "max_examples IS NULL OR max_examples >= 1",
            name=op.f("ck_enrolment_tokens_max_examples_pos"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_enrolment_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_enrolment_tokens_token_hash")),
    )


def _create_contributions() -> None:
    op.create_table(
        "contributions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("round_number", sa.Integer(), nullable=False),
        sa.Column("client_id", sa.String(length=64), nullable=False),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("scores_json", sa.Text(), nullable=False),
        sa.Column("suspect", sa.Boolean(), nullable=False),
        sa.Column("flags", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id", "client_id"],
            ["clients.run_id", "clients.id"],
            name=op.f("fk_contributions_run_id_client_id_clients"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id", "round_number"],
            ["rounds.run_id", "rounds.number"],
            name=op.f("fk_contributions_run_id_round_number_rounds"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_contributions")),
        sa.UniqueConstraint(
            "run_id",
            "round_number",
            "client_id",
            name=op.f("uq_contributions_run_id_round_number_client_id"),
        ),
    )


def upgrade() -> None:
    _create_tokens()
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("heartbeat_at", _TS, nullable=True))
        b.add_column(sa.Column("phase", sa.String(length=32), nullable=True))
        b.add_column(sa.Column("live_clients", sa.Integer(), nullable=True))
        b.add_column(sa.Column("reason", sa.Text(), nullable=True))
    with op.batch_alter_table("clients") as b:
        b.add_column(sa.Column("public_key", sa.String(length=64), nullable=True))
        b.add_column(sa.Column("cert_fingerprint", sa.String(length=64), nullable=True))
        b.add_column(sa.Column("max_examples", sa.Integer(), nullable=True))
        b.add_column(sa.Column("token_id", sa.String(length=64), nullable=True))
        b.add_column(sa.Column("revoked_at", _TS, nullable=True))
        b.create_unique_constraint(
            op.f("uq_clients_run_id_public_key"), ["run_id", "public_key"]
        )
        b.create_unique_constraint(
            op.f("uq_clients_run_id_cert_fingerprint"), ["run_id", "cert_fingerprint"]
        )
    with op.batch_alter_table("rounds") as b:
        b.add_column(
            sa.Column(
                "num_aggregated", sa.Integer(), server_default="0", nullable=False
            )
        )
    with op.batch_alter_table("participations") as b:
        b.add_column(sa.Column("selected", sa.Boolean(), nullable=True))
        b.add_column(sa.Column("score", sa.Double(), nullable=True))
        b.add_column(sa.Column("flags", sa.Text(), server_default="[]", nullable=False))
    _create_contributions()
    _migrate_flags_up()
    with op.batch_alter_table("participations") as b:
        b.drop_column("flags_json")
    op.execute(
        "UPDATE rounds SET num_aggregated = num_succeeded WHERE status = 'completed'"
    )


def _migrate_flags_up() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT id, run_id, round_number, client_id, flags_json "
            "FROM participations WHERE flags_json <> '{}'"
        )
    ).fetchall()
    for pid, run_id, number, client_id, text in rows:
        try:
            old: dict[str, Any] = json.loads(text)
        except (TypeError, ValueError):
            continue
        flags = [str(f) for f in old.get("flags", []) if isinstance(f, str)]
        score = old.get("score")
        conn.execute(
            sa.text(
                "UPDATE participations SET selected = :sel, score = :score, "
                "flags = :flags WHERE id = :id"
            ),
            {
                "sel": old.get("selected") if "selected" in old else None,
                "score": float(score) if isinstance(score, int | float) else None,
                "flags": json.dumps(flags),
                "id": pid,
            },
        )
        contrib = old.get("contribution")
        if isinstance(contrib, dict):
            cscore = contrib.get("score")
            conn.execute(
                sa.text(
                    "INSERT INTO contributions (run_id, round_number, client_id, "
                    "score, scores_json, suspect, flags) VALUES (:r, :n, :c, :s, "
                    "'{}', :sus, :f)"
                ),
                {
                    "r": run_id,
                    "n": number,
                    "c": client_id,
                    "s": float(cscore) if isinstance(cscore, int | float) else None,
                    "sus": bool(contrib.get("suspect", False)),
                    "f": json.dumps([str(f) for f in contrib.get("flags", [])]),
                },
            )


def _migrate_flags_down() -> None:
    conn = op.get_bind()
    contrib = {
        (r, n, c): (s, sus, f)
        for r, n, c, s, sus, f in conn.execute(
            sa.text(
                "SELECT run_id, round_number, client_id, score, suspect, flags "
                "FROM contributions"
            )
        ).fetchall()
    }
    rows = conn.execute(
        sa.text(
            "SELECT id, run_id, round_number, client_id, selected, score, flags "
            "FROM participations"
        )
    ).fetchall()
    for pid, run_id, number, client_id, sel, score, flags in rows:
        old: dict[str, Any] = {}
        if sel is not None:
            old = {"selected": bool(sel), "score": score, "flags": json.loads(flags)}
        c = contrib.get((run_id, number, client_id))
        if c is not None:
            old["contribution"] = {
                "flags": json.loads(c[2]),
                "suspect": bool(c[1]),
                "score": c[0],
            }
        conn.execute(
            sa.text("UPDATE participations SET flags_json = :j WHERE id = :id"),
            {"j": json.dumps(old), "id": pid},
        )


def downgrade() -> None:
    with op.batch_alter_table("participations") as b:
        b.add_column(
            sa.Column("flags_json", sa.Text(), server_default="{}", nullable=False)
        )
    _migrate_flags_down()
    op.drop_table("contributions")
    with op.batch_alter_table("participations") as b:
        b.drop_column("flags")
        b.drop_column("score")
        b.drop_column("selected")
    with op.batch_alter_table("rounds") as b:
        b.drop_column("num_aggregated")
    with op.batch_alter_table("clients") as b:
        b.drop_constraint(op.f("uq_clients_run_id_cert_fingerprint"), type_="unique")
        b.drop_constraint(op.f("uq_clients_run_id_public_key"), type_="unique")
        for col in (
            "revoked_at",
            "token_id",
            "max_examples",
            "cert_fingerprint",
            "public_key",
        ):
            b.drop_column(col)
    with op.batch_alter_table("runs") as b:
        for col in ("reason", "live_clients", "phase", "heartbeat_at"):
            b.drop_column(col)
    op.drop_table("enrolment_tokens")
