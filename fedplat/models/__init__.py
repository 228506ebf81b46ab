"""Reference models, the model registry, and local train / evaluate helpers."""

from fedplat.models.training import (
    OPTIMIZERS,
    EvalResult,
    TrainResult,
    evaluate,
    make_optimizer,
    train_epochs,
)
from fedplat.models.zoo import (
    CNN,
    MLP,
    LogisticRegression,
    ModelFactory,
    ModelSpecError,
    available_models,
    build_from_factory,
    create_model,
    register_model,
    resolve_model_factory,
)

__all__ = [
    "CNN",
    "MLP",
    "OPTIMIZERS",
    "EvalResult",
    "LogisticRegression",
    "ModelFactory",
    "ModelSpecError",
    "TrainResult",
    "available_models",
    "build_from_factory",
    "create_model",
    "evaluate",
    "make_optimizer",
    "register_model",
    "resolve_model_factory",
    "train_epochs",
]
