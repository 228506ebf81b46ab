"""Settings of one real gossip peer (:class:`PeerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedplat.gossip.membership import check_node_id
from fedplat.gossip.mixing.rules import DEFAULT_RULE, get_mixing_rule
from fedplat.protocol.task import TrainingSettings

__all__ = ["PeerConfig", "parse_seed"]

MiB = 1024 * 1024


def parse_seed(seed: str) -> tuple[str | None, str]:
    """``"id@host:port"`` -> ``(id, address)``; ``"host:port"`` -> ``(None, ...)``."""
    if "@" in seed:
        node_id, _, address = seed.partition("@")
        return node_id, address
    return None, seed


@dataclass(frozen=True)
class PeerConfig:
    """Settings of one peer (see :mod:`fedplat.gossip.node` for the lifecycle).

    Attributes
    ----------
    node_id : str
        Unique name of the peer (``str(i)`` for node ``i`` of a scenario):
        letters, digits and '-', as in its certificate.
    listen : str
        ``host:port`` to serve on (port 0: any free port).
    advertise : str, optional
        Address others should use (default: the listen host and bound port).
    seeds : tuple of str
        Bootstrap peers, ``host:port`` or ``id@host:port``.
    target_degree : int
        Link to peers learned from the seeds until this many neighbours (0: the
        seeds only).
    max_degree : int
        Refuse new links beyond this many neighbours.
    rounds : int
    rule : str
        A :data:`fedplat.gossip.mixing.MIXING_RULES` name; by default
        ``clipped_gossip``, the one rule that bounds what a compromised member
        can do to this peer's model.
    outer_step, alpha, beta
        NoLoCo's outer step (``rule="noloco"``).
    training : TrainingSettings
        Local training per round (:func:`fedplat.models.train_epochs`).
    heartbeat_s, dead_after_s, round_timeout_s, rpc_timeout_s, bootstrap_timeout_s
        Failure-detection and waiting times, seconds.
    max_model_bytes, chunk_bytes
        Cap on a model payload (the layout's own bound applies below it), and
        stream chunk size.
    stream_idle_s, stream_deadline_s
        A model stream sending nothing for ``stream_idle_s``, or lasting longer
        than ``stream_deadline_s``, is cut (``RESOURCE_EXHAUSTED``).
    max_calls_per_caller, max_calls
        Calls in flight allowed per caller and in total.
    compressor, compressor_params
        Link compression (a :mod:`fedplat.compression` registry name).
    eval_every : int
        Evaluate on the test set every this many rounds (and after the last).
    max_staleness : int
        Mix a neighbour's model only if it is at most this many rounds old.
    catch_up : bool
        Start from the neighbours' average when they are ahead.
    linger_s : float
        Keep serving this long after the last round (slower neighbours may still
        need this peer's model), then stop.
    min_round_s : float
        Make each round last at least this long (paces demos and tests, or
        emulates a duty-cycled device).
    seed : int
    """

    node_id: str
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    seeds: tuple[str, ...] = ()
    target_degree: int = 0
    max_degree: int = 64
    rounds: int = 10
    rule: str = DEFAULT_RULE
    outer_step: bool = False
    alpha: float = 0.7
    beta: float = 0.5
    training: TrainingSettings = field(default_factory=TrainingSettings)
    heartbeat_s: float = 0.5
    dead_after_s: float = 3.0
    round_timeout_s: float = 10.0
    rpc_timeout_s: float = 5.0
    bootstrap_timeout_s: float = 60.0
    max_model_bytes: int = 64 * MiB
    chunk_bytes: int = 1 * MiB
    stream_idle_s: float = 10.0
    stream_deadline_s: float = 60.0
    max_calls_per_caller: int = 8
    max_calls: int = 128
    compressor: str = "identity"
    compressor_params: dict[str, Any] = field(default_factory=dict)
    eval_every: int = 1
    max_staleness: int = 2
    catch_up: bool = True
    linger_s: float = 5.0
    min_round_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        get_mixing_rule(self.rule)  # an unknown name raises, listing valid ones
        if self.rounds < 1 or self.eval_every < 1:
            raise ValueError("rounds and eval_every must be >= 1")
        if self.heartbeat_s <= 0 or self.dead_after_s <= self.heartbeat_s:
            raise ValueError("need 0 < heartbeat_s < dead_after_s")
        if self.chunk_bytes < 1024:
            raise ValueError("chunk_bytes must be >= 1024")
        if not 0 < self.stream_idle_s <= self.stream_deadline_s:
            raise ValueError("need 0 < stream_idle_s <= stream_deadline_s")
        if not 1 <= self.max_calls_per_caller <= self.max_calls:
            raise ValueError("need 1 <= max_calls_per_caller <= max_calls")
        for seed in self.seeds:
            node_id, _ = parse_seed(seed)
            if node_id is not None:
                check_node_id(node_id)
