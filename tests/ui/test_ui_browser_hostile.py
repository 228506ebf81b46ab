"""The monitor on an insider's store, in Chromium: the hostile strings are shown as
text, and nothing of them becomes an image, a link, an element or a request.

The second test serves the pages behind the headers of the reverse-proxy recipe
in docs/monitor.md (read from that file) and a password, as the docs recommend
deploying it: the pages must sign in, keep the page a link named, render with
their live WebSocket, and be blocked in nothing but two known, harmless things.

Needs ``chromium`` (``apt-get install chromium``) and the ``playwright`` package;
never ``playwright install``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, Procs
from tests.support.browser import (
    BROWSER_TEST,
    CHROMIUM,
    CHROMIUM_ARGS,
    grid,
    no_exception,
)
from tests.support.ui_fixture import serve_monitor
from tests.ui.hostile_fixture import (
    ATTACKER_HOSTS,
    HOSTILE_MESSAGE,
    HOSTILE_NAME,
    HOSTILE_NODE,
    HOSTILE_URLS,
    build_hostile_db,
)

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs the playwright package (dev extra)"
)

MONITOR_DOC = REPO / "docs" / "monitor.md"
#: What the recipe's CSP blocks and the monitor does without: Streamlit's inline
#: ``window.prerenderReady = false`` and long.js's WebAssembly probe.
HARMLESS_BLOCKS = {"script-src-elem inline", "script-src wasm-eval"}
#: Every URL-bearing attribute in the page, and CSP violations as they happen.
URLS_JS = """() => Array.from(document.querySelectorAll('*')).flatMap(e =>
  ['src', 'href', 'srcset', 'action', 'poster', 'data', 'xlink:href']
    .map(a => e.getAttribute(a)).filter(v => v))"""
CSP_WATCH = """window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"""


def recipe_headers() -> dict[str, str]:
    """The ``add_header`` lines of the nginx recipe in docs/monitor.md."""
    found = dict(
        re.findall(
            r'^\s*add_header ([\w-]+) "([^"]*)" always;', MONITOR_DOC.read_text(), re.M
        )
    )
    assert {
        "Content-Security-Policy",
        "X-Frame-Options",
        "X-Content-Type-Options",
        "Referrer-Policy",
    } <= set(found), found
    return found


def assert_inert(page: Any) -> None:
    """Nothing on the page points at the attacker or runs its markup."""
    urls = page.evaluate(URLS_JS)
    bad = [u for u in urls if any(host in u for host in ATTACKER_HOSTS)]
    assert not bad, bad
    assert page.locator("[onerror], img[src='x'], b:text-is('x')").count() == 0
    no_exception(page)


def _watch(page: Any) -> tuple[list[str], list[str]]:
    """Requests to the attacker's hosts, and dialogs (``alert(1)``), as they come."""
    requests: list[str] = []
    dialogs: list[str] = []

    def request(r: Any) -> None:
        if any(host in r.url for host in ATTACKER_HOSTS):
            requests.append(r.url)

    page.on("request", request)
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    return requests, dialogs


def _check_gossip_tooltip(page: Any) -> None:
    """Vega's tooltip is HTML: the hostile node id must be in it as text."""
    chart = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="Topology")
    chart.locator("svg.marks path").first.wait_for(timeout=60_000)
    tip = page.locator("#vg-tooltip-element")
    symbols = chart.locator("g.mark-symbol path")
    for i in range(symbols.count()):
        symbols.nth(i).hover(force=True)
        page.wait_for_timeout(200)
        if tip.count() and HOSTILE_NODE in tip.inner_text():
            break
    else:
        pytest.fail("no tooltip showed the hostile node")
    assert tip.locator("img").count() == 0


