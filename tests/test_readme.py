"""The README's configuration examples are valid and build."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from fedplat.aggregators import build_aggregator
from fedplat.server.config import parse_config

from fedplat.compression import create_compressor

README = Path(__file__).resolve().parents[1] / "README.md"


def _yaml_blocks() -> list[dict[str, Any]]:
    text = README.read_text()
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_readme_yaml_examples_validate() -> None:
    blocks = _yaml_blocks()
    assert len(blocks) >= 2
    for block in blocks:
        data = {"run": {"name": "r", "rounds": 2}, **block}
        server = data.setdefault("server", {})
        if "tls" not in server:
            server["insecure"] = True
        cfg = parse_config(data)
        a = cfg.aggregator
        build_aggregator(
            a.name,
            dict(a.params),
            [{"name": p.name, "params": dict(p.params)} for p in a.pre],
        )
        create_compressor(cfg.compression.name, **cfg.compression.params)
