"""The round engine: selection, tasks, update collection, aggregation, checkpoints.

The engine is transport-neutral. Client-facing methods (:meth:`RoundEngine.enroll`,
:meth:`get_task`, :meth:`download_model`, :meth:`upload_update`,
:meth:`report_metrics`) are called by the gRPC servicer or directly by the in-memory
transport; the round lifecycle (:meth:`open_round`, :meth:`wait_round`,
:meth:`close_round`) is driven either by :meth:`run` (deployment: a background loop
with deadlines) or step by step by the simulator. Domain errors from
:mod:`fedplat.transport.errors` carry the reason a client sees.

Round ``r`` trains on model version ``r - 1``; completing it produces version ``r``.
Everything a monitor would show (rounds, participations, metrics, events) is written
to the store as it happens.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import torch
from fedplat.aggregators import (
    AggregationError,
    AggregationResult,
    Aggregator,
    FedAvg,
    build_aggregator,
)
from fedplat.server.checkpoint import Checkpoint as CheckpointData
from fedplat.server.checkpoint import (
    CheckpointError,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from fedplat.server.config import ConfigError, RunConfig
from fedplat.server.evaluation import Evaluator, build_model, validate_run
from fedplat.server.optimizers import ServerOptimizer
from fedplat.server.uplink import UplinkPlan

from fedplat.compression import derive_seed
from fedplat.contribution import (
    ContributionAccountant,
    ContributionError,
    load_or_create_signing_key,
    make_utility_from_metric,
)
from fedplat.store import RunRecord, Store
from fedplat.transport import codec
from fedplat.transport.errors import (
    DuplicateUpdate,
    InvalidArgument,
    StaleUpdate,
    Unauthenticated,
    UnknownClient,
)
from fedplat.transport.messages import (
    Enrollment,
    EnrollRequest,
    ModelPayload,
    Task,
    TaskKind,
    UpdateHeader,
    UploadAck,
)
from fedplat.vectors import Layout, flatten, layout_of

log = logging.getLogger("fedplat.server")

MAX_EXAMPLES_PER_UPDATE = 10**12


def _now() -> datetime:
    return datetime.now(UTC)


def _hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass
class _Client:
    client_id: str
    name: str
    num_examples: int
    token_hash: bytes
    last_poll: float
    last_touch: float = 0.0
    # Enrolment order in this process: clients are selected from, and their
    # updates stacked in, this order, so a seeded simulation is reproducible
    # (client ids are random tokens).
    seq: int = 0


@dataclass
class _Update:
    vector: torch.Tensor
    num_examples: int
    metrics: dict[str, float]
    nbytes: int


@dataclass
class _Round:
    number: int
    attempt: int
    opened_at: float
    deadline: float
    tasks: dict[str, str]  # client_id -> task_id
    updates: dict[str, _Update] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    downloaded_at: dict[str, float] = field(default_factory=dict)
    num_live: int = 0

    @property
    def selected(self) -> set[str]:
        return set(self.tasks)


@dataclass(frozen=True)
class RoundOutcome:
    """What :meth:`RoundEngine.close_round` did."""

    number: int
    completed: bool
    num_selected: int
    num_succeeded: int
    accuracy: float | None = None
    loss: float | None = None
    reason: str | None = None


def _build_aggregator(cfg: RunConfig) -> Aggregator:
    a = cfg.aggregator
    return build_aggregator(
        a.name,
        dict(a.params),
        [{"name": p.name, "params": dict(p.params)} for p in a.pre],
    )


class RoundEngine:
    """Coordinator state machine for one run (see module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        store: Store,
        *,
        evaluator: Evaluator | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # Before anything is stored or any client selected: a model that does not
        # fit its evaluation data is a ConfigError now, not a crash after round 1.
        validate_run(cfg)
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self._cond = threading.Condition(threading.RLock())
        self._clients: dict[str, _Client] = {}
        self._next_seq = 0
        self._round: _Round | None = None
        self._closed_tasks: dict[
            str, int
        ] = {}  # task_id -> round, for clear "late" errors
        self._attempt = 1
        self._waiters = 0
        self._max_waiters = max(1, cfg.server.max_workers // 2)
        try:
            self.aggregator = _build_aggregator(cfg)
        except (AggregationError, ValueError) as exc:
            raise ConfigError(f"aggregator: {exc}") from exc
        self.optimizer = ServerOptimizer(cfg.server_optimizer, cfg.run.rounds)
        model = build_model(cfg)
        self.layout: Layout = layout_of(model)
        self.uplink = UplinkPlan(cfg, self.layout)
        self.evaluator = (
            evaluator if evaluator is not None else Evaluator.from_config(cfg, model)
        )
        self.weights = flatten(model, self.layout)
        self.model_version = 0
        self.finished = False
        self.run_record = self._open_run()
        self._refresh_model_bytes()
        self.contribution: ContributionAccountant | None = None
        c = cfg.contribution
        if c.enabled:
            key = load_or_create_signing_key(c.key_path) if c.key_path else None
            self.contribution = ContributionAccountant(c, store, self.run_id, key)
            self._contribution_utility = make_utility_from_metric(
                self.evaluator, c.utility
            )

    # ------------------------------------------------------------------ run state
    @property
    def run_id(self) -> str:
        return self.run_record.id

    def _open_run(self) -> RunRecord:
        cfg, store = self.cfg, self.store
        existing = store.get_run_by_name(cfg.run.name)
        config_json = cfg.model_dump(mode="json")
        if existing is None:
            run = store.create_run(
                cfg.run.name, config_json, self.layout.to_dict(), cfg.run.rounds
            )
            store.add_event(
                run.id,
                "run_created",
                f"run {cfg.run.name!r}: {cfg.run.rounds} rounds, "
                f"model {cfg.model.label} ({self.layout.numel} parameters)",
            )
            return run
        stored_layout = Layout.from_dict(existing.layout)
        if stored_layout != self.layout:
            raise ConfigError(
                f"run {cfg.run.name!r} already exists with another model layout "
                f"({stored_layout.describe_mismatch(self.layout)}); "
                "choose a new run name"
            )
        last = store.last_completed_round(existing.id)
        if last is not None:
            if last.checkpoint_path is None:
                raise CheckpointError(
                    f"round {last.number} completed without a checkpoint"
                )
            ckpt = load_checkpoint(
                last.checkpoint_path,
                expected_sha256=last.checkpoint_sha256,
                expected_layout=self.layout,
            )
            self.weights = ckpt.weights.clone()
            self.optimizer.load_state_dict(ckpt.optimizer_state)
            self.aggregator.load_state_dict(ckpt.aggregator_state)
            self.uplink.load_state(ckpt.extra)
            self.model_version = ckpt.model_version
        done = last.number if last is not None else 0
        if existing.total_rounds != cfg.run.rounds:
            log.warning(
                "run %s: stored total rounds %d, config says %d; using the config",
                cfg.run.name,
                existing.total_rounds,
                cfg.run.rounds,
            )
        if done >= cfg.run.rounds:
            self.finished = True
            if existing.status != "completed":
                existing = store.update_run(
                    existing.id, status="completed", finished_at=_now()
                )
        else:
            store.add_event(
                existing.id,
                "run_resumed",
                f"resuming run {cfg.run.name!r} after round {done}",
            )
            log.info("resuming run %s after round %d", cfg.run.name, done)
        return existing

    def _refresh_model_bytes(self) -> None:
        data = codec.encode_dense(self.weights)
        self._model = ModelPayload(
            model_version=self.model_version,
            round=self.model_version,
            layout=self.layout,
            data=data,
            sha256=codec.sha256_hex(data),
        )

    @property
    def completed_rounds(self) -> int:
        return self.model_version

    # ------------------------------------------------------------ client-facing
    def enroll(self, req: EnrollRequest) -> Enrollment:
        if req.layout != self.layout:
            reason = self.layout.describe_mismatch(req.layout)
            self.store.add_event(
                self.run_id,
                "enrolment_refused",
                f"client {req.name!r}: model layout mismatch: {reason}",
                level="warning",
            )
            raise InvalidArgument(
                f"model layout does not match run {self.cfg.run.name!r}: {reason}"
            )
        token = secrets.token_urlsafe(32)
        client_id = req.client_id
        known = self.store.get_client(self.run_id, client_id) if client_id else None
        if known is None or known.name != req.name:
            client_id = secrets.token_hex(8)
        # Persist first: once the client is in memory the driver may select it, and
        # the store refuses rounds with clients it does not know.
        self.store.upsert_client(
            self.run_id,
            client_id,
            name=req.name,
            num_examples=req.num_examples,
            info=dict(req.info),
            status="active",
        )
        with self._cond:
            prev = self._clients.get(client_id)
            if prev is not None:
                seq = prev.seq
            else:
                seq = self._next_seq
                self._next_seq += 1
            self._clients[client_id] = _Client(
                client_id,
                req.name,
                req.num_examples,
                _hash_token(token),
                self.clock(),
                seq=seq,
            )
        self.store.add_event(
            self.run_id,
            "client_enrolled",
            f"client {req.name!r} enrolled ({req.num_examples} examples)",
            client_id=client_id,
        )
        s = self.cfg.server
        with self._cond:
            self._cond.notify_all()
        return Enrollment(
            client_id=client_id,
            token=token,
            run_id=self.run_id,
            run_name=self.cfg.run.name,
            layout=self.layout,
            max_message_bytes=s.max_message_bytes,
            max_update_bytes=s.max_update_bytes,
        )

    def _auth(self, client_id: str, token: str) -> _Client:
        c = self._clients.get(client_id)
        if c is None:
            raise UnknownClient(
                f"client {client_id!r} is not enrolled in this run; enroll"
            )
        if not hmac.compare_digest(c.token_hash, _hash_token(token)):
            raise Unauthenticated("bad client token")
        return c

    def authenticate(self, client_id: str, token: str) -> None:
        """Raise unless the credentials belong to an enrolled client."""
        with self._cond:
            self._auth(client_id, token)

    def reject_upload(self, client_id: str, reason: str, nbytes: int) -> None:
        """Record an upload refused before decoding (malformed or oversize stream)."""
        with self._cond:
            c = self._clients.get(client_id)
            r = self._round
            number = r.number if r is not None and client_id in r.tasks else None
            if number is not None and r is not None and client_id not in r.answered:
                self.store.update_participation(
                    self.run_id,
                    number,
                    client_id,
                    status="rejected",
                    reason=reason,
                    bytes_up=nbytes,
                )
                r.answered.add(client_id)
                self._cond.notify_all()
        name = c.name if c is not None else client_id
        self.store.add_event(
            self.run_id,
            "update_rejected",
            f"update from {name!r} rejected: {reason}",
            level="warning",
            round_number=number,
            client_id=client_id,
            details={"status": "rejected"},
        )

    def _touch(self, c: _Client) -> None:
        now = self.clock()
        c.last_poll = now
        # Throttled: long-polling clients would otherwise write on every poll.
        if now - c.last_touch > 5.0:
            c.last_touch = now
            self.store.touch_client(self.run_id, c.client_id)

    def _task_for(self, client_id: str) -> Task | None:
        r = self._round
        if r is None or client_id not in r.tasks or client_id in r.answered:
            return None
        return Task(
            kind=TaskKind.TRAIN,
            run_id=self.run_id,
            round=r.number,
            task_id=r.tasks[client_id],
            model_version=self.model_version,
            deadline_unix=r.deadline,
            config={
                **self.cfg.client_training.model_dump(mode="json"),
                **self.uplink.task_config(),
                # Seed for the client's own randomness (batch order, dropout): a
                # function of the run seed, the round and the client's name, so
                # a seeded run can be replayed.
                "seed": derive_seed(
                    self.cfg.run.seed % (1 << 64),
                    r.number,
                    "train",
                    self._clients[client_id].name,
                )
                % (1 << 63),
            },
        )

    def get_task(self, client_id: str, token: str, wait_seconds: float = 0.0) -> Task:
        wait_seconds = max(0.0, min(wait_seconds, self.cfg.server.long_poll_seconds))
        with self._cond:
            c = self._auth(client_id, token)
            self._touch(c)
            self._cond.notify_all()  # the driver may be waiting for live clients
            if self.finished:
                return Task(kind=TaskKind.FINISHED, run_id=self.run_id)
            task = self._task_for(client_id)
            if task is not None:
                return task
            if wait_seconds > 0 and self._waiters >= self._max_waiters:
                # Every held long poll occupies an RPC worker thread; past half the
                # pool, tell the client to come back instead, so uploads and
                # downloads never queue behind idle polls.
                return Task(
                    kind=TaskKind.WAIT,
                    run_id=self.run_id,
                    retry_after=0.5 + random.random(),
                )
            end = time.monotonic() + wait_seconds
            self._waiters += 1
            try:
                while True:
                    if self.finished:
                        return Task(kind=TaskKind.FINISHED, run_id=self.run_id)
                    task = self._task_for(client_id)
                    if task is not None:
                        return task
                    left = end - time.monotonic()
                    if left <= 0:
                        return Task(kind=TaskKind.WAIT, run_id=self.run_id)
                    self._cond.wait(timeout=min(left, 1.0))
                    c.last_poll = self.clock()
            finally:
                self._waiters -= 1

    def _check_task(self, client_id: str, task_id: str) -> _Round:
        r = self._round
        if r is None or r.tasks.get(client_id) != task_id:
            closed = self._closed_tasks.get(task_id)
            if closed is not None:
                raise StaleUpdate(f"round {closed} is closed; task {task_id} is over")
            raise StaleUpdate(f"task {task_id!r} is not an open task of this client")
        return r

    def download_model(self, client_id: str, token: str, task_id: str) -> ModelPayload:
        with self._cond:
            c = self._auth(client_id, token)
            self._touch(c)
            r = self._check_task(client_id, task_id)
            r.downloaded_at.setdefault(client_id, self.clock())
            payload, number = self._model, r.number
        self.store.update_participation(
            self.run_id,
            number,
            client_id,
            status="downloaded",
            bytes_down=len(payload.data),
        )
        return payload

    def upload_update(
        self, client_id: str, token: str, header: UpdateHeader, data: bytes
    ) -> UploadAck:
        with self._cond:
            c = self._auth(client_id, token)
            self._touch(c)
            r = self._round
            if (
                r is not None
                and r.tasks.get(client_id) == header.task_id
                and (client_id in r.answered)
            ):
                raise DuplicateUpdate(
                    f"an update for task {header.task_id} (round {r.number}) "
                    "was already "
                    "received"
                )
            try:
                r = self._check_task(client_id, header.task_id)
            except StaleUpdate as exc:
                self.store.add_event(
                    self.run_id,
                    "update_rejected",
                    f"late or stale update: {exc.reason}",
                    level="warning",
                    client_id=client_id,
                    round_number=self._closed_tasks.get(header.task_id),
                    details={"status": "late"},
                )
                closed = self._closed_tasks.get(header.task_id)
                if closed is not None:
                    self.store.update_participation(
                        self.run_id,
                        closed,
                        client_id,
                        status="late",
                        reason=exc.reason,
                        bytes_up=len(data),
                    )
                raise
            number = r.number
            late = self.clock() > r.deadline
        try:
            if late:
                raise StaleUpdate(f"round {number} deadline passed")
            if header.round != number:
                raise StaleUpdate(
                    f"update is for round {header.round}, open round is {number}"
                )
            if header.layout != self.layout:
                raise InvalidArgument(
                    "update layout does not match the model: "
                    f"{self.layout.describe_mismatch(header.layout)}"
                )
            if header.num_examples > MAX_EXAMPLES_PER_UPDATE:
                raise InvalidArgument(
                    f"num_examples {header.num_examples} is implausible"
                )
            if header.num_examples == 0 and self.cfg.aggregator.weighted:
                raise InvalidArgument(
                    "num_examples must be >= 1 for a weighted aggregator"
                )
            if header.encoding == codec.PAYLOAD_V1:
                vec = self.uplink.decode(data, number)
                codec.check_finite(vec)
            else:
                vec = codec.decode(
                    header.encoding, data, self.layout.numel, header.encoding_params
                )
        except (InvalidArgument, StaleUpdate) as exc:
            status = "late" if isinstance(exc, StaleUpdate) else "rejected"
            with self._cond:
                self.store.update_participation(
                    self.run_id,
                    number,
                    client_id,
                    status=status,
                    reason=exc.reason,
                    bytes_up=len(data),
                )
                if self._round is r:
                    r.answered.add(client_id)
                    self._cond.notify_all()
            self.store.add_event(
                self.run_id,
                "update_rejected",
                f"update from {c.name!r} rejected: {exc.reason}",
                level="warning",
                round_number=number,
                client_id=client_id,
                details={"status": status},
            )
            raise
        with self._cond:
            if self._round is not r:
                raise StaleUpdate(f"round {number} closed while the update was decoded")
            if client_id in r.answered:
                raise DuplicateUpdate(
                    f"an update for round {number} was already received"
                )
            r.updates[client_id] = _Update(
                vec, header.num_examples, dict(header.metrics), len(data)
            )
            r.answered.add(client_id)
            started = r.downloaded_at.get(client_id, r.opened_at)
            # Recorded under the lock: close_round must not total the round before
            # this accepted update is in the store.
            self.store.update_participation(
                self.run_id,
                number,
                client_id,
                status="succeeded",
                bytes_up=len(data),
                num_examples=header.num_examples,
                duration_s=self.clock() - started,
                train_loss=header.metrics.get("train_loss"),
            )
            self._cond.notify_all()
        return UploadAck(
            accepted=True,
            message=f"update for round {number} accepted",
            bytes_received=len(data),
        )

    def report_metrics(
        self,
        client_id: str,
        token: str,
        task_id: str,
        round_number: int,
        metrics: dict[str, float],
    ) -> None:
        with self._cond:
            self._auth(client_id, token)
        if metrics:
            self.store.add_metrics(
                self.run_id,
                {f"client.{k}": v for k, v in metrics.items()},
                round_number=round_number,
                client_id=client_id,
            )

    # ------------------------------------------------------------ round lifecycle
    def live_clients(self) -> list[str]:
        now = self.clock()
        ttl = self.cfg.deadlines.liveness_seconds
        with self._cond:
            return self._in_enrolment_order(
                cid for cid, c in self._clients.items() if now - c.last_poll <= ttl
            )

    def _in_enrolment_order(self, ids: Iterable[str]) -> list[str]:
        def key(cid: str) -> tuple[int, str]:
            c = self._clients.get(cid)
            return (c.seq if c is not None else self._next_seq, cid)

        return sorted(ids, key=key)

    def wait_for_clients(
        self, stop: threading.Event, timeout: float | None = None
    ) -> bool:
        """Block until ``min_available`` clients are live (or stop/timeout)."""
        end = None if timeout is None else time.monotonic() + timeout
        need = self.cfg.selection.min_available
        logged = False
        with self._cond:
            while not stop.is_set():
                if len(self.live_clients()) >= need:
                    return True
                if not logged:
                    log.info(
                        "waiting for %d clients (%d live)",
                        need,
                        len(self.live_clients()),
                    )
                    logged = True
                if end is not None and time.monotonic() >= end:
                    return False
                self._cond.wait(timeout=0.5)
        return False

    def open_round(self) -> int:
        """Select clients and publish tasks for the next round; returns its number."""
        with self._cond:
            if self.finished:
                raise RuntimeError("run is finished")
            if self._round is not None:
                raise RuntimeError(f"round {self._round.number} is still open")
            number = self.model_version + 1
            live = self.live_clients()
            k = self.cfg.clients_this_round(len(live))
            rng = random.Random(f"{self.cfg.run.seed}:{number}:{self._attempt}")
            selected = self._in_enrolment_order(rng.sample(live, k)) if k > 0 else []
            now = self.clock()
            deadline = now + self.cfg.deadlines.round_seconds
            tasks = {cid: secrets.token_hex(8) for cid in selected}
            attempt = self._attempt
        if number == 1 and attempt == 1 and self.run_record.status == "pending":
            self.run_record = self.store.update_run(
                self.run_id, status="running", started_at=_now()
            )
        elif self.run_record.status != "running":
            self.run_record = self.store.update_run(self.run_id, status="running")
        # Record the round before publishing it: a task handed out must exist in the
        # store when the client's download or upload is recorded.
        self.store.start_round(
            self.run_id,
            number,
            selected=selected,
            deadline_at=datetime.fromtimestamp(deadline, UTC),
            model_version=self.model_version,
        )
        self.store.add_event(
            self.run_id,
            "round_opened",
            f"round {number} (attempt {attempt}): "
            f"{len(selected)} of {len(live)} live clients selected",
            round_number=number,
        )
        with self._cond:
            self._round = _Round(
                number, attempt, now, deadline, tasks, num_live=len(live)
            )
            self._cond.notify_all()
        log.info("round %d opened: %d clients selected", number, len(selected))
        return number

    def _round_done(self, r: _Round) -> bool:
        now = self.clock()
        if now >= r.deadline or r.answered >= r.selected:
            return True
        extra = self.cfg.deadlines.close_after_quorum_seconds
        return (
            extra is not None
            and len(r.updates) >= self.cfg.selection.quorum
            and now - r.opened_at >= extra
        )

    def wait_round(self, stop: threading.Event | None = None) -> None:
        """Block until every selected client answered, or the deadline passed."""
        with self._cond:
            r = self._round
            if r is None:
                return
            while not self._round_done(r) and not (stop is not None and stop.is_set()):
                self._cond.wait(timeout=max(0.01, min(0.5, r.deadline - self.clock())))

    def close_round(self) -> RoundOutcome:
        """Aggregate if quorum was reached; record everything; advance the model."""
        with self._cond:
            r = self._round
            if r is None:
                raise RuntimeError("no open round")
            self._round = None
            for tid in r.tasks.values():
                self._closed_tasks[tid] = r.number
            if len(self._closed_tasks) > 100_000:  # bounded memory on long runs
                for tid in list(self._closed_tasks)[:50_000]:
                    del self._closed_tasks[tid]
            self._cond.notify_all()
        for cid in sorted(r.selected - r.answered):
            self.store.update_participation(
                self.run_id,
                r.number,
                cid,
                status="dropped",
                reason="no update before the round closed",
            )
            self.store.add_event(
                self.run_id,
                "client_dropped",
                f"client {self._clients[cid].name!r} sent no update in "
                f"round {r.number}",
                level="warning",
                round_number=r.number,
                client_id=cid,
            )
        quorum = self.cfg.selection.quorum
        if len(r.updates) < quorum:
            return self._fail_round(
                r, f"quorum not reached: {len(r.updates)} updates, {quorum} needed"
            )
        with self._cond:
            ids = self._in_enrolment_order(r.updates)
        stack = torch.stack([r.updates[cid].vector for cid in ids])
        weights = (
            torch.tensor([float(r.updates[cid].num_examples) for cid in ids])
            if self.cfg.aggregator.weighted
            else None
        )
        stack, clipped = self.uplink.clip_for_central(stack)
        global_before = self.weights
        optimizer_before = self.optimizer.state_dict()
        try:
            result = self.aggregator(stack, weights)
            aggregate = self.uplink.noise_mean(
                result.aggregate.to(torch.float32), len(ids)
            )
            new_weights = self.optimizer.step(self.weights, aggregate, r.number)
        except AggregationError as exc:
            return self._fail_round(r, f"aggregation failed: {exc}")
        if not bool(torch.isfinite(new_weights).all()):
            return self._fail_round(r, "aggregation produced non-finite weights")
        for d in result.decisions:
            cid = ids[d.index]
            self.store.update_participation(
                self.run_id,
                r.number,
                cid,
                weight=d.weight,
                flags={
                    "selected": d.selected,
                    "score": d.score,
                    "flags": [*d.flags, *(["dp-clipped"] if clipped[d.index] else [])],
                },
            )
        accuracy = loss = None
        eval_values: dict[str, float] = {}
        if r.number % self.cfg.data.eval_every == 0 or r.number == self.cfg.run.rounds:
            ev = self.evaluator(new_weights)
            accuracy, loss, eval_values = ev.accuracy, ev.loss, ev.as_metrics()
        if self.contribution is not None:
            self._account(
                r.number, ids, stack, weights, global_before, optimizer_before, result
            )
        privacy_metrics = self.uplink.account(len(r.selected), r.num_live)
        ckpt = CheckpointData(
            run_id=self.run_id,
            round=r.number,
            model_version=r.number,
            layout=self.layout,
            weights=new_weights,
            optimizer_state=self.optimizer.state_dict(),
            aggregator_state=self.aggregator.state_dict(),
            extra=self.uplink.state(),
        )
        path, sha = save_checkpoint(self.cfg.checkpoints.dir, ckpt)
        self.store.finish_round(
            self.run_id,
            r.number,
            status="completed",
            accuracy=accuracy,
            loss=loss,
            checkpoint_path=path,
            checkpoint_sha256=sha,
        )
        prune_checkpoints(
            self.cfg.checkpoints.dir,
            self.run_id,
            self.cfg.checkpoints.keep_last,
            protect={path},
        )
        metrics = {
            "round_seconds": self.clock() - r.opened_at,
            "num_updates": float(len(ids)),
            "update_norm": float(result.aggregate.norm()),
            "server_lr": self.optimizer.lr_at(r.number),
            **privacy_metrics,
            **eval_values,
        }
        sent = sum(r.updates[c].nbytes for c in ids)
        if sent > 0:
            # Dense float32 bytes of the same updates over what was actually sent.
            metrics["compression.ratio"] = 4.0 * self.layout.numel * len(ids) / sent
            metrics["uplink_bytes"] = float(sent)
        train_losses = [
            r.updates[c].metrics["train_loss"]
            for c in ids
            if "train_loss" in r.updates[c].metrics
        ]
        if train_losses:
            metrics["train_loss"] = sum(train_losses) / len(train_losses)
        self.store.add_metrics(self.run_id, metrics, round_number=r.number)
        with self._cond:
            self.weights = new_weights
            self.model_version = r.number
            self._attempt = 1
            self._refresh_model_bytes()
            if r.number >= self.cfg.run.rounds:
                self.finished = True
            self._cond.notify_all()
        msg = f"round {r.number} completed with {len(ids)} updates"
        if accuracy is not None:
            msg += f"; accuracy {accuracy:.4f}, loss {loss:.4f}"
        self.store.add_event(self.run_id, "round_completed", msg, round_number=r.number)
        log.info(msg)
        if self.finished:
            self.run_record = self.store.update_run(
                self.run_id, status="completed", finished_at=_now()
            )
            self.store.add_event(
                self.run_id, "run_completed", f"run {self.cfg.run.name!r} completed"
            )
        return RoundOutcome(r.number, True, len(r.selected), len(ids), accuracy, loss)

    def _account(
        self,
        number: int,
        ids: list[str],
        stack: torch.Tensor,
        weights: torch.Tensor | None,
        global_before: torch.Tensor,
        optimizer_before: dict[str, torch.Tensor],
        result: AggregationResult,
    ) -> None:
        """Contribution scores, flags and the ledger entry of a completed round."""
        assert self.contribution is not None

        def subset_global(u: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
            # The global model a subset of clients would have produced, from the
            # pre-round optimizer state: no side effects on the real optimizer.
            opt = ServerOptimizer(self.cfg.server_optimizer, self.cfg.run.rounds)
            opt.load_state_dict(optimizer_before)
            agg = FedAvg()(u, w).aggregate.to(torch.float32)
            return opt.step(global_before, agg, number)

        try:
            self.contribution.on_round(
                number,
                ids,
                stack,
                weights,
                global_before,
                subset_global,
                self._contribution_utility,
                result.decisions,
                None,
                None,
                aggregate=result.aggregate,
            )
        except ContributionError as exc:
            log.warning("round %d: no contribution accounting: %s", number, exc)

    def _fail_round(self, r: _Round, reason: str) -> RoundOutcome:
        self.store.finish_round(self.run_id, r.number, status="failed", reason=reason)
        if r.updates and self.uplink.mode == "local":
            # Under local DP every upload is a noised release whether or not the
            # round completes: the accountant counts it. (Central DP releases
            # nothing from a failed round.) Its state reaches the store with the
            # next checkpoint; the metrics are stored now.
            self.store.add_metrics(
                self.run_id,
                self.uplink.account(len(r.selected), r.num_live),
                round_number=r.number,
            )
        self.store.add_event(
            self.run_id,
            "round_failed",
            f"round {r.number}: {reason}",
            level="warning",
            round_number=r.number,
        )
        log.warning("round %d failed: %s", r.number, reason)
        with self._cond:
            self._attempt += 1
            if self._attempt > self.cfg.deadlines.max_round_attempts:
                self.finished = True
            self._cond.notify_all()
        if self.finished:
            self.run_record = self.store.update_run(
                self.run_id, status="failed", finished_at=_now()
            )
            self.store.add_event(
                self.run_id,
                "run_failed",
                f"round {r.number} failed "
                f"{self.cfg.deadlines.max_round_attempts} times",
                level="error",
                round_number=r.number,
            )
        return RoundOutcome(
            r.number, False, len(r.selected), len(r.updates), reason=reason
        )

    def run(self, stop: threading.Event) -> None:
        """Drive rounds until the run finishes or ``stop`` is set."""
        while not stop.is_set() and not self.finished:
            if not self.wait_for_clients(stop):
                break
            self.open_round()
            self.wait_round(stop)
            if stop.is_set():
                # Shutting down mid-round: leave it open in the store; a restart
                # re-runs this round from the last checkpoint.
                with self._cond:
                    self._round = None
                    self._cond.notify_all()
                break
            self.close_round()
        with self._cond:
            self._cond.notify_all()
