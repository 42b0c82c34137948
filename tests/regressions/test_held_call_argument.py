"""A call's tensor argument that it never reads, made before it and saved by nobody, is held by checkpoint
(NOTE [ A call's held arguments ]).

GPT-2 passes ``position_ids`` (int64) to every block, which never reads it; with the position embedding frozen
(peft's LoRA freezes the base) nothing saves it and the graph freed it after the embedding, while a region
around a block held it to its backward: peft's LoRA GPT-2 with its head in 8 chunks measured 256 B over its
prediction (benchmarks/results/levers.md). Here a tiny plain-torch model of the same shape of code, 252 B over
before.
"""

import torch
from torch import nn
from torch.nn import functional as F

import scheduler
from benchmarks.random_plans import run_pair
from solvers import Plan

SEQ, WIDTH, VOCAB = 32, 4, 11


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.ln(x)))  # position_ids passed along by the caller, never read


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.h = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(WIDTH, VOCAB)
        self.wte.requires_grad_(False)  # frozen, as peft leaves the base: the embeddings save no ids
        self.wpe.requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = (torch.arange(ids.shape[1]) + 0).unsqueeze(0)
        h = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            h = block(h, position_ids=pos)
        return self.head(h)


def test_a_region_holds_the_unread_argument_its_call_receives():
    torch.manual_seed(0)
    model, ids, labels = _Net(), torch.randint(0, VOCAB, (1, SEQ)), torch.randint(0, VOCAB, (SEQ,))

    def loss(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.reshape(-1, VOCAB), labels)

    graph = scheduler.trace(model, (ids,), {}, loss=loss)
    held = {nd.name: nd.out_bytes for nd in graph.nodes if nd.op == "call arguments"}
    assert held == {"h.0.args": SEQ * 8}  # the int64 ids: one storage, one node, before the first block's span
    spans = {sp.module: sp for sp in graph.spans}
    assert graph.nodes[spans["h.0"].first - 1].name == "h.0.args"
    for block in ("h.0", "h.1"):  # each block's region holds it (once) to its backward
        assert "h.0.args" in graph.nodes[spans[block].first].inputs
    regions = [(spans[b].first, spans[b].last) for b in ("h.0", "h.1")]
    out = run_pair(model, (ids,), loss, graph, Plan.from_regions(graph, regions))
    assert not out.error and out.equal, out.error
    assert out.allocator <= out.predicted, f"allocator {out.allocator} > predicted {out.predicted}"
    assert out.predicted - out.allocator < SEQ * 8  # the ids counted once, not once per region
