"""The monitor's pages: scripts run by ``st.navigation`` from ``app.py``.

They are a package only so that they ship in the wheel beside ``app.py``; they
are never imported.
"""
