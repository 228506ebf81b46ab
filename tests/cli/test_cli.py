"""The ``fedplat`` command: every flag documented, listings, one-line errors."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedplat.cli import build_parser, main
from fedplat.compression import available_compressors
from fedplat.metrics import available_metrics
from tests.support import run_config


def _parsers(
    p: argparse.ArgumentParser, path: str = "fedplat"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_flag_of_every_subcommand_has_help() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [
                    f"{path} {c.dest}" for c in action._choices_actions if not c.help
                ]
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(
                    f"{path} {'/'.join(action.option_strings) or action.dest}"
                )
    assert missing == [], f"flags without help: {missing}"


def test_top_level_help_names_every_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    for name in sub.choices:
        assert f"    {name} " in out, name
    assert {"coordinator", "monitor", "ledger", "gossip", "export", "list"} <= set(
        sub.choices
    )


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("metrics", available_metrics()), ("compressors", available_compressors())],
)
def test_list_prints_the_registry(
    kind: str, expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list", kind]) == 0
    assert capsys.readouterr().out.split() == expected


def test_every_listable_kind_lists_something(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fedplat.cli.listing import KINDS

    for kind in KINDS:
        assert main(["list", kind]) == 0
        assert capsys.readouterr().out.strip(), kind


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"data": {"dataset": "cifar10"}}, "unknown dataset 'cifar10'"),
        ({"model": {"name": "resnet"}}, "unknown model 'resnet'"),
        ({"evaluation": {"metrics": ["bleu"]}}, "unknown metric 'bleu'"),
        ({"evaluation": {"batch_size": 0}}, "evaluation.batch_size"),
    ],
)
def test_bad_run_files_are_one_line_and_exit_2(
    tmp_path: Path,
    section: dict[str, dict[str, object]],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = run_config(tmp_path)
    cfg.update(section)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for argv in (
        ["coordinator", "--config", str(path)],
        ["sim", "--config", str(path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_app_dir_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_config(tmp_path)))
    argv = ["sim", "--config", str(path), "--app-dir", str(tmp_path / "nope")]
    assert main(argv) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_help_loads_neither_torch_nor_the_store() -> None:
    # `fedplat --help` (and every parser) must not pay for torch, SQLAlchemy
    # or gRPC: they load with the command that needs them.
    code = (
        "import sys, fedplat.cli; fedplat.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'sqlalchemy', 'grpc') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
