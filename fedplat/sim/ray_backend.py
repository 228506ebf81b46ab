"""Simulation on Ray: the same coordinator, virtual clients spread over a cluster.

``fedplat sim --backend ray`` (extra ``fedplat[ray]``) runs:

- one **coordinator host** actor, pinned to the driver's node (the run's store and
  checkpoints are local files there): the real
  :class:`~fedplat.sim.engine.VirtualCoordinator` on a virtual clock and the round
  loop of :func:`fedplat.sim.engine.drive`, answering clients through
  :class:`~fedplat.sim.ray_wire.CoordinatorEndpoint`;
- ``hosts`` **client host** actors (one CPU each, by default one per CPU of the
  cluster) that each hold a share of the virtual clients: SDK
  :class:`~fedplat.client.Client` objects whose connection is a
  :class:`~fedplat.sim.ray_wire.RayConnection` to the coordinator host.

Every client enrols once (token, signed challenge). In a round the coordinator
host sends each host the task of its selected clients only; the host steps them
one by one (download, train, signed upload), so a client that is not selected
costs nothing. Only bytes cross process boundaries (see
:mod:`fedplat.sim.ray_wire`); the run's plug-ins (``model.factory``,
``data.eval``, ``data.clients``) travel as the import paths of its settings, and
every actor first puts ``import_paths`` (the app's folder) on its ``sys.path``.
A crash marks the run ``failed`` in the store. A Ray cluster is a trusted
environment (Ray's own control plane unpickles what its members send): run it on
a private network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fedplat.server.config import RunConfig, parse_config
from fedplat.server.coordinator import RoundOutcome
from fedplat.sim.engine import (
    SimulationResult,
    VirtualCoordinator,
    drive,
    enrol,
    fail_run,
    step_client,
)
from fedplat.sim.ray_wire import CoordinatorEndpoint, RayConnection, Reply
from fedplat.store import Store

#: Client builder shipped to every host: ``build(i, connection_factory)``.
Builder = Callable[[int, Callable[[], Any]], Any]


def importable(paths: Sequence[str]) -> None:
    """Put ``paths`` first on this process's ``sys.path`` (the app's folder, so
    the run's ``"app:fn"`` plug-ins import in every actor)."""
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of an error, unwrapped from Ray's task error."""
    cause = getattr(exc, "cause", None)
    err = cause if isinstance(cause, BaseException) else exc
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class CoordinatorHost:
    """The coordinator's actor (see the module docstring)."""

    def __init__(self, config: dict[str, Any], paths: Sequence[str] = ()) -> None:
        import ray

        importable(paths)
        self.cfg = parse_config(config, "the simulation's run")
        self.store = Store(self.cfg.store.url)
        self.coord = VirtualCoordinator(self.cfg, self.store)
        self.endpoint = CoordinatorEndpoint(self.coord, put_model=ray.put)
        self.outcomes: list[dict[str, Any]] = []

    def run_id(self) -> str:
        return self.coord.run_id

    def tokens(self, n: int) -> list[str]:
        """One enrolment token per client ("" when the run does not use tokens)."""
        if self.cfg.admission_mode != "tokens":
            return [""] * n
        made = self.store.create_tokens(
            n,
            expires_at=datetime.now(UTC) + timedelta(days=1),
            run_name=self.cfg.run.name,
        )
        return [secret for _, secret in made]

    # The client API, as bytes (fedplat.sim.ray_wire).
    def challenge(self, client_id: str) -> Reply:
        return self.endpoint.challenge(client_id)

    def enroll(self, raw: bytes) -> Reply:
        return self.endpoint.enroll(raw)

    def get_task(self, client_id: str, token: str) -> Reply:
        return self.endpoint.get_task(client_id, token)

    def download(self, client_id: str, token: str, task_id: str) -> Reply:
        return self.endpoint.download(client_id, token, task_id)

    def upload(self, client_id: str, token: str, raw: bytes, body: bytes) -> Reply:
        return self.endpoint.upload(client_id, token, raw, body)

    def report_metrics(self, client_id: str, token: str, raw: bytes) -> Reply:
        return self.endpoint.report_metrics(client_id, token, raw)

    # The round loop.
    def drive(self, hosts: list[Any], where: dict[str, int]) -> list[dict[str, Any]]:
        import ray

        def step_selected(ids: Sequence[str]) -> None:
            batches: dict[int, list[tuple[str, bytes]]] = {}
            for cid in ids:
                batches.setdefault(where[cid], []).append(
                    (cid, self.endpoint.task(cid))
                )
            ray.get([hosts[h].step.remote(b) for h, b in batches.items()])

        def record(o: RoundOutcome) -> None:
            self.outcomes.append(dataclasses.asdict(o))

        try:
            drive(self.coord, step_selected, record)
        except BaseException as exc:  # the run must be marked, whatever happened
            fail_run(self.coord, _one_line(exc))
            raise
        finally:
            self.coord.ctx.recorder.flush()
        return self.outcomes

    def fail(self, error: str) -> str:
        """Mark the run failed (an error outside the round loop, e.g. enrolment)."""
        return fail_run(self.coord, error)

    def progress(self, seen: int) -> list[dict[str, Any]]:
        return self.outcomes[seen:]

    def peak_rss_mb(self) -> float:
        return peak_rss_mb()

    def close(self) -> None:
        self.store.close()


