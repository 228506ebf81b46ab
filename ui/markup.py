"""Text from clients and peers, made inert before it reaches the monitor's Markdown.

Streamlit renders the body of ``st.markdown``, ``st.caption``, ``st.info``,
``st.warning``, ``st.error``, ``st.success``, headers, progress text, widget
labels and badges as GitHub-flavoured Markdown. Much of what the monitor shows
came from clients and peers through the store: client names, event messages and
refusal reasons that quote their input, flags, gossip node ids, run names. Put
into Markdown as is, a client named ``![x](http://attacker.example/t.png)``
makes the operator's browser fetch the insider's image, and ``[click](...)``
draws a link the operator may trust. So every such string goes through this
module before it is interpolated into Markdown; nothing else in ``ui/`` escapes:

* :func:`plain` for text inside a sentence (messages, reasons, details): every
  ASCII punctuation character is backslash-escaped, so no Markdown, HTML,
  Streamlit directive (``:red[...]``, badges), math (``$``) or entity survives;
* :func:`code` for names and identifiers (client and run names, node ids,
  config values, paths): an inline code span, shown exactly as stored;
* :func:`clean` for widgets that show text as text (select box options, data
  frames need nothing): control characters only.

Streamlit never receives ``unsafe_allow_html`` from the monitor. Data frames
and Vega-Lite charts (axis labels, titles, tooltips, which vega-tooltip escapes)
draw text as text and need none of this. Free of Streamlit, like ``status``.
"""

from __future__ import annotations

import re
import string

#: Invisible; put where it breaks an autolink (see :func:`plain`).
WORD_JOINER = "\u2060"

# Line and paragraph breaks become spaces: a newline inside a value would let the
# rest of it start a block of its own (a heading, a list, a table row).
_BREAKS = "\t\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029"
# Bidirectional overrides and isolates reorder what is shown ("Trojan source"),
# so a name could read as another client's.
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]
_CLEAN = str.maketrans(
    {c: "\ufffd" for c in (*_CONTROLS, *_BIDI)} | {c: " " for c in _BREAKS}
)
# CommonMark lets a backslash escape any ASCII punctuation character, and an
# escaped one is always literal text (micromark, which Streamlit uses, follows it).
_ESCAPE = str.maketrans({c: "\\" + c for c in string.punctuation})
# remark-gfm finds "literal autolinks" (http://..., www...., a@b.c) in text nodes
# *after* escapes are resolved, so escaping alone still draws
# <a href="http://evil.example">. An invisible word joiner after "scheme:",
# "www" or "@" keeps the text as it reads and breaks each of its patterns.
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)", re.IGNORECASE)
_BACKTICKS = re.compile(r"`+")


def clean(value: object) -> str:
    """``value`` as one line of text: breaks become spaces, other control and
    bidirectional-override characters U+FFFD, so nothing is hidden or
    reordered."""
    return str(value).translate(_CLEAN)


def plain(value: object) -> str:
    """``value`` as Markdown source that renders as exactly its text (autolink
    patterns carry an invisible word joiner), inline, with no markup at all.

    Surrounding white space is dropped: four leading spaces would start a code
    block, and HTML does not show it anyway.
    """
    text = _AUTOLINK.sub(WORD_JOINER, clean(value).strip())
    return text.translate(_ESCAPE)


def code(value: object) -> str:
    """``value`` as an inline code span showing exactly its text.

    The fence is one backtick longer than the longest run inside, and the
    content is padded with a space on each side (CommonMark strips one from
    each side again), so no value can close the span early. Code spans are
    never parsed further: no links, autolinks, emphasis, HTML or directives.
    """
    text = clean(value)
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}"


__all__ = ["WORD_JOINER", "clean", "code", "plain"]
