from __future__ import annotations

from pathlib import Path

import pytest
from fedplat.server.config import ConfigError, load_config, parse_config

MIN = {"run": {"name": "r", "rounds": 2}, "server": {"insecure": True}}


def test_yaml_and_toml(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "run: {name: r, rounds: 3}\nserver: {insecure: true}\n"
    )
    (tmp_path / "a.toml").write_text(
        '[run]\nname = "r"\nrounds = 3\n[server]\ninsecure = true\n'
    )
    assert load_config(tmp_path / "a.yaml").run.rounds == 3
    assert load_config(tmp_path / "a.toml").run.rounds == 3


def test_unknown_keys_and_bad_values_are_named() -> None:
    with pytest.raises(ConfigError, match=r"selection.quorom"):
        parse_config({**MIN, "selection": {"quorom": 2}})
    with pytest.raises(ConfigError, match=r"run.rounds"):
        parse_config({"run": {"name": "r", "rounds": 0}, "server": {"insecure": True}})
    with pytest.raises(ConfigError, match="quorum"):
        parse_config(
            {
                **MIN,
                "selection": {"clients_per_round": 2, "quorum": 3, "min_available": 3},
            }
        )


def test_insecure_transport_must_be_explicit() -> None:
    with pytest.raises(ConfigError, match="insecure"):
        parse_config({"run": {"name": "r", "rounds": 1}, "server": {}})
    cfg = parse_config(
        {
            "run": {"name": "r", "rounds": 1},
            "server": {"tls": {"cert": "c.pem", "key": "k.pem"}},
        }
    )
    assert not cfg.server.insecure


def test_env_overrides(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_text("run: {name: r, rounds: 3}\nserver: {insecure: true}\n")
    cfg = load_config(
        p,
        environ={
            "FEDPLAT__RUN__ROUNDS": "7",
            "FEDPLAT__STORE__URL": "postgresql+psycopg://x/y",
        },
    )
    assert cfg.run.rounds == 7 and cfg.store.url == "postgresql+psycopg://x/y"


def test_missing_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"toml, \.yaml"):
        load_config(tmp_path / "x.json")


def test_clients_this_round() -> None:
    cfg = parse_config(
        {**MIN, "selection": {"clients_per_round": 5, "min_available": 2, "quorum": 2}}
    )
    assert cfg.clients_this_round(10) == 5 and cfg.clients_this_round(3) == 3
    cfg = parse_config(
        {
            **MIN,
            "selection": {
                "fraction": 0.5,
                "min_available": 2,
                "quorum": 2,
                "clients_per_round": 100,
            },
        }
    )
    assert cfg.clients_this_round(10) == 5 and cfg.clients_this_round(2) == 2
