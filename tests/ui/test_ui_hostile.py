"""Every monitor page, under AppTest, on a store an insider wrote Markdown and HTML
into (issue 23): stored text is shown as text, never as markup.

What Streamlit receives is checked: the Markdown bodies of every element that
renders Markdown (no hostile fragment outside an escaped form or a code span; a
CommonMark parse finds no link, image or HTML), the data frames and the select
box (the literal text), and the chart specs (no URL channel). The browser test
(``test_ui_browser_hostile.py``) checks what Chromium then draws.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fedplat.ui import APP_PATH, DB_ENV
from fedplat.ui.markup import clean, code, plain
from streamlit.testing.v1 import AppTest

from tests.support.ui_fixture import shown
from tests.ui.hostile_fixture import (
    ATTACKER_HOSTS,
    GFM_AUTOLINK,
    HOSTILE_MESSAGE,
    HOSTILE_NAME,
    HOSTILE_NODE,
    HOSTILE_RUN,
    HOSTILE_URLS,
    build_hostile_db,
)

pytestmark = pytest.mark.timeout(120)

#: Kinds of element whose text Streamlit renders as Markdown.
MARKDOWN_ELEMENTS = (
    "title",
    "header",
    "subheader",
    "markdown",
    "caption",
    "info",
    "warning",
    "error",
    "success",
)
#: Pieces of the hostile strings that are markup when left unescaped.
RAW_MARKUP = ("](", "![", "<img", "<b>", "**bold**", ":red[alarm]", "://")
CODE_SPAN = re.compile(r"(`+) .*? \1")
ESCAPED = re.compile(r"\\[!-/:-@\[-`{-~]")


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("hostile") / "hostile.db"
    return path, build_hostile_db(path)


@pytest.fixture
def ids(
    hostile_db: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    monkeypatch.setenv(DB_ENV, str(hostile_db[0]))
    return hostile_db[1]


def open_page(page: str, run: str | None) -> AppTest:
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    if run is not None:
        at.query_params["run"] = run
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    return at


def markdown_bodies(at: AppTest) -> list[str]:
    """The Markdown source of everything on the page that Streamlit renders as
    Markdown (element bodies, progress text, expander labels)."""
    bodies = [str(e.value) for kind in MARKDOWN_ELEMENTS for e in getattr(at, kind)]
    bodies += [p.proto.text for p in at.get("progress")]
    bodies += [str(e.label) for e in at.expander]
    return bodies


def _charts(node: Any, out: list[str]) -> list[str]:
    if getattr(node, "type", None) == "vega_lite_chart":
        out.append(node.proto.spec)
    children = getattr(node, "children", None)
    for child in children.values() if isinstance(children, dict) else ():
        _charts(child, out)
    return out


def assert_inert(body: str) -> None:
    """No hostile markup outside code spans, and (with markdown-it-py) nothing a
    CommonMark parser, plus remark-gfm's autolinks, would turn into markup."""
    # Code spans and escaped characters are literal: what is left is markup.
    outside = ESCAPED.sub("", CODE_SPAN.sub("", body))
    for fragment in RAW_MARKUP:
        assert fragment not in outside, (fragment, body)
    mdit = pytest.importorskip("markdown_it", reason="needs markdown-it-py")
    tokens = mdit.MarkdownIt("commonmark").parse(body)
    for token in tokens:
        assert token.type not in ("html_block", "code_block", "fence"), body
        for child in token.children or []:
            assert child.type not in ("link_open", "image", "html_inline"), body
            if child.type == "text":
                assert not GFM_AUTOLINK.search(child.content), body


@pytest.mark.parametrize(
    ("page", "run"),
    [
        ("run", "federated"),
        ("clients", "federated"),
        ("contributions", "federated"),
        ("gossip", "gossip"),
        ("runs", None),
    ],
)
def test_no_page_renders_stored_text_as_markup(
    ids: dict[str, str], page: str, run: str | None
) -> None:
    at = open_page(page, ids[run] if run else None)
    bodies = markdown_bodies(at)
    assert bodies
    for body in bodies:
        assert_inert(body)
    for spec in _charts(at._tree, []):
        assert '"href"' not in spec and '"url"' not in spec
        assert not any(host in spec for host in ATTACKER_HOSTS), spec
    for box in at.selectbox:  # drawn as text: control characters only
        assert all(o == clean(o) for o in box.options)


def test_run_page_shows_the_hostile_strings_literally(ids: dict[str, str]) -> None:
    at = open_page("run", ids["federated"])
    markdown = "\n".join(str(m.value) for m in at.markdown)
    assert f"## {code(HOSTILE_RUN)} :red-badge[failed]" in markdown
    assert f"**Flagged clients:** {code(HOSTILE_NAME)} (excluded, 1 round)" in markdown
    (error,) = [str(e.value) for e in at.error]
    assert error == f"The run failed: {plain(HOSTILE_MESSAGE)}"
    assert shown(error) == f"The run failed: {HOSTILE_MESSAGE}"
    (warning,) = [str(w.value) for w in at.warning]
    assert f"**{code(HOSTILE_NAME)}** (last seen" in warning
    assert HOSTILE_NAME in shown(warning)
    assert code("[agg](http://evil.example/agg)") in at.caption[0].value
    events = at.dataframe[-1].value
    assert HOSTILE_MESSAGE in set(events["message"])
    assert at.selectbox[0].options == [HOSTILE_RUN]


def test_tables_hold_the_literal_names(ids: dict[str, str]) -> None:
    clients = open_page("clients", ids["federated"]).dataframe[0].value
    assert HOSTILE_NAME in set(clients["name"])
    board = open_page("contributions", ids["federated"]).dataframe[0].value
    assert HOSTILE_NAME in set(board["client"])


def test_gossip_page_escapes_node_ids_and_messages(ids: dict[str, str]) -> None:
    at = open_page("gossip", ids["gossip"])
    markdown = [str(m.value) for m in at.markdown]
    changes = "\n".join(
        f"- {plain(f'round 1: {m}')}" for m in (HOSTILE_MESSAGE, HOSTILE_URLS)
    )
    assert changes in markdown
    assert f"## {code('gossip ' + HOSTILE_RUN)} :blue-badge[running]" in markdown
    nodes = at.dataframe[0].value
    assert HOSTILE_NODE in set(nodes["node"])
