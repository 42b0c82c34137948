"""The floor message names the chunked head and what it would buy (NOTE [ Chunked head ] in solvers.chunks)."""

from __future__ import annotations

from scheduler.sizing.budget import format_bytes
from scheduler.sizing.floor import explain_floor
from solvers import Plan, simulate
from solvers.chunks import chunk_entries, chunked_graph
from chunk_graphs import lm_graph


def test_the_floor_says_what_the_head_in_chunks_would_buy():
    g = lm_graph(blocks=2, vocab_x=16)
    text = explain_floor(g, None).text
    gk = chunked_graph(g, 16)
    lower = simulate(g, Plan(regions=[(sp.first, sp.last) for sp in gk.spans if "@chunk" in sp.module],
                             chunks=chunk_entries(g, 16))).peak_bytes
    assert f"Running the head 'lm_head' and its loss in 16 chunks, each recomputed, would bring this plan to " \
           f"{format_bytes(lower)}" in text
    assert "--chunks 1,2,4,8,16" in text
    assert "16 chunks" not in explain_floor(g, None, levers=False).text


def test_chunks_with_a_layout_are_refused():
    import pytest

    import scheduler
    from scheduler.distributed import Layout
    from solvers import SolverOptionError

    with pytest.raises(SolverOptionError, match="not with layout="):
        scheduler.solve(lm_graph(), 1.0, chunks=(1, 2), layout=Layout(shard=2))
