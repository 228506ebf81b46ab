"""Entry script of the fedplat monitor: ``streamlit run app.py -- --db URL``.

``fedplat monitor --db URL`` runs this file. It sets up the page, the sidebar
shared by every page, and the navigation; each page is a script in ``views/``.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from fedplat.ui.common import database_url, sidebar_settings

VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(
    page_title="fedplat monitor", page_icon=":material/hub:", layout="wide"
)

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
    ]
)
sidebar_settings(database_url())
navigation.run()
