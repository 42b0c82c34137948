"""A run of nn.Sequential children is no call that chunks can run (NOTE [ Chunked head ] in solvers.model.chunks).

Found by the random-module generator (benchmarks/random_plans.py, module s30: an MLP block then a branch
block in an nn.Sequential): ``find_calls`` offered the outermost row-wise span, the run ``body[0:2]``, so a
chunked plan named it and ``apply`` failed at the step with ``ChunkedHeadError: this plan runs 'body[0:2]' in
chunks, which RandomModel does not have``. A run has no forward of its own to replace; its calls are
offered instead.
"""

from __future__ import annotations

import dataclasses

from chunk_graphs import lm_graph
from graphs import Span
from solvers.model.chunks import find_calls


def test_a_sequential_run_is_not_offered_its_calls_are():
    graph = lm_graph(0, blocks=2)
    blocks = [sp for sp in graph.spans if sp.module.startswith("block")]
    run = Span(blocks[0].first, blocks[1].last, "body[0:2]")  # both blocks, as the tracer names a run
    graph = dataclasses.replace(graph, spans=tuple(sorted(graph.spans + (run,), key=lambda s: (s.first, -s.last))))
    calls = find_calls(graph)
    assert [sp.module for sp in calls] == ["block0", "block1"]
