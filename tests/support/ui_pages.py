"""Driving the monitor under Streamlit's AppTest: open a page, read its charts
(by Vega-Lite title, with the rows Streamlit ships), its text and metrics."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pyarrow as pa
from fedplat.ui import APP_PATH
from streamlit.testing.v1 import AppTest

from tests.support.ui_fixture import shown


def open_page(page: str | None = None, run: str | None = None) -> AppTest:
    """Run the app, then switch to ``views/<page>.py`` with ``?run=<run>``."""
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    if page is not None:
        if run is not None:
            at.query_params["run"] = run
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, at.exception
    return at


def _walk(node: Any, out: list[Any]) -> None:
    if getattr(node, "type", None) == "vega_lite_chart":
        out.append(node)
    children = getattr(node, "children", None)
    if isinstance(children, dict):
        for child in children.values():
            _walk(child, out)


def _title(spec: Any) -> str | None:
    """A chart's title; for compound charts, the first panel's."""
    if not isinstance(spec, dict):
        return None
    title = spec.get("title")
    if isinstance(title, dict):
        title = title.get("text")
    if title:
        return str(title)
    for key in ("concat", "layer", "hconcat", "vconcat"):
        for panel in spec.get(key, []):
            found = _title(panel)
            if found:
                return found
    return None


def chart_nodes(at: AppTest) -> list[Any]:
    found: list[Any] = []
    _walk(at._tree, found)
    return found


def charts(at: AppTest) -> dict[str, list[pd.DataFrame]]:
    """Chart title -> the data frames Streamlit sends for it (one per dataset)."""
    out: dict[str, list[pd.DataFrame]] = {}
    for node in chart_nodes(at):
        spec = json.loads(node.proto.spec)
        title = _title(spec)
        frames = [
            pa.ipc.open_stream(d.data.data).read_all().to_pandas()
            for d in node.proto.datasets
        ]
        out[str(title)] = frames
    return out


def texts(elements: Any) -> str:
    """The elements' Markdown as a reader sees it (client text is escaped)."""
    return "\n".join(shown(str(e.value)) for e in elements)


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}
