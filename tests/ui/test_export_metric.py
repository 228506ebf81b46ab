"""``fedplat export --best --metric NAME``: the round with the best value of any
metric the run recorded (the same rule as the monitor's ranking), and one line
naming the run's metrics for a name it never recorded.

A store written through the Store API with real (tiny) checkpoints: round r's
weights are all r, so the exported file says which round it came from.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fedplat.server.checkpoint import Checkpoint, save_checkpoint
from safetensors.torch import load_file

from fedplat.cli import main
from fedplat.store import Store
from fedplat.vectors import Layout, TensorSpec
from tests.support.store import play_round

LAYOUT = Layout((TensorSpec("w", (2,)),))
#: accuracy, loss, eval.auc, eval.val_loss of rounds 1..4.
ROUNDS = [
    (0.70, 0.9, 0.80, 0.50),
    (0.75, 0.8, 0.92, 0.40),
    (0.80, 0.7, 0.85, 0.45),
    (0.78, 0.6, 0.90, 0.42),
]


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("export-metric")
    url = str(tmp / "runs.db")
    with Store(url) as store:
        run = store.create_run("tab", {}, LAYOUT.to_dict(), total_rounds=4)
        for r, (acc, loss, auc, val_loss) in enumerate(ROUNDS, start=1):
            path, sha = save_checkpoint(
                tmp / "ckpt",
                Checkpoint(run.id, r, r, LAYOUT, torch.full((2,), float(r)), {}, {}),
            )
            play_round(
                store,
                run.id,
                r,
                (),
                accuracy=acc,
                loss=loss,
                checkpoint_path=path,
                checkpoint_sha256=sha,
                metrics={"eval.auc": auc, "eval.val_loss": val_loss},
            )
    return url


def _exported_round(
    store_url: str, tmp_path: Path, *flags: str, capsys: pytest.CaptureFixture[str]
) -> int:
    out = tmp_path / "m.safetensors"
    argv = ["export", "--db", store_url, "--run", "tab", "--out", str(out)]
    assert main([*argv, *flags]) == 0, capsys.readouterr().err
    return int(load_file(str(out))["w"][0])


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--best",), 3),  # highest accuracy
        (("--best", "--metric", "accuracy"), 3),
        (("--best", "--metric", "eval.auc"), 2),  # highest AUC
        (("--best", "--metric", "loss"), 4),  # a loss: the lowest wins
        (("--best", "--metric", "eval.val_loss"), 2),
        (("--best", "--metric", "eval.auc", "--lowest"), 1),
        ((), 4),  # the last round
    ],
)
def test_export_best_by_metric(
    store_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: tuple[str, ...],
    expected: int,
) -> None:
    assert _exported_round(store_url, tmp_path, *flags, capsys=capsys) == expected
    assert f"round {expected}," in capsys.readouterr().out


def test_an_unknown_metric_names_those_the_run_has(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--db", store_url, "--run", "tab"]
    argv += ["--out", str(tmp_path / "m.safetensors"), "--best", "--metric", "auc"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "run 'tab' has no metric 'auc'" in err
    assert "it has: accuracy, loss, eval.auc, eval.val_loss" in err
    assert not (tmp_path / "m.safetensors").exists()


def test_metric_without_best_is_refused(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--db", store_url, "--run", "tab"]
    argv += ["--out", str(tmp_path / "m.safetensors"), "--metric", "eval.auc"]
    assert main(argv) == 2
    assert "add --best" in capsys.readouterr().err
