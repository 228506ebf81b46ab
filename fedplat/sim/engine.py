"""The coordinator of a simulation and its round loop, shared by every backend.

A simulated run drives the real :class:`~fedplat.server.coordinator.Coordinator`
step by step on a :class:`VirtualClock`. Two things a deployment gets from time
passing are supplied by the simulator instead:

- **Admission rate.** Enrolment is rate-limited (``admission.enrol_per_second``);
  virtual clients arrive at exactly that rate: each enrolment challenge advances
  the virtual clock by ``1 / enrol_per_second``, so 10,000 clients enrol in
  200 virtual seconds and none is refused.
- **Liveness.** A deployed client that is not selected keeps itself live with
  long polls. Simulated clients are all available (as the in-process simulator
  always assumed); instead of a poll per client and round, the simulator refreshes
  every enrolled client's liveness in the registry when half of
  ``deadlines.liveness_seconds`` has passed on the virtual clock. A client that is
  not selected therefore costs nothing in a round: no call, no model, no data.

Each round the selected clients (and only they) are stepped once: one task
poll, the download, local training and the signed upload, through whichever
transport the backend uses (in-memory, or Ray). A simulation that crashes
(enrolment, a client's training, the round loop) marks its run ``failed`` in
the store with the reason, as a deployed coordinator does (:func:`fail_run`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedplat.client import Client
from fedplat.protocol.errors import ResourceExhausted, Unauthenticated, UnknownClient
from fedplat.protocol.messages import Challenge, Enrollment, EnrollRequest
from fedplat.server.config import RunConfig
from fedplat.server.coordinator import Coordinator, RoundOutcome
from fedplat.server.evaluation import Evaluator
from fedplat.server.recorder import Recorder
from fedplat.server.registry import PeerIdentity
from fedplat.server.round import Round
from fedplat.store import Store

log = logging.getLogger("fedplat.sim")

#: Virtual seconds a round lasts (its deadline never passes on the virtual clock).
ROUND_SECONDS = 1.0


class VirtualClock:
    """A clock that moves only when told to (seconds since the epoch)."""

    def __init__(self, start: float = 1.7e9) -> None:
        self.t = start
        self._lock = threading.Lock()  # Ray hosts enrol from several threads

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds


class VirtualCoordinator(Coordinator):
    """A coordinator on a virtual clock, with the simulator's stand-ins for the
    admission rate and the liveness polls (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        store: Store,
        *,
        evaluator: Evaluator | None = None,
        clock: VirtualClock | None = None,
    ) -> None:
        self.vclock = clock or VirtualClock()
        super().__init__(cfg, Recorder(store), evaluator=evaluator, clock=self.vclock)
        self._enrolled_ids: dict[str, None] = {}  # in enrolment order
        self._refreshed = float("-inf")

    def challenge(self, client_id: str = "") -> Challenge:
        self.vclock.advance(1.0 / self.cfg.admission.enrol_per_second)
        return super().challenge(client_id)

    def enroll(
        self, req: EnrollRequest, peer: PeerIdentity | None = None
    ) -> Enrollment:
        e = super().enroll(req, peer)
        self._enrolled_ids[e.client_id] = None
        return e

    @property
    def enrolled(self) -> int:
        return len(self._enrolled_ids)

    def keep_alive(self) -> None:
        """Refresh every enrolled client's liveness when it is due."""
        now = self.vclock()
        if now - self._refreshed < self.cfg.deadlines.liveness_seconds / 2:
            return
        for cid in self._enrolled_ids:
            c = self.registry.get(cid)
            if c is not None:
                self.registry.touch(c)
        self._refreshed = now

    def selected(self) -> list[str]:
        """The open round's selected client ids, in row order."""
        r = self.current_round
        if r is None:
            return []
        return [
            a.client_id for a in sorted(r.assignments.values(), key=lambda a: a.row)
        ]


@dataclass(frozen=True)
class SimulationResult:
    run_id: str
    rounds: list[RoundOutcome]

    @property
    def final_accuracy(self) -> float | None:
        done = [
            r.accuracy for r in self.rounds if r.completed and r.accuracy is not None
        ]
        return done[-1] if done else None


def fail_run(coord: Coordinator, error: BaseException | str) -> str:
    """Mark ``coord``'s run failed after ``error`` (an exception, or its
    ``"Type: message"`` from another process) stopped the simulation, unless the
    run already ended, through the closer a deployed coordinator's crashed
    driver uses; returns the reason stored."""
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    reason = f"the simulation crashed: {' '.join(error.split())}"
    try:
        if coord.run_record.status not in ("completed", "failed"):
            coord.driver.closer.give_up(reason)
            coord.board.finish()
    except Exception:
        log.exception("could not record the crash in the store")
    return reason


#: Attempts, and seconds between them, of an enrolment the coordinator asks
#: to retry (a token created after it last read the store: "retry in a second").
ENROL_ATTEMPTS = 30
ENROL_RETRY_SECONDS = 0.5


def enrol(client: Client, sleep: Callable[[float], None] = time.sleep) -> None:
    """``client.enroll()``, retried while the coordinator answers
    RESOURCE_EXHAUSTED (as the SDK's own run loop does), at most
    :data:`ENROL_ATTEMPTS` times; any other refusal is raised at once."""
    for attempt in range(ENROL_ATTEMPTS):
        try:
            client.enroll()
            return
        except ResourceExhausted:
            if attempt == ENROL_ATTEMPTS - 1:
                raise
            sleep(ENROL_RETRY_SECONDS)


def step_client(client: Client) -> None:
    """One poll of a selected client (its task, training and upload); a session
    that expired on the virtual clock is renewed by enrolling again."""
    try:
        client.step(wait_seconds=0.0)
    except (Unauthenticated, UnknownClient):
        client.enrolled = False
        client.step(wait_seconds=0.0)


def _secure_aggregation(
    coord: VirtualCoordinator,
    r: Round,
    step_selected: Callable[[Sequence[str]], None],
    ids: Sequence[str],
) -> None:
    """Step the selected clients through the protocol's phases; a phase that
    waits for a client that stopped answering closes at its deadline (the clock
    jumps there)."""
    sa = r.secagg
    assert sa is not None
    while not coord.driver.round_done(r):
        phase = sa.phase
        step_selected(ids)
        if not coord.driver.round_done(r) and sa.phase == phase:
            coord.vclock.advance(max(0.0, sa.phase_deadline - coord.vclock()))


def drive(
    coord: VirtualCoordinator,
    step_selected: Callable[[Sequence[str]], None],
    on_round: Callable[[RoundOutcome], None] | None = None,
) -> list[RoundOutcome]:
    """Run rounds until the run finishes; ``step_selected(client_ids)`` steps the
    selected clients once each and returns when they are done."""
    outcomes: list[RoundOutcome] = []
    need = coord.cfg.selection.min_available
    while not coord.finished:
        coord.keep_alive()
        live = len(coord.registry.live())
        if live < need:
            raise RuntimeError(f"only {live} clients live, min_available is {need}")
        if coord.open_round() is None:  # the privacy budget ended the run
            break
        r = coord.current_round
        assert r is not None
        ids = coord.selected()
        step_selected(ids)
        if r.secagg is not None:
            _secure_aggregation(coord, r, step_selected, ids)
        coord.vclock.advance(ROUND_SECONDS)
        outcome = coord.close_round()
        outcomes.append(outcome)
        if on_round is not None:
            on_round(outcome)
    return outcomes


__all__ = [
    "SimulationResult",
    "VirtualClock",
    "VirtualCoordinator",
    "drive",
    "enrol",
    "fail_run",
    "step_client",
]
