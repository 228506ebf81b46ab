"""In-process reference clients for tests."""

from __future__ import annotations

from typing import Any


def digits_client(
    i: int,
    factory: Any,
    num_partitions: int,
    *,
    label_flip: bool = False,
    **client_kw: Any,
) -> Any:
    """In-process client ``c{i}`` of a digits run: partition ``i`` of
    ``num_partitions``, the 64-unit MLP of ``run_config``, trained by the reference
    train function and connected through ``factory``. ``client_kw`` goes to
    :class:`fedplat.client.Client` (``state_dir``, ``middleware``, ...)."""
    from fedplat.client import Client

    from fedplat.reference.clients import ReferenceSpec, reference_parts

    p = reference_parts(
        ReferenceSpec(
            dataset="digits",
            model="mlp",
            model_params={"hidden": [64]},
            num_partitions=num_partitions,
            partition_id=i,
            label_flip=label_flip,
        )
    )
    return Client(
        None,
        p.model,
        p.train,
        num_examples=p.num_examples,
        connection_factory=factory,
        name=f"c{i}",
        **client_kw,
    )