def test_hostile_store_renders_as_text_in_chromium(
    tmp_path: Path, procs: Procs, browser: Any
) -> None:
    db = tmp_path / "hostile.db"
    ids = build_hostile_db(db)
    base = serve_monitor(procs, db)
    page = browser.new_page(viewport={"width": 1400, "height": 2000})
    requests, dialogs = _watch(page)
    text = page.get_by_text

    page.goto(f"{base}/run?run={ids['federated']}")
    sync_api.expect(text(f"The run failed: {HOSTILE_MESSAGE}")).to_be_visible(
        timeout=60_000
    )
    # Lost, and in the summary's flagged clients: the name as it was stored.
    # (Not stale copies, which linger while the live panel re-runs.)
    fresh = '[data-testid="stElementContainer"]:not([data-stale="true"]) code'
    name = page.locator(fresh).filter(has_text=HOSTILE_NAME)
    sync_api.expect(name).to_have_count(2)
    for i in range(2):
        sync_api.expect(name.nth(i)).to_have_text(HOSTILE_NAME)
        sync_api.expect(name.nth(i)).to_be_visible()
    assert_inert(page)

    for view, marker in (("clients", "Enrolled"), ("contributions", "Leaderboard")):
        page.goto(f"{base}/{view}?run={ids['federated']}")
        text(marker).first.wait_for(timeout=60_000)
        sync_api.expect(grid(page)).to_contain_text(HOSTILE_NAME, timeout=30_000)
        assert_inert(page)

    page.goto(f"{base}/gossip?run={ids['gossip']}")
    sync_api.expect(text(f"round 1: {HOSTILE_MESSAGE}")).to_be_visible(timeout=60_000)
    # URLs in text read as they were written (an invisible word joiner breaks
    # GFM's autolinks), and assert_inert finds no link to them.
    change = page.locator("li").filter(has_text="cut: see")
    shown = change.evaluate("e => e.innerText.replaceAll('\\u2060', '')")
    assert shown == f"round 1: {HOSTILE_URLS}"
    sync_api.expect(grid(page)).to_contain_text(HOSTILE_NODE)
    _check_gossip_tooltip(page)
    assert_inert(page)

    assert not requests, requests
    assert not dialogs, dialogs


def _serve_with_headers(context: Any, base: str, headers: dict[str, str]) -> None:
    def add(route: Any) -> None:
        response = route.fetch()
        route.fulfill(response=response, headers={**response.headers, **headers})

    context.route(f"{base}/**", add)


def test_pages_work_behind_the_documented_headers_and_password(
    tmp_path: Path, procs: Procs
) -> None:
    headers = recipe_headers()
    db = tmp_path / "hostile.db"
    ids = build_hostile_db(db)
    password = tmp_path / "monitor.pw"
    password.write_text("a long monitor password\n")
    password.chmod(0o600)
    base = serve_monitor(procs, db, "--password-file", str(password))
    # Pages served through a route count as coming from outside this host, and
    # Chromium would then block their WebSocket to 127.0.0.1 (Local Network
    # Access); a proxy in front serves them from the host, as here.
    args = [*CHROMIUM_ARGS, "--disable-features=LocalNetworkAccessChecks"]
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            context = chromium.new_context(viewport={"width": 1400, "height": 2000})
            context.add_init_script(CSP_WATCH)
            _serve_with_headers(context, base, headers)
            page = context.new_page()
            requests, dialogs = _watch(page)
            response = page.goto(f"{base}/run?run={ids['federated']}")
            assert response is not None
            assert (
                response.headers["content-security-policy"]
                == (headers["Content-Security-Policy"])
            )
            page.get_by_label("Password", exact=True).fill("a long monitor password")
            page.get_by_role("button", name="Sign in").click()
            # The page the link named, drawn from its WebSocket.
            sync_api.expect(
                page.get_by_text(f"The run failed: {HOSTILE_MESSAGE}")
            ).to_be_visible(timeout=60_000)
            assert page.url.startswith(f"{base}/run?")
            accuracy = page.locator('[data-testid="stVegaLiteChart"]').filter(
                has_text="Global accuracy"
            )
            accuracy.locator("svg.marks path").first.wait_for(timeout=60_000)
            assert_inert(page)
            blocked = set(page.evaluate("window.__csp"))
            assert {b.strip() for b in blocked} <= HARMLESS_BLOCKS, blocked
            assert not requests and not dialogs
        finally:
            chromium.close()
