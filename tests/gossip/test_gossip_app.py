"""Gossip with an app of one's own: the tabular example (examples/tabular).

The scenario names the app's model factory, per-node data (``fn(index,
num_nodes)``, node ``i`` = hospital ``i``) and held-out data, imported from
``--app-dir``; the peers train on tabular rows ``[N, 30]``. The test set is 171
rows, about 63% benign: accuracy must be clearly above that.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from fedplat.cli import main
from fedplat.gossip.launcher import ProcessLauncher
from fedplat.gossip.scenario import ScenarioError, parse_scenario
from fedplat.gossip.setup import load_node_data, model_for
from fedplat.gossip.sim import GossipSimulation
from tests.support import REPO

EXAMPLE = REPO / "examples" / "scenarios" / "tabular_ring.yaml"
LEARNS = 0.85  # chance (the majority class) is about 0.63

APP = {
    "model": {"factory": "app:model_factory"},
    "data": {"clients": "app:client_data", "eval": "app:eval_data"},
}


def _scenario(**over: object) -> dict[str, object]:
    return {
        "name": "tabular",
        "rounds": 8,
        "seed": 0,
        "topology": {"kind": "ring", "n": 3},
        "training": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "mixing": {"rule": "metropolis_hastings"},
        **APP,
        **over,
    }


def test_app_model_without_node_data_is_refused_in_one_line() -> None:
    s = _scenario(data={"eval": "app:eval_data"})
    with pytest.raises(ScenarioError) as err:
        parse_scenario(s, "t.yaml")
    msg = str(err.value)
    assert "\n" not in msg
    assert "model.factory 'app:model_factory'" in msg
    assert "names no data.clients" in msg and "fn(index, num_nodes)" in msg
    # The model alone is enough to refuse (no silent training on digits).
    with pytest.raises(ScenarioError, match=r"names no data\.clients"):
        parse_scenario(_scenario(data={}), "t.yaml")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"clients": "app:client_data"}, "data.clients needs data.eval"),
        (
            {**APP["data"], "partition": "dirichlet"},
            "data.partition split a bundled dataset",
        ),
        ({**APP["data"], "clients": "client_data"}, "package.module:function"),
    ],
)
def test_app_data_settings_are_checked(data: dict[str, str], match: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(match)):
        parse_scenario(_scenario(data=data), "t.yaml")


def test_cli_refuses_missing_plugin_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_scenario(data={"eval": "app:eval_data"})))
    for cmd in (
        ["run", "--insecure", "--workdir", str(tmp_path / "w")],
        ["sim", "--no-progress"],
    ):
        rc = main(["gossip", *cmd[:1], "--scenario", str(path), *cmd[1:]])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert "names no data.clients" in err
    assert not (tmp_path / "w").exists()  # refused before any peer started


def test_node_data_is_the_apps_own_rows(tabular_app: Path) -> None:
    s = parse_scenario(_scenario(), "t.yaml")
    data = load_node_data(s.data, 3, s.seed, nodes={1})
    assert [len(d) for d in data.train] == [0, len(data.train[1]), 0]
    assert data.train[1].x.shape[1:] == (30,) and data.train[1].x.dtype == torch.float32
    assert len(data.test) == 171 and data.test.num_classes is None
    model = model_for(s.model, data.test, s.seed)
    assert model(data.test.x[:4]).shape == (4, 2)


def test_simulated_tabular_gossip_learns(tabular_app: Path) -> None:
    s = parse_scenario(_scenario(), "t.yaml")
    res = GossipSimulation(s).run()
    assert res.final_min_accuracy is not None
    assert res.final_min_accuracy > LEARNS, res.final_min_accuracy


@pytest.mark.integration  # starts real processes
def test_tabular_gossip_run_learns_over_real_peers(
    tmp_path: Path, tabular_app: Path
) -> None:
    """``fedplat gossip run`` of the example scenario: 3 peer processes over
    mutual TLS import the app from ``--app-dir`` and train on their rows."""
    s = yaml.safe_load(EXAMPLE.read_text())
    s["rounds"] = 10
    path = tmp_path / "tabular.yaml"
    path.write_text(yaml.safe_dump(s))
    launcher = ProcessLauncher(
        path,
        tmp_path / "work",
        app_dir=tabular_app,
        peer_args=["--round-timeout", "20", "--linger", "1"],
    )
    res = launcher.run(timeout=240)
    logs = "\n".join(p.read_text()[-2000:] for p in (tmp_path / "work").glob("*.log"))
    assert res.crashed == [] and len(res.rounds) == 10, logs
    last = res.rounds[-1]
    assert last.alive == 3 and len(last.node_accuracy) == 3, logs
    assert min(last.node_accuracy.values()) > LEARNS, last.node_accuracy
