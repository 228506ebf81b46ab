"""Tests for fedplat.models: reference models, registry, train / evaluate."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from fedplat.data import Dataset, load_digits
from fedplat.models import (
    CNN,
    MLP,
    LogisticRegression,
    ModelSpecError,
    available_models,
    create_model,
    evaluate,
    register_model,
    resolve_model_factory,
    train_epochs,
    zoo,
)

SHAPES = [(1, 8, 8), (1, 28, 28)]  # digits, Fashion-MNIST


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    # These models are tiny: intra-op threads only add contention, which on a
    # busy 2-core CI box made the digits training test ~25x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def digits() -> tuple[Dataset, Dataset]:
    return load_digits("train"), load_digits("test")


@pytest.fixture
def private_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let a test register models without leaking them into other tests."""
    monkeypatch.setattr(zoo._REGISTRY, "_factories", dict(zoo._REGISTRY._factories))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", available_models())
def test_every_model_forward(name: str, shape: tuple[int, ...]) -> None:
    model = create_model(name, shape, 10, seed=0)
    out = model(torch.rand(3, *shape))
    assert out.shape == (3, 10) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_builtin_names_and_architectures() -> None:
    assert available_models() == ["cnn", "logreg", "mlp"]
    mlp = MLP((1, 28, 28), 10)
    linears = [m for m in mlp.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (784, 200),
        (200, 200),
        (200, 10),
    ]
    assert sum(p.numel() for p in LogisticRegression((1, 8, 8), 10).parameters()) == 650
    assert isinstance(create_model("cnn", (1, 8, 8), 10, channels=(4, 8)), CNN)
    assert len(list(MLP((1, 8, 8), 3, hidden=()).parameters())) == 2


def test_model_argument_validation() -> None:
    with pytest.raises(ValueError, match="C, H, W"):
        CNN((64,), 10)
    with pytest.raises(ValueError, match="H, W >= 4"):
        CNN((1, 3, 3), 10)
    with pytest.raises(ValueError, match="odd"):
        CNN((1, 8, 8), 10, kernel_size=4)
    with pytest.raises(ValueError, match="num_classes"):
        MLP((1, 8, 8), 0)
    with pytest.raises(ValueError, match="hidden"):
        MLP((1, 8, 8), 10, hidden=(0,))


def test_seeded_construction_is_reproducible_and_local() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = create_model("cnn", (1, 8, 8), 10, seed=7)
    b = create_model("cnn", (1, 8, 8), 10, seed=7)
    # The caller's RNG stream is untouched by seeded construction.
    assert torch.equal(torch.rand(1), expected_next)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    c = create_model("cnn", (1, 8, 8), 10, seed=8)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_registry_errors(private_registry: None) -> None:
    with pytest.raises(ValueError, match=r"unknown model 'resnet'.*cnn.*mlp"):
        create_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ValueError, match=r"does not take \['hiden'\]"):
        create_model("mlp", (1, 8, 8), 10, hiden=(5,))
    with pytest.raises(ValueError, match="already registered"):
        register_model("mlp", LogisticRegression)
    with pytest.raises(TypeError, match="not callable"):
        register_model("thing", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="':'"):
        register_model("a:b", MLP)

    def tiny(input_shape: tuple[int, ...], num_classes: int, **kw: object) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))

    register_model("tiny", tiny)
    assert "tiny" in available_models()
    assert create_model("tiny", (1, 8, 8), 4)(torch.rand(2, 1, 8, 8)).shape == (2, 4)
    register_model("not_a_module", lambda shape, k: "oops")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"not nn\.Module"):
        create_model("not_a_module", (1, 8, 8), 10)


