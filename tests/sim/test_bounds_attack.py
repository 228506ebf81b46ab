"""Issue 23 end to end: one admitted insider against weighted FedAvg on digits,
through the in-process simulator (real enrolment, signed uploads, the intake).

The insider declares the run's maximum example count (at enrolment and with
every update) and, in one round, sends an update of norm ~1e6 (every weight
shifted by the same amount, as ``bench/attackers.py`` does). With the default
bounds the run ends within a point of the run without attack; with both
bounds off the same attack wrecks the model (the test can fail).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from fedplat.client import Client, FitResult
from fedplat.server.config import parse_config

from fedplat.sim import simulate
from fedplat.store import Store
from tests.support import digits_client, run_config

CLIENTS, ROUNDS, ATTACK_ROUND = 8, 10, 3
MAX_EXAMPLES = 100_000  # aggregator.max_examples_per_client's default
ATTACK_NORM = 9.9e5  # just under server.max_update_norm (1e6)


def _insider(i: int, factory: Any) -> Client:
    """Client ``i``: trains honestly on its digits share but declares the run's
    cap, and in round ``ATTACK_ROUND`` sends a norm-``ATTACK_NORM`` update."""
    honest = digits_client(i, factory, CLIENTS)
    d = sum(p.numel() for p in honest.model.parameters())
    shift = ATTACK_NORM / math.sqrt(d)
    rounds, fit = [0], honest.train_fn

    def train(m: torch.nn.Module, config: Mapping[str, Any]) -> FitResult:
        rounds[0] += 1
        if rounds[0] == ATTACK_ROUND:
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(shift)
        else:
            fit(m, config)
        return FitResult(MAX_EXAMPLES, {"train_loss": 1.0})

    honest.train_fn = train
    honest.num_examples = MAX_EXAMPLES
    return honest


def _run(tmp: Path, attack: bool, **aggregator: Any) -> tuple[list[Any], Path]:
    tmp.mkdir()
    cfg = parse_config(
        run_config(tmp, rounds=ROUNDS, clients=CLIENTS, aggregator=aggregator)
    )

    def build(i: int, factory: Any) -> Client:
        if attack and i == CLIENTS - 1:
            return _insider(i, factory)
        return digits_client(i, factory, CLIENTS)

    return simulate(cfg, build, CLIENTS).rounds, Path(cfg.store.url)


def _accuracy(rounds: list[Any]) -> list[float]:
    assert [r.completed for r in rounds] == [True] * ROUNDS, rounds
    return [float(r.accuracy) for r in rounds]


def _late(acc: list[float]) -> float:
    """Mean accuracy of the last three rounds: one round's accuracy on the
    360 held-out digits moves by a point or two from round to round."""
    return sum(acc[-3:]) / 3


def test_one_insider_cannot_wreck_fedavg_with_the_default_bounds(
    tmp_path: Path,
) -> None:
    clean = _accuracy(_run(tmp_path / "clean", attack=False)[0])
    rounds, db = _run(tmp_path / "bounded", attack=True)
    bounded = _accuracy(rounds)
    assert _late(clean) > 0.8, clean
    assert abs(_late(bounded) - _late(clean)) <= 0.01, (clean, bounded)
    # The store says what the bounds did to the insider's update and weight.
    store = Store(str(db), migrate=False)
    run = store.get_run_by_name("test")
    assert run is not None
    names = {c.id: c.name for c in store.list_clients(run.id)}
    flags = {
        names[p.client_id]: p.verdict.flags
        for p in store.list_participations(run.id, ATTACK_ROUND)
    }
    insider = f"c{CLIENTS - 1}"
    assert set(flags.pop(insider)) == {"norm-bounded", "weight-capped"}
    assert all(f == () for f in flags.values()), flags
    store.close()


def test_without_the_bounds_the_same_insider_wrecks_the_model(
    tmp_path: Path,
) -> None:
    rounds, _ = _run(tmp_path / "open", attack=True, norm_bound=None, weight_bound=None)
    # From the attack on, every round ends near chance (10 classes) or fails
    # (honest updates from the wrecked model exceed server.max_update_norm);
    # the run without attack is past 0.7 by then.
    after = rounds[ATTACK_ROUND - 1 :]
    assert after[0].completed and after[0].accuracy < 0.2, after
    assert all(not r.completed or r.accuracy < 0.2 for r in after), after
