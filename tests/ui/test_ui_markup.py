"""``fedplat.ui.markup``: any string, put into the monitor's Markdown, renders as
exactly its text.

The property tests parse the output with markdown-it-py, a CommonMark parser like
the micromark Streamlit uses, and add remark-gfm's literal-autolink test (which
runs on text after escapes are resolved) by hand.
"""

from __future__ import annotations

from typing import Any

import pytest
from fedplat.ui.markup import WORD_JOINER, clean, code, plain
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.ui_fixture import shown
from tests.ui.hostile_fixture import GFM_AUTOLINK, HOSTILE_MESSAGE, HOSTILE_NAME

# Markdown's own characters, so generated strings often hold some.
MARKUP = st.sampled_from([*"![]()<>*_`#|~$:\\&;/.@-+=\"'{}^%", "://", "www."])
TEXT = st.lists(st.one_of(st.characters(), MARKUP), max_size=40).map("".join)


def _inline(markdown: str) -> list[Any]:
    mdit = pytest.importorskip("markdown_it", reason="needs markdown-it-py")
    parser = mdit.MarkdownIt("commonmark").enable(["table", "strikethrough"])
    blocks = parser.parse(markdown)
    # One paragraph at most: nothing of the value may start a block of its own.
    assert [t.type for t in blocks] in (
        [],
        ["paragraph_open", "inline", "paragraph_close"],
    ), blocks
    children = blocks[1].children or [] if blocks else []
    return [t for t in children if t.type != "text" or t.content]


def test_the_issue_name_and_message_are_escaped() -> None:
    assert plain(HOSTILE_NAME) == (
        "\\!\\[x\\]\\(http\\:\u2060\\/\\/attacker\\.example\\/t\\.png\\) "
        "\\[click\\]\\(http\\:\u2060\\/\\/evil\\.example\\)"
    )
    assert plain(HOSTILE_MESSAGE) == (
        "bad update\\: \\<img src\\=x onerror\\=alert\\(1\\)\\> \\*\\*bold\\*\\*"
    )
    assert code(HOSTILE_NAME) == f"` {HOSTILE_NAME} `"
    assert shown(plain(HOSTILE_NAME)) == HOSTILE_NAME == shown(code(HOSTILE_NAME))


def test_code_spans_outlast_backticks_in_the_value() -> None:
    assert code("a`b") == "`` a`b ``"
    assert code("``x`") == "``` ``x` ```"
    assert code("") == "`  `"


def test_breaks_controls_and_bidi_overrides_are_neutralised() -> None:
    assert clean("a\nb\r\nc\td") == "a b  c d"
    assert clean("x\x00y\x1b[31mz") == "x\ufffdy\ufffd[31mz"
    # "Trojan source": a right-to-left override would show "evil" as "live".
    assert clean("\u202elive\u202c") == "\ufffdlive\ufffd"
    assert "\n" not in plain("# title\n- item") and "\n" not in code("a\n# b")


def test_autolink_patterns_get_a_word_joiner() -> None:
    for text in ("http://e.example", "HTTPS://e.example", "www.e.example", "a@b.cd"):
        out = shown(plain(text))
        assert WORD_JOINER not in out and out == text
        assert WORD_JOINER in plain(text)
        assert not GFM_AUTOLINK.search(plain(text).replace("\\", ""))


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_plain_renders_as_exactly_its_text(text: str) -> None:
    tokens = _inline(plain(text))
    assert all(t.type in ("text", "softbreak") for t in tokens), tokens
    rendered = "".join(t.content for t in tokens)
    assert not GFM_AUTOLINK.search(rendered)
    want = clean(text).strip().replace(WORD_JOINER, "")
    assert rendered.replace(WORD_JOINER, "") == want


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_code_renders_as_exactly_its_text(text: str) -> None:
    tokens = _inline(code(text))
    assert [t.type for t in tokens] == ["code_inline"], tokens
    # CommonMark keeps an all-space span as it is, else strips the padding.
    assert tokens[0].content in (clean(text), f" {clean(text)} ")


@settings(max_examples=100, deadline=None)
@given(TEXT, TEXT)
def test_escaped_values_stay_inside_their_sentence(a: str, b: str) -> None:
    tokens = _inline(f"**Lost:** {code(a)} (last seen {plain(b)})")
    kinds = [t.type for t in tokens]
    assert kinds[:3] == ["strong_open", "text", "strong_close"]
    assert kinds.count("code_inline") == 1
    assert not {"link_open", "image", "html_inline"} & set(kinds)
