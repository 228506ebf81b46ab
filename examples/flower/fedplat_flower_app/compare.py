"""A ServerApp that runs several rules with fedplat's strategy and with Flower's
own, back to back on the same SuperNodes (``bench/vs_flower_sim.py`` points the
app's ``serverapp`` component here).

For each rule in the run config's ``compare-rules`` (a JSON list of
``aggregator:`` sections), both sides train from the same seeded model for the
same rounds with dense updates; each round the driving side's replies are
also aggregated by the other side, on its own copy, so both aggregation steps
are timed in this process on identical inputs. The JSON written to
``results-path`` holds one entry per rule and side.
"""

from __future__ import annotations

from typing import Any

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
    runs: list[dict[str, Any]] = []
    for spec in rules:
        section = AggregatorSection.model_validate(spec)
        for side, other in (("fedplat", "flower"), ("flower", "fedplat")):
            strategy = Timed(
                make_strategy(side, section, None, kw),
                make_strategy(other, section, None, kw),
            )
            result = train(cfg, grid, strategy)
            entry = {"rule": section.name, "strategy": side}
            runs.append({**entry, **summary(strategy, result)})
            write(str(cfg["results-path"]), {"runs": runs})  # partial results too
