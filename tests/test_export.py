"""``fedplat export``: each format loads without fedplat and gives the same outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fedplat.server.config import RunConfig, parse_config
from fedplat.server.evaluation import build_model

from fedplat.cli import main
from fedplat.sim import simulate
from fedplat.store import RoundRecord, Store
from fedplat.vectors import load_vector
from tests.support import digits_client, run_config, run_without_fedplat

# The registered "mlp" with hidden [64] on 8x8 digits, written in plain torch.
PLAIN_MLP = """
import torch
from torch import nn
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 10))
    def forward(self, x):
        return self.net(x)
"""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Path]:
    tmp = tmp_path_factory.mktemp("export")
    raw = run_config(tmp, rounds=3, clients=2)
    raw["checkpoints"]["keep_last"] = 2
    cfg = parse_config(raw)
    simulate(cfg, lambda i, f: digits_client(i, f, 2), 2)
    return cfg, tmp


def _rounds(cfg: RunConfig) -> list[RoundRecord]:
    with Store(cfg.store.url, migrate=False) as store:
        run = store.get_run_by_name(cfg.run.name)
        assert run is not None
        return store.list_rounds(run.id)


def _reference_logits(cfg: RunConfig, number: int, x: torch.Tensor) -> np.ndarray:
    """The fedplat model at round ``number``, from the checkpoint the store names."""
    from fedplat.server.checkpoint import load_checkpoint

    rec = _rounds(cfg)[number - 1]
    assert rec.number == number and rec.checkpoint_path is not None
    model = build_model(cfg)
    load_vector(model, load_checkpoint(rec.checkpoint_path).weights)
    with torch.no_grad():
        return model.eval()(x).numpy()


def _inputs(tmp: Path) -> torch.Tensor:
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    np.save(tmp / "x.npy", x.numpy())
    return x


@pytest.mark.parametrize(
    ("fmt", "load"),
    [
        (
            "safetensors",
            "from safetensors.torch import load_file\n"
            "m = MLP(); m.load_state_dict(load_file('model.bin'))",
        ),
        (
            "torch",
            "m = MLP(); m.load_state_dict(torch.load('model.bin', weights_only=True))",
        ),
    ],
)
def test_state_dict_formats_load_in_plain_torch(
    finished_run: tuple[RunConfig, Path], fmt: str, load: str, tmp_path: Path
) -> None:
    cfg, _ = finished_run
    x = _inputs(tmp_path)
    argv = ["export", "--db", cfg.store.url, "--run", cfg.run.name]
    assert main([*argv, "--format", fmt, "--out", str(tmp_path / "model.bin")]) == 0
    out = run_without_fedplat(
        PLAIN_MLP
        + load
        + "\nimport numpy as np\nx = torch.from_numpy(np.load('x.npy'))\n"
        "np.save('y.npy', m.eval()(x).detach().numpy())\n",
        tmp_path,
    )
    assert out == ""
    # The two processes may sum in different orders (thread counts, BLAS
    # kernels): float32 reductions over 64 terms differ by up to about
    # 64 * eps(float32) * sum|terms| ~ 1e-5 at these logits' magnitudes (a logit
    # near zero once differed by 2e-7, relative 5.5e-6, under rtol alone).
    np.testing.assert_allclose(
        np.load(tmp_path / "y.npy"), _reference_logits(cfg, 3, x), rtol=1e-6, atol=1e-5
    )


def test_onnx_runs_in_onnxruntime_with_any_batch(
    finished_run: tuple[RunConfig, Path], tmp_path: Path
) -> None:
    pytest.importorskip("onnxscript")
    cfg, _ = finished_run
    x = _inputs(tmp_path)
    path = tmp_path / "model.onnx"
    argv = ["export", "--db", cfg.store.url, "--run", cfg.run.name, "--round", "2"]
    assert main([*argv, "--format", "onnx", "--out", str(path)]) == 0
    run_without_fedplat(
        "import numpy as np, onnxruntime as ort\n"
        "s = ort.InferenceSession('model.onnx')\n"
        "x = np.load('x.npy').astype(np.float32)\n"
        "np.save('y.npy', s.run(['output'], {'input': x})[0])\n",
        tmp_path,
    )
    np.testing.assert_allclose(
        np.load(tmp_path / "y.npy"), _reference_logits(cfg, 2, x), rtol=1e-5, atol=1e-6
    )


def test_best_round_and_clear_errors(
    finished_run: tuple[RunConfig, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg, _ = finished_run
    best = max(_rounds(cfg), key=lambda r: r.accuracy or 0.0)
    argv = ["export", "--db", cfg.store.url, "--run", cfg.run.name]
    out = str(tmp_path / "m.safetensors")
    if best.number >= 2:  # rounds before keep_last are pruned
        assert main([*argv, "--best", "--out", out]) == 0
        assert f"round {best.number}," in capsys.readouterr().out
    assert main([*argv, "--round", "1", "--out", out]) == 2
    assert "checkpoints.keep_last" in capsys.readouterr().err
    assert main([*argv, "--round", "9", "--out", out]) == 2
    assert "not a completed round (completed: 1..3)" in capsys.readouterr().err
    assert main([*argv[:-1], "nope", "--out", out]) == 2
    assert "no run named" in capsys.readouterr().err


def test_a_tampered_checkpoint_is_refused(
    finished_run: tuple[RunConfig, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg, _ = finished_run
    rec = _rounds(cfg)[2]
    assert rec.checkpoint_path is not None
    ckpt = Path(rec.checkpoint_path)
    original = ckpt.read_bytes()
    try:
        ckpt.write_bytes(original[:-4] + b"\0\0\0\0")
        argv = ["export", "--db", cfg.store.url, "--run", cfg.run.name]
        assert main([*argv, "--out", str(tmp_path / "m.safetensors")]) == 2
        assert "does not match its recorded SHA-256" in capsys.readouterr().err
    finally:
        ckpt.write_bytes(original)
