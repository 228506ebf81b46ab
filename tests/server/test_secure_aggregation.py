"""Secure aggregation through the coordinator: in process and over real gRPC, with a
client that stops after sharing its keys; the unmasked sum equals the plain sum of
the survivors' clipped vectors within the fixed-point bound."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import fedplat.client.client as client_module
import pytest
import torch
from fedplat.client import Client
from fedplat.server import driver as driver_module
from fedplat.server.config import ConfigError, parse_config

from fedplat.protocol.errors import InvalidArgument, PermissionDenied
from fedplat.protocol.messages import SecAggReply, SecAggReplyKind, SecAggRequest
from fedplat.sim import simulate
from fedplat.store import Store
from fedplat.store.check import check_store
from tests.support import digits_client, issue_tokens, run_config


class SilentAfterShares:
    """A connection whose client stops after sharing its keys in its first
    secure-aggregation round: its masked input and everything after never leave."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sent = 0
        self.task = ""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def secagg(self, req: SecAggRequest) -> SecAggReply:
        if self.task and req.task_id != self.task:
            return self.inner.secagg(req)  # a later round: an honest client
        self.task = req.task_id
        if req.message:
            self.sent += 1
        if self.sent > 2:  # advertise, shares, then silence
            time.sleep(min(req.wait_seconds, 0.2))
            return SecAggReply(SecAggReplyKind.WAIT)
        return self.inner.secagg(req)