class ClientHost:
    """A share of the virtual clients (see the module docstring)."""

    def __init__(
        self, coordinator: Any, build: Builder, paths: Sequence[str] = ()
    ) -> None:
        import ray

        importable(paths)
        self.build = build
        self.clients: dict[str, Any] = {}

        def call(method: str, *args: Any) -> Reply:
            reply: Reply = ray.get(getattr(coordinator, method).remote(*args))
            return reply

        self._factory = lambda: RayConnection(call, ray.get)

    def enrol(self, share: list[tuple[int, str]]) -> list[str]:
        """Build and enrol clients ``(index, token)``; their ids, in order."""
        ids = []
        for i, token in share:
            c = self.build(i, self._factory)
            c.enrolment_token = token or c.enrolment_token
            enrol(c)
            self.clients[c.client_id] = c
            ids.append(c.client_id)
        return ids

    def step(self, batch: list[tuple[str, bytes]]) -> None:
        """Step each selected client once; its task comes with the order."""
        for cid, task in batch:
            c = self.clients[cid]
            c.conn.offer(task)
            step_client(c)

    def peak_rss_mb(self) -> float:
        return peak_rss_mb()


@dataclass(frozen=True)
class RaySimulation:
    """A finished Ray simulation and what its processes cost."""

    result: SimulationResult
    hosts: int
    driver_peak_rss_mb: float
    coordinator_peak_rss_mb: float
    host_peak_rss_mb: list[float]
    enrol_seconds: float
    rounds_seconds: float


def _local_paths(cfg: RunConfig) -> RunConfig:
    """Store and checkpoint paths made absolute: the coordinator host runs in
    another working directory (on the driver's node)."""
    data = cfg.model_dump(mode="json")
    url = data["store"]["url"]
    if "://" not in url:
        data["store"]["url"] = str(Path(url).resolve())
    data["checkpoints"]["dir"] = str(Path(data["checkpoints"]["dir"]).resolve())
    return parse_config(data, "the simulation's run")


