"""The four-round protocol: masks cancel, dropouts are recovered, no early leak."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedplat.secagg import (
    SecAggAborted,
    SecAggClient,
    SecAggConfig,
    SecAggError,
    SecAggServer,
)
from fedplat.secagg.messages import MaskedInput, ShareBundle, UnmaskRequest
from fedplat.secagg.simulate import Meter, run_round

SESSION = bytes(range(16))


def _config(
    n: int,
    *,
    degree: int | None = None,
    t: int = 2,
    d: int = 8,
    min_clients: int = 2,
    rotate: bool = False,
) -> SecAggConfig:
    return SecAggConfig(
        session=SESSION,
        dim=d,
        clip_norm=100.0,
        max_clients=n,
        threshold=t,
        degree=degree,
        min_clients=min_clients,
        rotate=rotate,
    )


def _ring_inputs(cfg: SecAggConfig, ids, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.integers(0, 2**32, cfg.ring_dim, dtype=np.uint32) for c in ids}


def _run_ring(cfg, inputs, drop_shares=(), drop_masked=()):
    """The protocol on raw ring inputs (no quantization): exact arithmetic."""
    clients = {c: SecAggClient(cfg, c) for c in inputs}
    server = SecAggServer(cfg, clients)
    for c in clients.values():
        server.receive(c.advertise())
    for c, msg in server.close().items():
        server.receive(clients[c].share_keys(msg))
    masked = {}
    for c, msg in server.close().items():
        if c not in drop_shares:
            masked[c] = clients[c].mask_ring(msg, inputs[c])
            server.receive(masked[c])
    for c, msg in server.close().items():
        if c not in drop_masked:
            server.receive(clients[c].unmask(msg))
    server.close()
    return server, masked


def test_three_clients_no_dropout_sum_is_exact() -> None:
    cfg = _config(3)
    inputs = {
        c: np.array([c + 1] * 8, dtype=np.uint32) for c in range(3)
    }  # 1 + 2 + 3 = 6
    server, masked = _run_ring(cfg, inputs)
    assert server.result.ring.tolist() == [6] * 8
    assert server.result.survivors == (0, 1, 2) and server.result.dropped == ()
    # What the server saw from each client looks nothing like its input.
    for c, msg in masked.items():
        assert np.count_nonzero(msg.data == inputs[c]) <= 1


def test_masked_inputs_alone_sum_to_garbage() -> None:
    # Pairwise masks cancel in the sum but the self masks do not: the sum of the
    # masked inputs is not the sum of inputs until the server unmasks.
    cfg = _config(4)
    inputs = _ring_inputs(cfg, range(4))
    server, masked = _run_ring(cfg, inputs)
    raw = sum(m.data for m in masked.values())
    want = sum(inputs.values())
    assert not np.array_equal(raw, want)
    assert np.array_equal(server.result.ring, want)


def test_same_input_masks_differently_every_round() -> None:
    cfg = _config(3)
    inputs = {c: np.zeros(8, dtype=np.uint32) for c in range(3)}
    _, first = _run_ring(cfg, inputs)
    _, second = _run_ring(cfg, inputs)
    assert not np.array_equal(first[0].data, second[0].data)


def test_dropout_after_sharing_keys_is_recovered() -> None:
    # Each survivor keeps 3 live neighbours of 5: t = 3 shares rebuild everything.
    cfg = _config(6, t=3)
    inputs = _ring_inputs(cfg, range(6))
    server, _ = _run_ring(cfg, inputs, drop_shares={1, 3})
    assert server.result.dropped == (1, 3)
    assert np.array_equal(
        server.result.ring, inputs[0] + inputs[2] + inputs[4] + inputs[5]
    )


def test_dropout_after_masked_input_still_counts() -> None:
    cfg = _config(5, t=3)
    inputs = _ring_inputs(cfg, range(5))
    server, _ = _run_ring(cfg, inputs, drop_masked={2})
    assert server.result.survivors == (0, 1, 2, 3, 4)
    assert np.array_equal(server.result.ring, sum(inputs.values()))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(5, 14), sparse=st.booleans(), data=st.data())
def test_sum_is_exact_under_random_dropouts(n: int, sparse: bool, data) -> None:
    degree = 4 if sparse else None
    cfg = _config(n, degree=degree, t=2)
    ids = data.draw(
        st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n, unique=True)
    )
    inputs = _ring_inputs(cfg, ids, seed=data.draw(st.integers(0, 1000)))
    # One dropout after shares and one after the masked input: every client
    # keeps >= 2 live neighbours, so t = 2 always suffices.
    a, b = data.draw(
        st.lists(st.sampled_from(ids), min_size=2, max_size=2, unique=True)
    )
    server, _ = _run_ring(cfg, inputs, drop_shares={a}, drop_masked={b})
    want = sum(v for c, v in inputs.items() if c != a)
    assert np.array_equal(server.result.ring, want)
    assert server.result.dropped == (a,)


def test_secagg_plus_round_on_float_updates_with_the_wire_codec() -> None:
    cfg = SecAggConfig.create(dim=300, clip_norm=5.0, clients=30, session=SESSION)
    assert cfg.degree == 6 and cfg.threshold == 2  # 3 dropouts, 1 corrupt of 30
    g = torch.Generator().manual_seed(0)
    updates = {c: torch.randn(300, generator=g) * 0.1 for c in range(30)}
    meter = Meter()
    res = run_round(
        cfg, updates, drop_after_shares={4, 17}, drop_after_masked={9}, meter=meter
    )
    want = sum(updates[c].double() for c in updates if c not in (4, 17))
    assert res.dropped == (4, 17) and res.count == 28
    assert float(torch.linalg.vector_norm(res.total - want)) <= res.error_bound + 1e-5
    # Bytes were counted on the real encodings: a masked input is 4 d' + header.
    assert meter.sent["masked_input", 0] == 4 * cfg.ring_dim + 29
    assert meter.received["unmask", -1] > 0


def test_too_few_shares_aborts_without_revealing() -> None:
    cfg = _config(5, degree=None, t=4, min_clients=2)
    inputs = _ring_inputs(cfg, range(5))
    with pytest.raises(SecAggAborted, match="cannot rebuild"):
        # 0 and 1 drop after sharing, 2 after its masked input: only 3 and 4
        # answer the unmask request, 2 shares per secret where t = 4 are needed.
        _run_ring(cfg, inputs, drop_shares={0, 1}, drop_masked={2})


def test_round_aborts_below_min_clients() -> None:
    cfg = _config(5, min_clients=4)
    clients = {c: SecAggClient(cfg, c) for c in range(5)}
    server = SecAggServer(cfg, clients)
    for c in range(3):
        server.receive(clients[c].advertise())
    with pytest.raises(SecAggAborted, match="fewer than min_clients"):
        server.close()
    assert server.phase == "aborted"


def test_client_refuses_bad_server_messages_and_then_stays_silent() -> None:
    cfg = _config(4, t=2, min_clients=3)
    clients, server = _advanced(cfg, 4, upto="share")
    directory = server.close()
    d0 = directory[0]

    def fresh() -> SecAggClient:
        c = SecAggClient(cfg, 0)
        c.advertise()
        return c

    with pytest.raises(SecAggError, match="another session or client"):
        fresh().share_keys(type(d0)(d0.session, 1, d0.roster, d0.keys))
    with pytest.raises(SecAggError, match="roster of 2"):
        fresh().share_keys(type(d0)(d0.session, 0, d0.roster[:2], d0.keys[:1]))
    with pytest.raises(SecAggError, match="not my neighbours"):
        fresh().share_keys(type(d0)(d0.session, 0, d0.roster, d0.keys[1:]))
    refused = fresh()
    with pytest.raises(SecAggError, match="not my neighbours"):
        refused.share_keys(type(d0)(d0.session, 0, d0.roster, d0.keys[1:]))
    with pytest.raises(SecAggError, match="in aborted"):
        refused.share_keys(d0)  # no second answer
    for c, msg in directory.items():
        server.receive(clients[c].share_keys(msg))
    bundles = server.close()
    with pytest.raises(SecAggError, match="need 2"):
        clients[0].mask_ring(
            ShareBundle(SESSION, 0, bundles[0].shares[:1]), np.zeros(8, dtype=np.uint32)
        )
    for c in (1, 2):
        clients[c].mask_ring(bundles[c], np.zeros(8, dtype=np.uint32))
    with pytest.raises(SecAggError, match="my input is not part of"):
        clients[1].unmask(UnmaskRequest(SESSION, 1, (0, 2, 3)))
    with pytest.raises(SecAggError, match="min_clients"):
        clients[2].unmask(UnmaskRequest(SESSION, 2, (1, 2)))


def _advanced(cfg, n, upto="masked_input"):
    """Clients and a server with the phases before ``upto`` done."""
    clients = {c: SecAggClient(cfg, c) for c in range(n)}
    server = SecAggServer(cfg, clients)
    for c in clients.values():
        server.receive(c.advertise())
    if upto == "masked_input":
        for c, msg in server.close().items():
            server.receive(clients[c].share_keys(msg))
    return clients, server


def test_server_rejects_and_records_bad_messages() -> None:
    cfg = _config(4, t=2)
    clients = {c: SecAggClient(cfg, c) for c in range(4)}
    server = SecAggServer(cfg, range(4))
    adv = clients[0].advertise()
    server.receive(adv)
    with pytest.raises(SecAggError, match="already advertised"):
        server.receive(adv)
    stranger = SecAggClient(_config(8), 7).advertise()
    with pytest.raises(SecAggError, match="not invited"):
        server.receive(stranger)
    copy = type(adv)(
        SESSION, 1, type(adv.keys)(1, adv.keys.enc_public, adv.keys.mask_public)
    )
    with pytest.raises(SecAggError, match="reused"):
        server.receive(copy)
    zero = type(adv)(SESSION, 2, type(adv.keys)(2, bytes(32), bytes(range(32))))
    with pytest.raises(SecAggError, match="key agreement"):
        server.receive(zero)  # a low-order point
    with pytest.raises(SecAggError, match="not expected now"):
        server.receive(MaskedInput(SESSION, 0, np.zeros(8, dtype=np.uint32)))
    assert [r.reason for r in server.rejections][:2] == [
        "keys already advertised",
        "not invited to this round",
    ]
    assert all(r.phase == "advertise" for r in server.rejections)


def test_server_validates_shares_and_masked_inputs() -> None:
    cfg = _config(4, t=2)
    clients, server = _advanced(cfg, 4)
    bundles = server.close()
    with pytest.raises(SecAggError, match="entries"):
        server.receive(MaskedInput(SESSION, 0, np.zeros(5, dtype=np.uint32)))
    server.receive(clients[0].mask_ring(bundles[0], np.zeros(8, dtype=np.uint32)))
    with pytest.raises(SecAggError, match="already sent"):
        server.receive(MaskedInput(SESSION, 0, np.zeros(8, dtype=np.uint32)))
    for c in (1, 2, 3):
        server.receive(clients[c].mask_ring(bundles[c], np.ones(8, dtype=np.uint32)))
    requests = server.close()
    good = clients[0].unmask(requests[0])
    # Claiming the key share of a survivor (both shares of one client) is refused.
    bad = type(good)(SESSION, 0, good.self_mask_shares[1:], good.self_mask_shares[:1])
    with pytest.raises(SecAggError, match="exactly the surviving"):
        server.receive(bad)
    server.receive(good)
    for c in (1, 2, 3):
        server.receive(clients[c].unmask(requests[c]))
    server.close()
    assert server.result.ring.tolist() == [3] * 8


def test_unmask_never_reveals_both_shares_of_a_client() -> None:
    cfg = _config(6, t=2)
    clients, server = _advanced(cfg, 6)
    bundles = server.close()
    for c in range(6):
        if c != 5:
            server.receive(
                clients[c].mask_ring(bundles[c], np.zeros(8, dtype=np.uint32))
            )
    for c, req in server.close().items():
        msg = clients[c].unmask(req)
        assert {s.owner for s in msg.key_shares} == {5}
        assert 5 not in {s.owner for s in msg.self_mask_shares}


def test_a_lying_share_is_routed_around_by_the_commitments() -> None:
    cfg = _config(5, t=2)
    clients, server = _advanced(cfg, 5)
    bundles = server.close()
    inputs = _ring_inputs(cfg, range(5))
    for c in range(4):  # 4 drops after sharing: its mask key is rebuilt
        server.receive(clients[c].mask_ring(bundles[c], inputs[c]))
    for c, req in server.close().items():
        msg = clients[c].unmask(req)
        if c == 0:  # corrupt every share client 0 reveals
            bump = [
                type(s)(
                    s.owner,
                    ((int.from_bytes(s.share, "little") + 1) % 97).to_bytes(
                        33, "little"
                    ),
                )
                for s in msg.self_mask_shares + msg.key_shares
            ]
            n = len(msg.self_mask_shares)
            msg = type(msg)(msg.session, 0, tuple(bump[:n]), tuple(bump[n:]))
        server.receive(msg)
    server.close()
    assert np.array_equal(server.result.ring, sum(inputs[c] for c in range(4)))
