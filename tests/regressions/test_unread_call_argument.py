"""A region's call argument that no op reads is still held by checkpoint (NOTE [ A call's unread arguments ]).

transformers' BART encoder calls ``self.embed_positions(inputs_embeds[:, :, -1])``, "needed for the shape
only": checkpoint keeps that view, and with it all of ``inputs_embeds``, to the region's backward, while the
graph let ``inputs_embeds`` go after its last reader. The zoo's BART plan at the held loop's least feasible
budget measured 130,808 B over its prediction. Here on a tiny model of the same shape of code.
"""

import torch
from torch import nn

from scheduler.measuring.verification import verify
from scheduler.tracing.tracer import capture
from solvers import Plan, simulate


class _Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 32)

    def forward(self, like: torch.Tensor) -> torch.Tensor:
        b, s = like.shape[:2]  # the argument's shape only: no op reads it
        return self.emb(torch.arange(s).expand(b, -1))


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(100, 32)
        self.pos = _Positions()
        self.lin = nn.Linear(32, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.tok(ids) * 2.0
        h = e + self.pos(e[:, :, -1])  # a view holding all of e, passed for its shape
        return torch.tanh(self.lin(h)).sum()


def test_a_region_holds_its_unread_argument_as_checkpoint_does():
    torch.manual_seed(0)
    model, ids = _Encoder(), torch.randint(0, 100, (8, 64))
    graph = capture(model, (ids,), method="export").graph  # as BART traces: torch.fx reads the shape with an op
    span = next(sp for sp in graph.spans if sp.module == "pos")
    first = graph.nodes[span.first]
    assert first.op == "aten.select.int" and first.out_bytes == 0  # the span starts at the view it is passed
    e_bytes = 8 * 64 * 32 * 4
    assert [graph.nodes[graph.index[x]].out_bytes for x in first.inputs] == [e_bytes]
    plan = Plan.from_regions(graph, [(span.first, span.last)])
    predicted = simulate(graph, plan).peak_bytes
    v = verify(model, plan, (ids,), steps=1, graph=graph)
    assert v.predicted_peak_bytes == predicted
    # by the allocator: without the view in the span, predicted 57,344 B under the measured peak (e held)
    assert v.measured_peak_bytes <= predicted < v.measured_peak_bytes + e_bytes // 4
    assert v.max_grad_diff == 0 and v.loss_diff == 0