def test_import_path_resolution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_model_factory("fedplat.models.zoo:CNN") is CNN
    assert resolve_model_factory("mlp") is MLP
    (tmp_path / "my_models_for_test.py").write_text(
        "from torch import nn\n"
        "NOT_CALLABLE = 3\n"
        "class Factories:\n"
        "    @staticmethod\n"
        "    def wide(input_shape, num_classes, width=16):\n"
        "        return nn.Sequential(nn.Flatten(), nn.Linear(64, width),\n"
        "                             nn.ReLU(), nn.Linear(width, num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_models_for_test", raising=False)
    model = create_model(
        "my_models_for_test:Factories.wide", (1, 8, 8), 10, seed=0, width=8
    )
    assert model(torch.rand(5, 1, 8, 8)).shape == (5, 10)
    with pytest.raises(ModelSpecError, match="cannot import"):
        resolve_model_factory("no_such_pkg_xyz.models:net")
    with pytest.raises(ModelSpecError, match="no attribute"):
        resolve_model_factory("my_models_for_test:missing")
    with pytest.raises(ModelSpecError, match="not callable"):
        resolve_model_factory("my_models_for_test:NOT_CALLABLE")
    with pytest.raises(ModelSpecError, match=r"package\.module:name"):
        resolve_model_factory("my_models_for_test:")


def test_mlp_learns_digits(digits: tuple[Dataset, Dataset]) -> None:
    train, test = digits
    model = create_model("mlp", train.input_shape, train.num_classes, seed=0)
    before = evaluate(model, test)
    result = train_epochs(
        model, train, epochs=8, batch_size=32, lr=1e-3, optimizer="adam", seed=0
    )
    after = evaluate(model, test)
    assert result.num_examples == len(train) == 1437
    assert result.steps == 8 * 45 and result.examples_seen == 8 * 1437
    assert after.num_examples == 360
    assert before.accuracy < 0.3
    assert after.accuracy > 0.9, after
    assert after.loss < before.loss


def test_sgd_momentum_training_reduces_loss(digits: tuple[Dataset, Dataset]) -> None:
    train, _ = digits
    model = create_model("logreg", train.input_shape, 10, seed=0)
    first = train_epochs(model, train, epochs=1, lr=0.1, momentum=0.9, seed=0)
    second = train_epochs(model, train, epochs=1, lr=0.1, momentum=0.9, seed=0)
    assert second.mean_loss < first.mean_loss


def test_training_is_deterministic_with_seed(digits: tuple[Dataset, Dataset]) -> None:
    train, _ = digits
    states = []
    for _ in range(2):
        model = create_model("mlp", train.input_shape, 10, seed=1, hidden=(16,))
        res = train_epochs(model, train, epochs=1, batch_size=50, lr=0.05, seed=3)
        states.append((res.mean_loss, [p.detach().clone() for p in model.parameters()]))
    assert states[0][0] == states[1][0]
    for pa, pb in zip(states[0][1], states[1][1], strict=True):
        assert torch.equal(pa, pb)


def test_max_steps_and_mode_restoration(digits: tuple[Dataset, Dataset]) -> None:
    train, test = digits
    model = create_model("mlp", train.input_shape, 10, seed=0, hidden=(16,))
    model.eval()
    res = train_epochs(model, train, epochs=5, batch_size=100, max_steps=3, seed=0)
    assert (res.steps, res.examples_seen) == (3, 300)
    assert not model.training  # restored to eval
    model.train()
    evaluate(model, test, batch_size=7)
    assert model.training  # restored to train
    empty = test.subset([])
    assert evaluate(model, empty).num_examples == 0


def test_training_argument_validation(digits: tuple[Dataset, Dataset]) -> None:
    train, _ = digits
    model = create_model("logreg", train.input_shape, 10)
    with pytest.raises(ValueError, match="unknown optimizer"):
        train_epochs(model, train, optimizer="rmsprop")
    with pytest.raises(ValueError, match="momentum applies to 'sgd'"):
        train_epochs(model, train, optimizer="adam", momentum=0.9)
    with pytest.raises(ValueError, match="lr"):
        train_epochs(model, train, lr=0.0)
    with pytest.raises(ValueError, match="epochs"):
        train_epochs(model, train, epochs=0)
    with pytest.raises(ValueError, match="empty"):
        train_epochs(model, train.subset([]))
    wrong = create_model("logreg", train.input_shape, 3)
    with pytest.raises(ValueError, match=r"expected logits \[32, 10\]"):
        train_epochs(wrong, train)
    with pytest.raises(ValueError, match="expected logits"):
        evaluate(wrong, train)
