"""A chunked call that returns more than one tensor is refused in one line, not with torch's TypeError.

Found by the random-module generator (benchmarks/random_plans.py, module s20: a body that loops over its
blocks and returns ``(hidden, caches)``): the traced graph sees the hidden states only, so ``find_calls``
offers the body as a row-wise call, and the chunked step raised ``TypeError: expected Tensor as element 0 in
argument 0, but got tuple`` from ``torch.cat``. It now raises ``ChunkedHeadError`` naming the call and the
way out.
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
