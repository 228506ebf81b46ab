"""Every monitor page under Streamlit's AppTest, against the fixture database.

The app runs through its real entry script and navigation (``app.py``), so page
registration, the shared sidebar and the ``?run=`` parameter are exercised too.
Charts are checked by their Vega-Lite spec and the rows Streamlit ships to the
browser, not just by their presence.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from fedplat.ui import DB_ENV
from streamlit.testing.v1 import AppTest

from fedplat.store import Store, head_revision, migrate
from tests.support.ui_fixture import (
    ACCURACY,
    build_empty_db,
    build_fixture_db,
    keep_alive,
    shown,
)
from tests.support.ui_pages import chart_nodes, charts, metrics, open_page, texts

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("ui") / "monitor.db"
    return path, build_fixture_db(path)


@pytest.fixture
def db(
    fixture_db: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    monkeypatch.setenv(DB_ENV, str(fixture_db[0]))
    keep_alive(*fixture_db)
    return fixture_db[1]


# --------------------------------------------------------------------------- #
# Store problems: every page stops with a message saying what is wrong         #
# --------------------------------------------------------------------------- #


def test_no_database_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DB_ENV, raising=False)
    at = open_page()
    assert "No database configured" in texts(at.error)


def test_missing_sqlite_file_is_reported_and_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nowhere" / "fedplat.db"
    monkeypatch.setenv(DB_ENV, str(missing))
    at = open_page()
    assert "No database at" in texts(at.error)
    # A read-only monitor must not create the database (or its folder).
    assert not missing.parent.exists()


def test_database_without_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "blank.db"
    sqlite3.connect(path).close()
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page("run")
    assert "no fedplat tables" in texts(at.warning)


@pytest.mark.parametrize("page", ["runs", "run", "clients", "contributions", "gossip"])
def test_every_page_has_an_empty_state(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "empty.db"
    build_empty_db(path)
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page(page)
    assert "No runs" in texts(at.info) or "No gossip runs" in texts(at.info)
    assert not at.error


# --------------------------------------------------------------------------- #
# Runs                                                                         #
# --------------------------------------------------------------------------- #


def test_runs_page_lists_every_run(db: dict[str, str]) -> None:
    at = open_page()
    assert at.title[0].value == "Runs"
    # Running: the live run, the one waiting for clients, and the gossip run
    # (whose writer keeps no heartbeat); the crashed one is interrupted.
    assert metrics(at) == {
        "Runs": "7",
        "Running": "3",
        "Completed": "1",
        "Failed": "1",
        "Interrupted": "1",
    }
    table = at.dataframe[0].value.set_index("name")
    assert set(table.index) == set(db)
    assert dict(table["state_label"]) == {
        "digits-done": "completed",
        "digits-live": "running (training)",
        "digits-waiting": "waiting for clients: 2/3",
        "digits-crashed": "interrupted",
        "digits-failed": "failed",
        "digits-pending": "pending",
        "gossip-ring": "running",
    }
    # The store still says "running" for the crashed run; the page does not.
    assert table.loc["digits-crashed", "status"] == "running"
    assert "No heartbeat from the coordinator" in table.loc["digits-crashed", "detail"]
    assert "quorum not reached" in table.loc["digits-failed", "detail"]
    done = table.loc["digits-done"]
    assert done["status"] == "completed"
    assert done["progress"] == "3/3"
    assert done["participants"] == "3/4"  # round 3: one rejected update
    assert done["best_accuracy"] == pytest.approx(ACCURACY[-1])
    # The open round 2 records nothing until it closes: round 1 is shown.
    assert table.loc["digits-live"]["participants"] == "3/3"
    assert table.loc["digits-failed"]["participants"] == "0/2"
    assert table.loc["gossip-ring"]["mode"] == "gossip"
    assert table.loc["digits-pending"]["clients"] == 0


# --------------------------------------------------------------------------- #
# Run detail                                                                   #
# --------------------------------------------------------------------------- #


def test_run_page_completed_run_has_every_chart(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-done"])
    got = metrics(at)
    assert got["Current round"] == "3 / 3"
    assert got["Accuracy"] == "83.00%"
    assert got["Participants (last closed round)"] == "3 / 4"
    drawn = charts(at)
    acc = drawn["Global accuracy"][0]
    assert list(acc["round"]) == [1, 2, 3]
    assert list(acc["accuracy"]) == pytest.approx(ACCURACY)
    assert list(drawn["Global loss"][0]["loss"]) == pytest.approx(
        [2.0 - a for a in ACCURACY]
    )

    outcomes = drawn["Clients per round by outcome"][0].set_index(["round", "outcome"])
    assert outcomes.loc[(1, "succeeded"), "clients"] == 4
    assert outcomes.loc[(2, "straggler"), "clients"] == 1
    assert outcomes.loc[(3, "rejected"), "clients"] == 1

    traffic = drawn["Traffic per round"][0].set_index(["round", "direction"])
    assert traffic.loc[(1, "down"), "bytes"] == 4 * 4000
    assert traffic.loc[(1, "up"), "bytes"] == 1000 + 1001 + 1002 + 1003

    assert list(drawn["Compression ratio"][0]["value"]) == [21.0, 22.0, 23.0]
    assert list(drawn["Privacy spent (ε) per round"][0]["value"]) == [0.5, 1.0, 1.5]

    heat = drawn["Aggregator verdict per client and round"][0]
    assert len(heat) == 12
    verdicts = heat.set_index(["round", "client_id"])["verdict"]
    assert verdicts[(1, "c0")] == "accepted"
    assert verdicts[(2, "c1")] == "flagged"
    assert verdicts[(2, "c2")] == "suspect"
    assert verdicts[(2, "c3")] == "straggler"
    assert verdicts[(3, "c2")] == "rejected"
    assert verdicts[(3, "c3")] == "excluded"
    flags = heat.set_index(["round", "client_id"])["flags"]
    assert flags[(3, "c3")] == "krum_excluded"
    assert flags[(2, "c2")] == "zero-update"
    assert not at.error


def test_run_page_shows_an_unbounded_epsilon_as_unbounded(
    fixture_db: tuple[Path, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round whose epsilon the accountant could not bound carries the
    ``privacy.epsilon_unbounded`` flag, not a number: the page says so."""
    from fedplat.server.central_dp import METRIC_EPSILON_UNBOUNDED
    from fedplat.ui import data

    assert data.METRIC_EPSILON_UNBOUNDED == METRIC_EPSILON_UNBOUNDED
    path = tmp_path / "monitor.db"
    shutil.copy(fixture_db[0], path)
    run_id = fixture_db[1]["digits-live"]
    with Store(str(path), migrate=False) as store:
        store.add_metrics(run_id, {METRIC_EPSILON_UNBOUNDED: 1.0}, round_number=1)
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page("run", run_id)
    assert metrics(at)["Privacy spent (ε)"] == "unbounded"
    assert "ε is unbounded from round 1 on" in texts(at.warning)
    assert "Privacy spent (ε) per round" not in charts(at)
    assert "No privacy accounting recorded" not in texts(at.info)


