"""A chunked call that returns more than one tensor is refused in one line, not with torch's TypeError.

Found by the random-module generator (benchmarks/random_plans.py, module s20: a body that loops over its
blocks and returns ``(hidden, caches)``): the traced graph sees the hidden states only, so ``find_calls``
offers the body as a row-wise call, and the chunked step raised ``TypeError: expected Tensor as element 0 in
argument 0, but got tuple`` from ``torch.cat``. It now raises ``ChunkedHeadError`` naming the call and the
way out. And the menu no longer offers such a call: the trace records the calls that return anything but one
tensor (``graph.meta["call_returns"]``) and ``find_calls`` skips them, offering the calls inside them (NOTE
[ Chunked head ] in ``solvers/model/chunks.py``): the generator's s20, s67 and s93 drew chunked plans of
``body`` that every one failed at their first step.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scheduler.applying.chunked import ChunkedCall, ChunkedHeadError


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))), []


def test_a_chunked_call_returning_a_tuple_is_refused_clearly():
    body = Body()
    body.forward = ChunkedCall(body, "body", 2, (False, False), previous=None)
    with pytest.raises(ChunkedHeadError, match="'body' returns tuple, not one tensor"):
        body(torch.randn(2, 3, 4))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class CacheBody(nn.Module):
    """Returns ``(hidden, caches)``, the caches an empty list (s20 of the generator: no attention block)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        return x + self.mlp(x), []


class CacheModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.body, self.head = nn.Linear(3, 4), CacheBody(), nn.Linear(4, 7)

    def forward(self, x):
        h, _ = self.body(self.stem(x))
        return self.head(h)


def test_a_chunk_menu_skips_a_call_returning_a_tuple_and_chunks_the_one_inside():
    import scheduler
    from solvers import Plan
    from solvers.model.chunks import find_calls

    torch.manual_seed(0)
    model = CacheModel().train()
    x, labels = torch.randn(2, 4, 3), torch.randint(0, 7, (2, 4))

    def loss(out):
        return nn.functional.cross_entropy(out.reshape(-1, 7), labels.reshape(-1))

    graph = scheduler.trace(model, (x,), {}, loss=loss)
    assert graph.meta["call_returns"] == {"body": "tuple"}
    calls = find_calls(graph)
    assert [sp.module for sp in calls] == ["body.mlp"]  # body, whose output is a tuple, is no longer offered
    plan = Plan.from_regions(graph, [], chunks=((calls[0].first, calls[0].last, 2),))
    scheduler.apply(model, plan)
    value = loss(model(x))  # the chunked call runs (it raised ChunkedHeadError when body was chunked)
    value.backward()
    assert torch.isfinite(value)
