"""The monitor's privacy panel on a real DP-FedAvg run that its budget stopped:
epsilon per round (``privacy.epsilon``), the budget it is spent against
(``privacy.max_epsilon``) and why the run ended."""

from __future__ import annotations

from pathlib import Path

import pytest
from fedplat.server.config import parse_config
from fedplat.ui import APP_PATH, DB_ENV
from streamlit.testing.v1 import AppTest

from fedplat.sim import simulate
from fedplat.store import Store
from tests.support import digits_client, run_config


def test_privacy_panel_shows_the_budget_and_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = parse_config(
        run_config(
            tmp_path,
            rounds=6,
            clients=4,
            aggregator={"name": "fedavg", "weighted": False},
            selection={"sampling": "poisson", "rate": 0.5, "quorum": 1},
            privacy={"mode": "central", "epsilon": 8.0, "max_epsilon": 4.0},
        )
    )
    res = simulate(cfg, lambda i, f: digits_client(i, f, 4), 4)
    with Store(cfg.store.url, migrate=False) as store:
        eps = [m.value for m in store.list_metrics(res.run_id, "privacy.epsilon")]
    monkeypatch.setenv(DB_ENV, cfg.store.url)
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    at.query_params["run"] = res.run_id
    at.switch_page("views/run.py").run()
    assert not at.exception, at.exception
    captions = [c.value for c in at.caption]
    want = f"ε spent {eps[-1]:.3g} of the budget 4"
    assert any(want in c for c in captions), captions
    info = [i.value for i in at.info]
    assert any("stopped early: privacy budget reached" in i for i in info), info
