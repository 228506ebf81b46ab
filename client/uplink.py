"""The client half of the uplink contract: compression and privacy per task.

The coordinator names the run's compressor and privacy settings in every task
(:class:`fedplat.protocol.task.TaskConfig`). This innermost middleware layer
compresses (keeping error-feedback / DGC momentum state across rounds, saved in
the client's ``state_dir`` so a restarted client keeps it) and, for local DP,
noises what actually leaves the device (:func:`fedplat.protocol.codec.encode_payload`).
Its output is the update's payload (:class:`fedplat.protocol.body.EncodedBody`);
the coordinator's half (:mod:`fedplat.server.uplink_plan`) decodes it. It never
touches the network.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

from fedplat.compression import (
    CompressionError,
    Compressor,
    create_compressor,
    load_state,
    save_state,
)
from fedplat.privacy import GaussianMechanism, make_noise_generator, secure_seed
from fedplat.protocol.body import EncodedBody
from fedplat.protocol.codec import encode_payload
from fedplat.protocol.errors import InvalidArgument
from fedplat.protocol.messages import OutgoingUpdate, Send, UploadAck
from fedplat.protocol.task import CompressionSpec
from fedplat.vectors import Layout

log = logging.getLogger("fedplat.client")


class UplinkLayer:
    """Clip -> compress -> (local DP) noise, as the task asks."""

    def __init__(
        self, layout: Layout, state_dir: str | os.PathLike[str] | None = None
    ) -> None:
        self.layout = layout
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self._compressors: dict[str, Compressor] = {}
        self._noise = make_noise_generator(secure_seed())
        self.last_nbytes = 0

    def _key(self, spec: CompressionSpec) -> str:
        blob = json.dumps([spec.name, spec.params], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def _state_path(self, key: str) -> Path | None:
        if self.state_dir is None:
            return None
        return self.state_dir / f"compressor-{key}.safetensors"

    def compressor(self, spec: CompressionSpec) -> tuple[str, Compressor]:
        """The (cached, state-restored) compressor for a task's spec."""
        key = self._key(spec)
        if key not in self._compressors:
            try:
                comp = create_compressor(spec.name, layout=self.layout, **spec.params)
            except (CompressionError, ValueError) as exc:
                raise InvalidArgument(
                    f"task asks for an unusable compressor: {exc}"
                ) from exc
            path = self._state_path(key)
            if path is not None and path.is_file():
                try:
                    comp.load_state_dict(load_state(path))
                    log.info("restored compressor state from %s", path)
                except (CompressionError, ValueError, OSError) as exc:
                    log.warning("ignoring unusable compressor state %s: %s", path, exc)
            self._compressors[key] = comp
        return key, self._compressors[key]

    def __call__(self, update: OutgoingUpdate, send: Send) -> UploadAck:
        cfg = update.task.config
        privacy = cfg.privacy
        if cfg.compression.is_identity and privacy is None:
            return send(update)
        # Central DP: the coordinator clips what it receives (the update, or its
        # sketch) to the round's clip norm and measures whether it had to, the
        # bit adaptive clipping counts; a client that clipped first would hide it.
        vec = update.vector
        key, comp = self.compressor(cfg.compression)
        mech = None
        if privacy is not None and privacy.mode == "local":
            mech = GaussianMechanism(privacy.noise_multiplier, privacy.clip_norm)
        payload = encode_payload(
            comp,
            vec,
            round=update.task.round,
            seed=cfg.compression_seed,
            mechanism=mech,
            generator=self._noise,
        )
        path = self._state_path(key)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_state(path, comp.state_dict())
        body = EncodedBody.of(payload.to_bytes())
        self.last_nbytes = body.nbytes
        return send(replace(update, body=body))
