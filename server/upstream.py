"""Hierarchical aggregation: an edge coordinator that is a client of a root.

An edge (``fedplat coordinator --upstream ROOT``) serves its own clients like any
coordinator, but it does not loop over rounds on its own: its round driver
(:class:`EdgeDriver`) is an SDK :class:`~fedplat.client.Client` of the root whose
"training" is one round of the edge (in the spirit of LIFL's hierarchical
aggregation, Qi et al., 2024, "LIFL: A Lightweight, Event-driven Serverless
Platform for Federated Learning"):

1. once its own ``min_available`` clients are live, enrol at the root, wait
   for the root's TRAIN task (a long poll) and download its model;
2. install that model as the edge's global model, wait for the edge's
   ``min_available`` clients and open an edge round with the edge's own
   selection, training settings and aggregator;
3. close the edge round when every selected client answered, at the edge's own
   deadline, or ``margin_seconds`` before the root task's deadline, whichever
   comes first;
4. upload one update to the root: the edge's aggregate (``new - root model``),
   with ``num_examples`` the summed weight of the clients whose updates it kept,
   and a summary of the edge round in the update's metrics (``edge.*``: its round
   number, selected / succeeded / failed clients, their bytes up and down). The
   root stores them with the edge's participation (``client.edge.*`` metrics);
   every client's own record (status, bytes, verdict) stays in the edge's store.

Rounds map one to one with tasks: edge round ``n`` answers one root task (the
mapping is an ``upstream_round`` event in the edge's store and the
``edge.round`` metric in the root's). An edge round that fails (no quorum)
uploads nothing: the root counts the edge as dropped, and the edge retries its
round on the root's next task. Deadlines are wall-clock times of the root: edge
and root clocks must agree (NTP).

For weighted FedAvg on both levels the result equals the flat run's: the root's
``sum_e W_e m_e / sum_e W_e`` with ``m_e = sum_i w_i d_i / W_e`` is
``sum_i w_i d_i / sum_i w_i``. That needs the edge to forward the plain mean
(``server_optimizer: fedavg``, ``lr: 1``, constant, no central DP at the edge,
checked by :func:`check_edge_config`) and the root's weight caps
(``aggregator.max_examples_per_client``, the edge token's ``max_examples``, and
``aggregator.weight_bound``: by default 3 times the median size the edges
declared at enrolment, their clients' summed declared examples) to be at least
an edge's summed weight, and no edge's update scaled by the root's norm bound
(3 times the median edge's norm by default). Robust rules compose per level
only; see docs/scale.md, "Hierarchical aggregation".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from fedplat.client import Client, FitResult
from fedplat.server.config import ConfigError, RunConfig
from fedplat.server.context import ModelCache
from fedplat.server.coordinator import Coordinator
from fedplat.server.driver import RoundDriver
from fedplat.server.round import Round
from fedplat.server.runstate import RunState

from fedplat.protocol.errors import FedplatError, StaleUpdate
from fedplat.protocol.messages import Task
from fedplat.vectors import flatten, load_vector

log = logging.getLogger("fedplat.server.upstream")


@dataclass(frozen=True)
class UpstreamSettings:
    """How an edge reaches and enrols at its root."""

    address: str
    state_dir: str  # the edge's identity at the root (kept across restarts)
    name: str = "edge"
    insecure: bool = False
    root_certificates: bytes | None = None
    private_key: bytes | None = None  # mutual TLS at the root
    certificate_chain: bytes | None = None
    enrolment_token: str | None = None
    margin_seconds: float = 5.0  # upload time kept before the root's deadline
    poll_seconds: float = 5.0


def check_edge_config(cfg: RunConfig) -> None:
    """Refuse an edge run file whose rounds would not forward a plain mean."""
    o = cfg.server_optimizer
    if o.name != "fedavg" or o.lr != 1.0 or o.lr_schedule != "constant":
        raise ConfigError(
            "an edge forwards its clients' mean update and the root applies the "
            "server optimizer: give the edge server_optimizer fedavg with lr 1.0 "
            "and a constant schedule"
        )
    if cfg.privacy.mode == "central":
        raise ConfigError(
            "an edge cannot add central DP noise: apply DP at the root or "
            "locally at the clients"
        )


class UpstreamModelCache(ModelCache):
    """The edge's download, keyed by the root model installed for the round (a
    generation counter) instead of the edge's own model version: an edge round
    retried on a newer root model never serves the cached older one."""

    def __init__(self, layout: Any) -> None:
        super().__init__(layout)
        self.generation = 0

    def prepare(self, state: RunState) -> Any:
        return super().prepare(replace(state, model_version=self.generation))


class _RootClient(Client):
    """The edge's SDK client of the root; remembers the task it is handling."""

    task: Task | None = None

    def handle_task(self, task: Task) -> None:
        self.task = task
        try:
            super().handle_task(task)
        finally:
            self.task = None


