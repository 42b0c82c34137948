"""simulate against the run on random modules x random plans (benchmarks/random_modules.py, random_plans.py).

A few dozen (module, plan) pairs, every plan kind over modules whose blocks cover the grammar (attention by
SDPA and by hand with dropout, MLPs with in-place ReLU, convolutions with BatchNorm, branches, in-place adds,
LayerNorm heads, cache-like outputs), both loops. Each plan is applied onto a fresh copy of its module and
stepped once in its loop: the allocator's peak (the profiler's memory events) is at or under ``simulate``'s
prediction, and loss, gradients and BatchNorm statistics equal the unplanned step's bitwise (a chunked plan:
within ``CHUNK_RTOL`` of the largest gradient, its sums over rows reassociated; chunk counts divide the token
rows, where the prediction claims exactness, NOTE [ Chunked head ]). The benchmark
(``python -m benchmarks.generated``) runs hundreds.

Left out of the peak assertion: a nested plan one of whose inner regions has an input that a node inside it
saves. ``simulate`` frees that input when the inner region's recompute ends although the node's backward
still reads it (the NESTED rule of issue 33, fixed on its own branch); such plans run here, their gradients
are asserted, and their peaks are reported by the benchmark.
"""

from __future__ import annotations

import functools

import pytest

import scheduler
from benchmarks.random_modules import describe, draw_spec, random_case
from benchmarks.random_plans import KINDS, draw_plan, plan_kind, run_pair

#: Seeds of modules whose blocks cover the grammar (each block kind, both attentions, dropout, a cache).
SEEDS = (0, 1, 6, 8, 13, 20, 21, 26)
#: The plans of each module: a kind per draw, the loop alternating.
PLAN_KINDS = ("regions", "kept", "chunked", "nested", "mixed")


@functools.lru_cache(maxsize=None)
def _traced(seed: int):
    spec, model, args, loss = random_case(seed)
    return spec, model, args, loss, scheduler.trace(model, args, {}, loss=loss)


def test_the_grammar_is_covered_and_seeded():
    specs = [draw_spec(s) for s in SEEDS]
    blocks = {(b.kind, b.option) for sp in specs for b in sp.blocks}
    assert {k for k, _ in blocks} == {"mlp", "attn", "conv", "branch", "norm"}
    assert {("attn", "sdpa"), ("attn", "manual")} <= blocks
    assert any(b.dropout for sp in specs for b in sp.blocks) and any(sp.cache for sp in specs)
    assert [describe(draw_spec(s)) for s in SEEDS] == [describe(sp) for sp in specs]  # drawn again the same


@pytest.mark.parametrize("seed", SEEDS)
def test_random_plans_fit_their_prediction_and_keep_the_step(seed):
    spec, model, args, loss, graph = _traced(seed)
    rows = spec.batch * spec.tokens
    seen = []
    for j, kind in enumerate(PLAN_KINDS):
        loop = ("held", "dropped")[(seed + j) % 2]
        plan = draw_plan(graph, kind, seed * 1000 + KINDS.index(kind), loop, rows=rows)
        if plan is None:
            continue
        again = draw_plan(graph, kind, seed * 1000 + KINDS.index(kind), loop, rows=rows)
        assert again == plan  # seeded: a failing pair is named by its seed
        out = run_pair(model, args, loss, graph, plan)
        what = f"{spec.name} {plan_kind(plan)} {loop}: {plan.modules} inner {plan.inner_modules} " \
               f"kept {plan.saved} chunks {plan.chunks}"
        assert not out.error, f"{what}: {out.error}"
        assert out.equal, f"{what}: loss/gradients/buffers differ from the unplanned step (worst {out.worst:.3g})"
        assert out.allocator <= out.predicted, f"{what}: allocator {out.allocator} > predicted {out.predicted}"
        seen.append(plan_kind(plan))
    assert "regions" in seen or "kept" in seen
