"""Entry script of the fedplat monitor: ``streamlit run app.py -- --db URL``.

``fedplat monitor --db URL`` runs this file. It sets up the page, asks for the
password when one is set (no page runs and nothing of the store is read before
it), then draws the sidebar shared by every page and the navigation; each page
is a script in ``views/``.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from fedplat.ui import login
from fedplat.ui.common import database_url, sidebar_settings

VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(
    page_title="fedplat monitor",
    # An emoji, not a :material/...: icon: Streamlit fetches those favicons from
    # fonts.gstatic.com, telling Google who watches which monitor (and a CSP
    # that allows only this origin blocks them).
    page_icon="📡",
    layout="wide",
)
signed_in = login.gate()  # draws the sign-in form if not
# The navigation is built even before sign-in, hidden, so that Streamlit knows
# the page a link names (/run?run=...) and the browser lands there after it.
navigation = st.navigation(
    [
        st.Page(
            str(VIEWS / "runs.py"),
            title="Runs",
            icon=":material/list:",
            # The default page is served at "/" whatever its url_path says.
            default=True,
        ),
        st.Page(
            str(VIEWS / "run.py"),
            title="Run detail",
            icon=":material/monitoring:",
            url_path="run",
        ),
        st.Page(
            str(VIEWS / "clients.py"),
            title="Clients",
            icon=":material/devices:",
            url_path="clients",
        ),
        st.Page(
            str(VIEWS / "contributions.py"),
            title="Contributions",
            icon=":material/leaderboard:",
            url_path="contributions",
        ),
        st.Page(
            str(VIEWS / "gossip.py"),
            title="Gossip",
            icon=":material/share:",
            url_path="gossip",
        ),
        st.Page(
            str(VIEWS / "audit.py"),
            title="Audit",
            icon=":material/policy:",
            url_path="audit",
        ),
    ],
    position="sidebar" if signed_in else "hidden",
)
if not signed_in:
    st.stop()
sidebar_settings(database_url())
login.sign_out_button()
navigation.run()