class EdgeDriver(RoundDriver):
    """Drives the edge's rounds on the root's tasks (see the module docstring)."""

    def __init__(self, base: RoundDriver, settings: UpstreamSettings) -> None:
        super().__init__(base.p, base.registry, base.board, base.intake, base.clock)
        self.settings = settings
        self.cache = UpstreamModelCache(self.p.layout)
        self.p.model = self.cache
        self._stop = threading.Event()
        s = settings
        self.client = _RootClient(
            s.address,
            _model_of(self.p),
            self.edge_round,
            name=s.name,
            enrolment_token=s.enrolment_token,
            insecure=s.insecure,
            root_certificates=s.root_certificates,
            private_key=s.private_key,
            certificate_chain=s.certificate_chain,
            state_dir=s.state_dir,
            poll_seconds=s.poll_seconds,
            info={"role": "edge", "run": self.cfg.run.name},
        )

    # ---------------------------------------------------------------- loop
    def run(self, stop: threading.Event) -> None:
        """Serve root tasks until the root's run finishes or ``stop`` is set."""
        self._stop = stop

        def stop_client() -> None:
            stop.wait()
            self.client.request_stop()

        watcher = threading.Thread(
            target=stop_client,
            name="fedplat-upstream-stop",
            daemon=True,
        )
        watcher.start()
        # The edge offers itself to the root only once it can run a round: a
        # root would otherwise select an edge whose clients are not there yet.
        if not self.gather_clients(stop):
            return
        # The edge's size, declared at enrolment: the root caps each client's
        # weight relative to what the others declared (aggregator.weight_bound).
        self.client.num_examples = min(
            2**31 - 1,
            sum(
                self.registry.weight(c, c.declared_examples)
                for c in self.registry.live()
            ),
        )
        self.phase = "waiting_for_root"
        try:
            self.client.run()
        except (FedplatError, ConnectionError) as exc:
            reason = getattr(exc, "reason", str(exc))
            self.closer.give_up(f"upstream {self.settings.address}: {reason}")
            self.board.finish()
            return
        finally:
            self.phase = "stopped"
        if self.client.finished and not self.finished:
            self._root_finished()

    def _root_finished(self) -> None:
        p = self.p
        p.recorder.event(
            "upstream_finished",
            f"the root's run finished; edge run {self.cfg.run.name!r} is complete",
        )
        p.state.record = p.recorder.finish_run("completed")
        self.board.finish()

    # ---------------------------------------------------------------- a round
    def edge_round(
        self, model: torch.nn.Module, config: Mapping[str, Any]
    ) -> FitResult:
        """The root task's "training": one edge round on the root's model."""
        task = self.client.task
        assert task is not None
        if self.finished:  # the edge's own run.rounds are used up
            self.client.request_stop()
            raise StaleUpdate("the edge's run is finished")
        cutoff = min(
            task.deadline_unix - self.settings.margin_seconds,
            time.time() + self.cfg.deadlines.round_seconds,
        )
        self.cache.generation += 1
        self.p.state.weights = flatten(model, self.p.layout).clone()
        if not self.wait_for_clients(self._stop, max(0.0, cutoff - time.time())):
            raise StaleUpdate(
                f"fewer than {self.cfg.selection.min_available} clients live at "
                f"the edge before root round {task.round}'s deadline"
            )
        number = self.open_round()
        r = self.board.round
        assert r is not None
        self._wait_until(r, cutoff)
        if self._stop.is_set():
            # As the base driver: the round stays open in the store; a
            # restarted edge runs it again on the root's next task.
            self.board.close()
            raise StaleUpdate("the edge is stopping")
        outcome = self.close_round()
        if self.finished:
            self.client.request_stop()
        self.p.recorder.event(
            "upstream_round",
            f"edge round {number} answered root round {task.round}",
            round_number=number,
            details={"root_round": task.round, "root_task": task.task_id},
        )
        if not outcome.completed:
            raise StaleUpdate(f"edge round {number} failed: {outcome.reason}")
        load_vector(model, self.p.state.weights, self.p.layout)
        weight, metrics = self._summary(r)
        return FitResult(weight, metrics)

    def _wait_until(self, r: Round, cutoff: float) -> None:
        while True:
            woken = self.board.signal.wakeup()
            left = cutoff - time.time()
            if self.round_done(r) or self._stop.is_set() or left <= 0:
                return
            woken.wait(max(0.01, min(0.5, left)))

    def _summary(self, r: Round) -> tuple[int, dict[str, float]]:
        """The kept clients' summed weight and the edge round's summary."""
        parts = self.p.reads.list_participations(self.p.run_id, r.number)
        kept = [
            p
            for p in parts
            if p.status == "succeeded" and p.verdict.selected is not False
        ]
        weight = sum(int(r.outcomes[p.client_id].weight) for p in kept)
        by_status: dict[str, int] = {}
        for p in parts:
            by_status[p.status] = by_status.get(p.status, 0) + 1
        metrics = {
            "edge.round": float(r.number),
            "edge.selected": float(len(parts)),
            "edge.kept": float(len(kept)),
            "edge.bytes_up": float(sum(p.bytes_up for p in parts)),
            "edge.bytes_down": float(sum(p.bytes_down for p in parts)),
            **{f"edge.{s}": float(n) for s, n in sorted(by_status.items())},
        }
        return weight, metrics


def _model_of(ctx: Any) -> torch.nn.Module:
    from fedplat.server.evaluation import build_model

    return build_model(ctx.cfg)


def attach_upstream(coord: Coordinator, settings: UpstreamSettings) -> EdgeDriver:
    """Make ``coord`` an edge of the root at ``settings.address``: its round
    driver is replaced by an :class:`EdgeDriver` (before the server starts)."""
    check_edge_config(coord.cfg)
    driver = EdgeDriver(coord.driver, settings)
    coord.driver = driver
    return driver


__all__ = [
    "EdgeDriver",
    "UpstreamModelCache",
    "UpstreamSettings",
    "attach_upstream",
    "check_edge_config",
]
