"""The monitor's pages: scripts run by ``st.navigation`` from ``app.py``.

They are a package only so that they ship in the wheel beside ``app.py``; they
are never imported. The folder is not called ``pages/``: Streamlit treats a
``pages/`` folder beside the entry script as an old-style multipage app and
serves its scripts directly, bypassing ``app.py`` (its sidebar and layout).
"""
