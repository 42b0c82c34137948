"""The floor message names the chunked head and what it would buy (NOTE [ Chunked head ] in solvers.model.chunks)."""

from __future__ import annotations

from scheduler.sizing.budget import format_bytes
from scheduler.sizing.floor import explain_floor
from solvers import Plan, simulate
from solvers.model.chunks import chunk_entries, chunked_graph
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


def test_a_head_that_cannot_be_chunked_leaves_the_floor_without_the_lever(monkeypatch):
    """Issue 33: torchvision's DenseNet-121 at batch 4, an infeasible budget: the floor's chunk lever built the
    head in 16 chunks of 4 rows and raised a GraphError ("span ... out of range") in place of the answer."""
    from graphs import GraphError
    from scheduler.sizing import floor

    g = lm_graph(blocks=2, vocab_x=16)

    def unchunkable(*_a, **_k):
        raise GraphError("span [82, 81, 'net+loss@chunk0/16'] is out of range")

    monkeypatch.setattr(floor, "chunked_graph", unchunkable)
    text = explain_floor(g).text
    assert text and "chunks" not in text