def simulate_ray(
    cfg: RunConfig,
    build: Builder,
    num_clients: int,
    *,
    hosts: int | None = None,
    on_round: Callable[[RoundOutcome], None] | None = None,
    poll_seconds: float = 0.5,
    import_paths: Sequence[str] = (),
) -> RaySimulation:
    """Run ``cfg`` with ``num_clients`` clients on the connected Ray cluster
    (``ray.init`` first). ``build`` is pickled to every host (e.g. a
    :class:`fedplat.sim.clients.ReferencePopulation`); ``import_paths`` go first
    on every actor's ``sys.path`` (absolute paths, valid on every node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        raise RuntimeError("connect to Ray first (ray.init)")
    cfg = _local_paths(cfg)
    n_hosts = hosts or max(1, int(ray.cluster_resources().get("CPU", 1)))
    here = NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False
    )
    coord: Any = (
        ray.remote(CoordinatorHost)
        .options(num_cpus=0, max_concurrency=n_hosts + 4, scheduling_strategy=here)
        .remote(cfg.model_dump(mode="json"), list(import_paths))
    )
    workers: list[Any] = [
        ray.remote(ClientHost).options(num_cpus=1).remote(coord, build, paths)
        for paths in [list(import_paths)] * n_hosts
    ]
    try:
        t0 = time.perf_counter()
        tokens = ray.get(coord.tokens.remote(num_clients))
        shares = [
            [(i, tokens[i]) for i in range(h, num_clients, n_hosts)]
            for h in range(n_hosts)
        ]
        placed = ray.get(
            [w.enrol.remote(s) for w, s in zip(workers, shares, strict=True)]
        )
        where = {cid: h for h, ids in enumerate(placed) for cid in ids}
        t1 = time.perf_counter()
        outcomes = _follow(
            coord, coord.drive.remote(workers, where), on_round, poll_seconds
        )
        t2 = time.perf_counter()
        rss = ray.get([a.peak_rss_mb.remote() for a in (coord, *workers)])
        run_id = ray.get(coord.run_id.remote())
        ray.get(coord.close.remote())
    except BaseException as exc:
        _mark_failed(coord, exc)
        raise
    finally:
        for a in (*workers, coord):
            ray.kill(a)
    return RaySimulation(
        SimulationResult(run_id, outcomes),
        n_hosts,
        peak_rss_mb(),
        rss[0],
        rss[1:],
        t1 - t0,
        t2 - t1,
    )


def _mark_failed(coord: Any, exc: BaseException) -> None:
    """Mark the run failed on the coordinator host (a no-op when the round loop
    already did, or the run ended); the coordinator host may itself be gone."""
    import ray

    # Nothing more to do if this fails: the original error propagates.
    with contextlib.suppress(Exception):
        ray.get(coord.fail.remote(_one_line(exc)), timeout=60)


def _follow(
    coord: Any,
    done: Any,
    on_round: Callable[[RoundOutcome], None] | None,
    poll_seconds: float,
) -> list[RoundOutcome]:
    """Wait for the round loop, reporting rounds as they close."""
    import ray

    seen: list[RoundOutcome] = []
    while True:
        ready, _ = ray.wait([done], timeout=poll_seconds)
        for d in ray.get(coord.progress.remote(len(seen))):
            o = RoundOutcome(**d)
            seen.append(o)
            if on_round is not None:
                on_round(o)
        if ready:
            ray.get(done)  # raises the loop's error, if any
            return seen


#: Ray's session folder adds about 70 characters to its temporary folder in
#: the paths of its Unix sockets, which may not exceed 107 bytes.
MAX_RAY_TEMP_DIR = 36


def ray_temp_dir() -> str:
    """A new temporary folder for a local Ray: under the system's temporary
    folder, or under /tmp when that path is too long for Ray's sockets (a
    TMPDIR deep in a build tree)."""
    base = tempfile.gettempdir()
    if len(base) + len("/fprayXXXXXXXX") > MAX_RAY_TEMP_DIR:
        base = "/tmp"
    return tempfile.mkdtemp(prefix="fpray", dir=base)


def local_ray(temp_dir: str | None = None, num_cpus: int | None = None) -> None:
    """Start a Ray instance on this machine, bound to 127.0.0.1."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=num_cpus,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp_dir,
        include_dashboard=False,
        log_to_driver=False,
    )


__all__ = [
    "ClientHost",
    "CoordinatorHost",
    "RaySimulation",
    "importable",
    "local_ray",
    "peak_rss_mb",
    "ray_temp_dir",
    "simulate_ray",
]