def _config(tmp: Path, **privacy: Any) -> dict[str, Any]:
    return run_config(
        tmp,
        rounds=2,
        clients=5,
        aggregator={"name": "fedavg", "weighted": False},
        selection={"sampling": "poisson", "rate": 1.0, "quorum": 1},
        deadlines={"round_seconds": 60},
        privacy={
            "mode": "central",
            "noise_multiplier": 0.05,
            "clip_norm": 1.0,
            "secure_aggregation": {"phase_seconds": 4.0, "dropout_rate": 0.2},
            **privacy,
        },
    )


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What each client masked (round -> party -> vector) and what the coordinator
    unmasked (round -> SecAggResult)."""
    seen: dict[str, Any] = {"vectors": {}, "results": {}, "dropped": {}}
    real_vector, real_settle = client_module.secagg_vector, driver_module.settle_secagg

    def vector(task: Any, delta: torch.Tensor, uplink: Any) -> torch.Tensor:
        v = real_vector(task, delta, uplink)
        seen["vectors"].setdefault(task.round, {})[task.config.secagg.party] = v
        return v

    def settle(r: Any, plan: Any, recorder: Any) -> None:
        seen["results"][r.number] = r.secagg.result
        real_settle(r, plan, recorder)

    monkeypatch.setattr(client_module, "secagg_vector", vector)
    monkeypatch.setattr(driver_module, "settle_secagg", settle)
    return seen


def _check_sums(seen: dict[str, Any], rounds: int, dropped_in_first: int) -> None:
    assert sorted(seen["results"]) == list(range(1, rounds + 1))
    for number, result in seen["results"].items():
        assert result is not None, f"round {number} aborted"
        vectors = seen["vectors"][number]
        assert len(result.dropped) == (dropped_in_first if number == 1 else 0)
        plain = torch.stack(
            [vectors[p].to(torch.float64) for p in result.survivors]
        ).sum(0)
        err = float((result.total - plain).norm())
        # The fixed-point rounding bound, plus float32 rounding of the rotation.
        assert err <= result.error_bound * 1.01 + 1e-6, (err, result.error_bound)
        assert float(plain.norm()) > 100 * result.error_bound  # not vacuous


def _check_store(url: str, run_id: str) -> list[Any]:
    store = Store(url, migrate=False)
    try:
        run = store.get_run(run_id)
        assert run is not None and run.status == "completed"
        first = store.list_participations(run_id, 1)
        eps = store.list_metrics(run_id, "privacy.epsilon")
        assert len(eps) == 2 and 0 < eps[0].value < eps[1].value
        assert check_store(store) == []
        return first
    finally:
        store.close()


def test_in_process_with_a_client_silent_after_sharing_keys(
    tmp_path: Path, recorded: dict[str, Any]
) -> None:
    cfg = parse_config(_config(tmp_path))

    def build(i: int, factory: Any) -> Client:
        f = (lambda: SilentAfterShares(factory())) if i == 0 else factory
        client: Client = digits_client(i, f, 5)
        return client

    res = simulate(cfg, build, 5)
    assert [r.completed for r in res.rounds] == [True, True]
    assert [r.num_succeeded for r in res.rounds] == [4, 5]
    _check_sums(recorded, 2, dropped_in_first=1)
    first = _check_store(cfg.store.url, res.run_id)
    statuses = sorted(p.status for p in first)
    assert statuses == ["dropped", "succeeded", "succeeded", "succeeded", "succeeded"]
    # Every client talked to the coordinator (keys, shares), none uploaded.
    assert all(p.bytes_up > 0 and p.bytes_down > 0 for p in first)


@pytest.mark.integration  # a real gRPC server and client threads
def test_over_grpc_with_a_client_silent_after_sharing_keys(
    tmp_path: Path, recorded: dict[str, Any]
) -> None:
    from fedplat.server.app import BackgroundServer

    from fedplat.transport.grpc import ChannelOptions, GrpcConnection

    raw = _config(tmp_path)
    tokens = issue_tokens(raw, 5)
    cfg = parse_config(raw)
    srv = BackgroundServer(cfg).start()
    address = f"127.0.0.1:{srv.port}"
    clients = []
    try:
        for i in range(5):

            def factory(i: int = i) -> Any:
                conn = GrpcConnection(address, ChannelOptions(insecure=True))
                return SilentAfterShares(conn) if i == 0 else conn

            c = digits_client(
                i, factory, 5, enrolment_token=tokens[i], poll_seconds=1.0
            )
            clients.append(c)
            c.start()
        deadline = time.monotonic() + 240
        while not srv.coord.finished and time.monotonic() < deadline:
            time.sleep(0.2)
        assert srv.coord.finished, "the run did not finish"
        run_id = srv.coord.run_id
    finally:
        for c in clients:
            c.stop(10)
        srv.stop()
    _check_sums(recorded, 2, dropped_in_first=1)
    first = _check_store(cfg.store.url, run_id)
    assert sorted(p.status for p in first).count("succeeded") == 4


def test_uploads_and_forged_messages_are_refused(tmp_path: Path) -> None:
    from fedplat.server.coordinator import Coordinator
    from fedplat.server.recorder import Recorder

    from fedplat.sim.simulation import VirtualClock, admit
    from fedplat.transport.inmemory import InMemoryConnection

    cfg = parse_config(_config(tmp_path))
    store = Store(cfg.store.url)
    coord = Coordinator(cfg, Recorder(store), clock=VirtualClock())
    clients = [digits_client(i, lambda: InMemoryConnection(coord), 5) for i in range(5)]
    admit(store, cfg, clients)
    for c in clients:
        c.enroll()
        c.step(wait_seconds=0.0)
    coord.open_round()
    a, b = clients[0], clients[1]
    task = a.conn.get_task(0.0)
    assert task.config.secagg is not None
    # A plain upload is refused: the round only takes masked inputs.
    with pytest.raises(InvalidArgument, match="secure aggregation"):
        a._terminal_send(
            client_module.OutgoingUpdate(task, torch.zeros(a.layout.numel), 10)
        )
    # A message signed by another client's key, or no signature, is refused.
    from fedplat.protocol.messages import secagg_statement
    from fedplat.secagg import SecAggClient, SecAggConfig, encode
    from fedplat.security.identity import SECAGG

    msg = encode(
        SecAggClient(
            SecAggConfig.from_dict(task.config.secagg.config),
            task.config.secagg.party,
        ).advertise()
    )
    fields = secagg_statement(a.run_id, task.round, task.task_id, task.nonce, msg)
    for sig in (b.identity.sign(SECAGG, *fields), b""):
        with pytest.raises(PermissionDenied, match="signature"):
            a.conn.secagg(SecAggRequest(task.task_id, task.round, msg, sig))
    # Another client's task is not the caller's to speak for.
    with pytest.raises(PermissionDenied, match="another client"):
        b.conn.secagg(SecAggRequest(task.task_id, task.round))
    store.close()


@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ({"aggregator": {"name": "median"}}, "aggregator fedavg"),
        ({"compression": {"name": "topk", "params": {"ratio": 0.1}}}, "not linear"),
        ({"privacy": {"mode": "local", "epsilon": 1.0}}, "need mode: central"),
    ],
)
def test_config_refuses_what_needs_individual_updates(
    tmp_path: Path, sections: dict[str, Any], match: str
) -> None:
    raw = _config(tmp_path)
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    with pytest.raises(ConfigError, match=match):
        parse_config(raw)


def test_sketches_and_the_clipping_bit_under_secure_aggregation(
    tmp_path: Path, recorded: dict[str, Any]
) -> None:
    """Clients mask their clipped count-sketches plus ``C * [not clipped]``; the
    coordinator's unmasked sum is the plain sum of those vectors, and the last
    coordinate gives adaptive clipping its count."""
    raw = _config(
        tmp_path,
        clip_norm=0.01,  # every digits update is larger: all clipped, bits 0
        noise_multiplier=0.3,
        adaptive_clip={"count_noise_std": 1.0},
    )
    raw["compression"] = {"name": "countsketch", "params": {"rows": 1, "cols": 400}}
    cfg = parse_config(raw)
    res = simulate(cfg, lambda i, f: digits_client(i, f, 5), 5)
    assert [r.num_succeeded for r in res.rounds] == [5, 5]
    _check_sums(recorded, 2, dropped_in_first=0)
    for number, result in recorded["results"].items():
        vectors = recorded["vectors"][number]
        assert all(v.shape == (401,) and float(v[-1]) == 0.0 for v in vectors.values())
        assert abs(float(result.total[-1])) < 1e-3  # no client was unclipped
    with Store(cfg.store.url, migrate=False) as store:
        clip = [m.value for m in store.list_metrics(res.run_id, "privacy.clip_norm")]
    assert clip[0] == 0.01 and len(clip) == 2  # C then grows towards the median
