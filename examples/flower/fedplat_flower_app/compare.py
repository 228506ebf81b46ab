"""A ServerApp that runs several rules with fedplat's strategy and with Flower's
own, back to back on the same SuperNodes (``bench/vs_flower_sim.py`` points the
app's ``serverapp`` component here).

For each rule in the run config's ``compare-rules`` (a JSON list of
``aggregator:`` sections), both sides train from the same seeded model for the
same rounds with dense updates; each round the driving side's replies are
also aggregated by the other side, on its own copy, so both aggregation steps
are timed in this process on identical inputs, after fedplat's compiled kernels
for these rules were built (:func:`warm_up`). The JSON written to
``results-path`` holds the warm-up seconds and one entry per rule and side.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from fedplat.aggregators.kernels import fused_sort
from fedplat.server.config import AggregatorSection
from fedplat_flower_app.peers import Timed
from fedplat_flower_app.server_app import (
    make_strategy,
    run_json,
    sampling,
    summary,
    train,
    write,
)
from fedplat_flower_app.task import build_model
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rules = run_json(cfg, "compare-rules")
    if not isinstance(rules, list) or not rules:
        raise ValueError("run config 'compare-rules' must be a non-empty JSON list")
    kw = sampling(cfg, grid)
    sections = [AggregatorSection.model_validate(spec) for spec in rules]
    warmup_s = warm_up(sections, kw["min_train_nodes"], int(cfg["seed"]))
    runs: list[dict[str, Any]] = []
    for section in sections:
        for side, other in (("fedplat", "flower"), ("flower", "fedplat")):
            strategy = Timed(
                make_strategy(side, section, None, kw),
                make_strategy(other, section, None, kw),
            )
            result = train(cfg, grid, strategy)
            entry = {"rule": section.name, "strategy": side}
            runs.append({**entry, **summary(strategy, result)})
            # Partial results are written too.
            write(str(cfg["results-path"]), {"warmup_s": warmup_s, "runs": runs})


def warm_up(sections: list[AggregatorSection], n: int, seed: int) -> float:
    """Build fedplat's compiled order-statistics kernels (median, trimmed mean,
    MeaMed: :mod:`fedplat.aggregators.kernels.fused_sort`) for ``n`` rows of this model
    before timing anything, as ``bench/aggregators_speed.py`` does: compiling
    takes seconds to minutes once per process, and timing it per round would
    measure the compiler. Returns the seconds it took."""
    d = sum(p.numel() for p in build_model(seed).state_dict().values())
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    t0 = time.perf_counter()
    for section in sections:
        section.build()(x)
    fused_sort.wait()
    return time.perf_counter() - t0
