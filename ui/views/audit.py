"""Audit: every call to the coordinators' control API, who made it and how it ended."""

from __future__ import annotations

import streamlit as st
from fedplat.ui import audit, common, live

from fedplat.store import StoreError


def render() -> None:
    st.title("Audit")
    url = common.store_or_stop()

    def panel() -> None:
        try:
            frame = common.load_audit(url)
        except StoreError as exc:
            common.fail_softly(exc)
            return
        if frame.empty:
            st.info(
                "No control API call is recorded: no coordinator of this store "
                "serves one (the run file's `control` section), or no operator "
                "has called it yet (see docs/control.md)."
            )
            return
        only_refused = st.toggle("Refused calls only", key="audit_refused")
        shown = audit.refused(frame) if only_refused else frame
        n_refused = len(audit.refused(frame))
        st.caption(
            f"{len(frame)} newest calls, {n_refused} refused. Refused calls of one "
            "certificate are recorded at a bounded rate; an entry then says how "
            "many were not."
        )
        st.dataframe(shown, hide_index=True)

    live.live(panel)


if __name__ == "__main__":
    render()