def test_run_page_failed_run_says_why(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-failed"])
    assert "The run failed: round 1 failed 1 times" in texts(at.error)
    assert metrics(at)["Current round"] == "0 / 3"
    info = texts(at.info)
    assert "No accuracy yet" in info
    assert "No compression ratio recorded" in info
    assert "No privacy accounting recorded" in info
    drawn = charts(at)
    assert "Global accuracy" not in drawn
    stragglers = drawn["Clients per round by outcome"][0]
    assert stragglers.to_dict("records") == [
        {"round": 1, "outcome": "straggler", "clients": 2}
    ]


def test_run_page_pending_run(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-pending"])
    assert "No round has started yet" in texts(at.info)
    assert charts(at) == {}


def test_run_page_open_round_shows_the_heartbeat(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-live"])
    progress = shown(at.get("progress")[0].proto.text)
    assert "round 2 in progress (training, 3 clients live)" in progress
    # Nothing of round 2 is recorded before it closes: round 1 is the last word.
    assert metrics(at)["Participants (last closed round)"] == "3 / 3"
    heat = charts(at)["Aggregator verdict per client and round"][0]
    assert set(heat["round"]) == {1}
    assert set(heat["verdict"]) == {"accepted"}


def test_run_pages_list_only_coordinator_runs(db: dict[str, str]) -> None:
    for page in ("run", "clients", "contributions"):
        # Asked for the gossip run, the page says where it is; no other run
        # is shown in its place.
        at = open_page(page, db["gossip-ring"])
        names = at.selectbox[0].options
        assert sorted(names) == sorted(n for n in db if n != "gossip-ring")
        assert at.selectbox[0].value is None
        assert "is a gossip run" in texts(at.warning)
    at = open_page("gossip", db["digits-done"])
    assert at.selectbox[0].options == ["gossip-ring"]
    assert at.selectbox[0].value is None
    at = open_page("gossip")
    assert at.selectbox[0].value == db["gossip-ring"]


def test_a_store_of_gossip_runs_only_sends_run_pages_to_the_gossip_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gossip-only.db"
    with Store(str(path)) as store:
        store.create_run("g", {"mode": "gossip"}, {}, total_rounds=1)
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page("run")
    assert "only gossip runs" in texts(at.info)
    assert not at.selectbox


def test_run_page_waiting_for_clients_names_the_lost_one(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-waiting"])
    header = texts(at.markdown)
    assert ":orange-badge[waiting for clients: 2/3]" in header
    warning = texts(at.warning)
    assert "Waiting for clients: 2/3" in warning and "indefinitely" in warning
    assert "**client-w2** (last seen 10m " in warning
    assert ":red-badge[lost] 1" in header and ":green-badge[active] 2" in header
    assert not any("Summary" in s.value for s in at.subheader)


def test_run_page_crashed_run_is_interrupted_not_running(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-crashed"])
    header = texts(at.markdown)
    assert ":violet-badge[interrupted]" in header
    assert "running" not in header.split("\n")[0]
    warning = texts(at.warning)
    assert "No heartbeat from the coordinator for 10m" in warning
    assert "while training" in warning
    # Its open round is not "in progress": nobody drives it.
    assert "in progress" not in at.get("progress")[0].proto.text
    assert ":red-badge[lost] 1" in header
    assert "Summary so far" in [s.value for s in at.subheader]


def test_run_page_summary_of_a_completed_run(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-done"])
    assert "Summary" in [s.value for s in at.subheader]
    got = metrics(at)
    assert got["Rounds"] == "3 / 3"
    assert got["Final accuracy"] == "83.00%"
    assert got["Privacy (ε)"] == "1.5"
    text = texts(at.markdown)
    # c3 excluded in round 3; c2 suspect in round 2; c1 clipped by the rule.
    assert "**Flagged clients:** client-c1 (flagged, 1 round)" in text or (
        "client-c1 (flagged, 1 round)" in text
    )
    assert "client-c2 (suspect, 1 round)" in text
    assert "client-c3 (excluded, 1 round)" in text
    assert "**Ledger:** verified: 12 entries, chain intact (signed" in text
    assert "round-00003.safetensors" in text
    (command,) = [c.value for c in at.code if "fedplat export" in c.value]
    assert "--run digits-done" in command and "--format safetensors" in command
    assert ":gray-badge[finished] 4" in text


def test_accuracy_axis_toggle(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-done"])

    def scale() -> object:
        (node,) = [
            n
            for n in chart_nodes(at)
            if json.loads(n.proto.spec).get("title") == "Global accuracy"
        ]
        return json.loads(node.proto.spec)["encoding"]["y"]["scale"]

    assert scale() == {"zero": False}
    at.toggle(key="fedplat_accuracy_full_scale").set_value(True).run()
    assert scale() == {"domain": [0.0, 1.0]}


def test_run_picker_follows_the_query_parameter(db: dict[str, str]) -> None:
    at = open_page("run", db["digits-failed"])
    assert at.selectbox[0].value == db["digits-failed"]
    at.selectbox[0].set_value(db["digits-done"]).run()
    assert at.query_params["run"] == db["digits-done"]
    assert metrics(at)["Current round"] == "3 / 3"


def test_run_page_unknown_run_shows_no_other_run(db: dict[str, str]) -> None:
    at = open_page("run", "no-such-run")
    assert at.selectbox[0].value is None
    assert "No run with the id or name no-such-run" in texts(at.warning)
    assert not at.error and not metrics(at)


# --------------------------------------------------------------------------- #
# Clients                                                                      #
# --------------------------------------------------------------------------- #


def test_clients_page_lists_and_filters(db: dict[str, str]) -> None:
    at = open_page("clients", db["digits-done"])
    assert metrics(at)["Enrolled"] == "4"
    table = at.dataframe[0].value.set_index("client_id")
    assert list(table.index) == ["c0", "c1", "c2", "c3"]
    assert table.loc["c0", "rounds_joined"] == 3
    assert table.loc["c2", "rounds_rejected"] == 1
    assert table.loc["c3", "rounds_straggled"] == 1
    assert table.loc["c3", "flags"] == "krum_excluded"
    assert table.loc["c0", "bytes_up"] == 3000
    # From the signed ledger: c3 earns 0.4 a round, c2 nothing in round 2.
    assert table.loc["c3", "contribution_score"] == pytest.approx(1.2)
    assert table.loc["c2", "contribution_score"] == pytest.approx(0.6)
    assert table.loc["c3", "reward_share"] == pytest.approx(1.2 / 2.7)

    at.checkbox[0].check().run()  # flagged only
    assert list(at.dataframe[0].value["client_id"]) == ["c1", "c2", "c3"]
    at.checkbox[0].uncheck().run()
    at.text_input[0].input("C0").run()
    assert list(at.dataframe[0].value["client_id"]) == ["c0"]
    at.text_input[0].input("").run()
    at.number_input[0].set_value(3).run()
    assert list(at.dataframe[0].value["client_id"]) == ["c0", "c1"]
    assert set(table["state"]) == {"finished"}  # the run ended
    at.multiselect[0].select("lost").run()
    assert "No client matches these filters" in texts(at.warning)


def test_clients_page_shows_lost_clients_and_last_contact(db: dict[str, str]) -> None:
    at = open_page("clients", db["digits-waiting"])
    got = metrics(at)
    assert (got["Enrolled"], got["Active"], got["Lost"]) == ("3", "2", "1")
    table = at.dataframe[0].value.set_index("client_id")
    assert dict(table["state"]) == {"w0": "active", "w1": "active", "w2": "lost"}
    assert table.loc["w2", "seen"].startswith("10m ")
    assert table.loc["w0", "seen"].endswith("s ago")
    at.multiselect[0].select("lost").run()
    assert list(at.dataframe[0].value["name"]) == ["client-w2"]


def test_clients_page_without_clients(db: dict[str, str]) -> None:
    at = open_page("clients", db["digits-pending"])
    assert "No client has enrolled in this run yet" in texts(at.info)


# --------------------------------------------------------------------------- #
# Contributions                                                                #
# --------------------------------------------------------------------------- #


def test_contributions_page_from_a_verified_ledger(db: dict[str, str]) -> None:
    at = open_page("contributions", db["digits-done"])
    board = at.dataframe[0].value
    # c3 earns 0.4 a round; c0 0.1 (c1 and c2 tie at 0.6 in between).
    assert board.iloc[0]["client_id"] == "c3"
    assert board.iloc[-1]["client_id"] == "c0"
    assert list(board["rank"]) == [1, 2, 3, 4]
    assert board.set_index("client_id").loc["c2", "flagged_rounds"] == 1
    assert "Ledger verified: 12 entries, chain intact (signed" in texts(at.success)
    drawn = charts(at)
    assert len(drawn["Reward shares"][0]) == 4
    assert len(drawn["Cumulative contribution score"][0]) == 12
    entries = at.dataframe[1].value
    assert list(entries["seq"]) == list(range(1, 13))
    assert not entries["problem"].any()


def test_contributions_page_from_metrics(db: dict[str, str]) -> None:
    at = open_page("contributions", db["digits-live"])
    board = at.dataframe[0].value.set_index("client_id")
    assert board.loc["c0", "cumulative_score"] == pytest.approx(0.5)
    assert board.loc["c0", "reward_share"] == pytest.approx(0.5)
    assert "No ledger entries for this run" in texts(at.info)


def test_contributions_page_without_scores(db: dict[str, str]) -> None:
    at = open_page("contributions", db["digits-failed"])
    assert "No contribution scores for this run" in texts(at.info)


def test_contributions_page_shows_which_entry_was_tampered(
    fixture_db: tuple[Path, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src, ids = fixture_db
    path = tmp_path / "tampered.db"
    shutil.copy(src, path)
    with sqlite3.connect(path) as conn:
        # Raise client c0's round-2 credit after the fact, without re-hashing.
        (payload,) = conn.execute(
            "SELECT payload_json FROM ledger_entries WHERE seq = 5"
        ).fetchone()
        edited = json.loads(payload)
        edited["credit"] = 99.0
        conn.execute(
            "UPDATE ledger_entries SET payload_json = ? WHERE seq = 5",
            (json.dumps(edited, sort_keys=True, separators=(",", ":")),),
        )
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page("contributions", ids["digits-done"])
    error = texts(at.error)
    assert "Ledger verification FAILED" in error
    assert "First bad entry: **seq 5**" in error
    entries = at.dataframe[1].value.set_index("seq")
    assert entries.loc[5, "problem"].startswith("edited")
    assert entries.loc[4, "problem"] == ""


@pytest.mark.parametrize("page", [None, "contributions"])
def test_a_database_at_an_older_revision_is_named_not_read(
    page: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    # As last written by a coordinator before migration 0003 (the runs table
    # lacks columns every query of this monitor names).
    migrate(str(path), "0002")
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page(page)
    warning = texts(at.warning)
    assert "schema revision 0002;" in warning
    assert f"reads revision {head_revision()}." in warning
    assert not at.error and not at.dataframe
    with Store(str(path), migrate=False) as store:
        assert store.schema_revision() == "0002"  # the monitor migrated nothing


# --------------------------------------------------------------------------- #
# Gossip                                                                       #
# --------------------------------------------------------------------------- #


def _graph(at: AppTest) -> tuple[pd.DataFrame, pd.DataFrame]:
    frames = charts(at)["Topology"]
    edges = next(f for f in frames if "x2" in f.columns)
    nodes = pd.concat([f for f in frames if "node" in f.columns and "x2" not in f])
    return nodes.drop_duplicates("node").set_index("node"), edges


def test_gossip_page_latest_round(db: dict[str, str]) -> None:
    at = open_page("gossip", db["gossip-ring"])
    got = metrics(at)
    assert got["Round"] == "4 / 4"
    assert got["Live nodes"] == "5 / 6"  # node 3 removed after round 2
    assert got["Cut links"] == "0"  # link 0-1 cut after round 2, healed after 3
    assert got["Components"] == "1"
    nodes, edges = _graph(at)
    assert nodes.loc["3", "state"] == "dead"
    assert set(
        edges[edges["state"] == "dead node"][["u", "v"]].apply(tuple, axis=1)
    ) == {
        ("0", "3"),
        ("2", "3"),
        ("3", "4"),
    }
    panels = charts(at)["components"]  # one dataset per metric panel
    metric_names = set().union(*(set(f["metric"]) for f in panels if "metric" in f))
    assert metric_names == {
        "components",
        "consensus_distance",
        "mean_accuracy",
        "min_accuracy",
    }


def test_gossip_page_round_slider_replays_the_graph(db: dict[str, str]) -> None:
    at = open_page("gossip", db["gossip-ring"])
    at.toggle(key="gossip_follow").set_value(False).run()
    at.slider(key="gossip_round").set_value(3).run()
    got = metrics(at)
    assert got["Round"] == "3 / 4"
    assert got["Cut links"] == "1"
    _, edges = _graph(at)
    cut = edges[edges["state"] == "cut"]
    assert list(zip(cut["u"], cut["v"], strict=True)) == [("0", "1")]
    at.slider(key="gossip_round").set_value(2).run()
    assert metrics(at)["Live nodes"] == "6 / 6"
    assert metrics(at)["Cut links"] == "0"


def test_gossip_page_without_gossip_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fl-only.db"
    with Store(str(path)) as store:
        store.create_run("fl", {"run": {"name": "fl"}}, {}, total_rounds=1)
    monkeypatch.setenv(DB_ENV, str(path))
    at = open_page("gossip")
    assert "No gossip runs in this database" in texts(at.info)
