"""Update compression: dense, fp16, top-k with error feedback, DGC, sketches.

Every compressor maps a flat float32 update ``[d]`` to a :class:`Payload` and
back, keeps its mutable memory in an explicit, checkpointable state, and never
touches the network (the transport moves ``Payload.to_bytes()``).
"""

from fedplat.compression.base import (
    CompressionError,
    Compressor,
    StateDict,
    StateValue,
    derive_seed,
    make_generator,
)
from fedplat.compression.basic import FP16, ErrorFeedbackState, Identity, TopK
from fedplat.compression.dgc import (
    DGC,
    PAPER_WARMUP_DENSITIES,
    DGCState,
    local_clip_norm,
)
from fedplat.compression.registry import (
    available_compressors,
    create_compressor,
    register_compressor,
)
from fedplat.compression.selection import Selection, exact_topk, sampled_topk
from fedplat.compression.sketch import (
    AMSSketch,
    CountSketch,
    GaussianSketch,
    mean_sketch,
)
from fedplat.compression.state import load_state, save_state
from fedplat.compression.wire import (
    HEADER_SIZE,
    Payload,
    PayloadError,
    SketchSpec,
    dense_payload,
    dense_size,
    sketch_payload,
    sparse_payload,
)

__all__ = [
    "DGC",
    "FP16",
    "HEADER_SIZE",
    "PAPER_WARMUP_DENSITIES",
    "AMSSketch",
    "CompressionError",
    "Compressor",
    "CountSketch",
    "DGCState",
    "ErrorFeedbackState",
    "GaussianSketch",
    "Identity",
    "Payload",
    "PayloadError",
    "Selection",
    "SketchSpec",
    "StateDict",
    "StateValue",
    "TopK",
    "available_compressors",
    "create_compressor",
    "dense_payload",
    "dense_size",
    "derive_seed",
    "exact_topk",
    "load_state",
    "local_clip_norm",
    "make_generator",
    "mean_sketch",
    "register_compressor",
    "sampled_topk",
    "save_state",
    "sketch_payload",
    "sparse_payload",
]
