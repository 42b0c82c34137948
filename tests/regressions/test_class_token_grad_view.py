"""A patch embedding's gradient stays a view of the ``cat``'s gradient when the view group also expands a parameter.

torchvision's ``VisionTransformer`` embeds patches with ``conv_proj(x).reshape(n, d, -1).permute(0, 2, 1)``
and then expands its class token (a parameter) before ``cat([class_token, x], 1)``. With free ops folded
(``granularity="fold"``, and every coarser one: ``auto`` chose it for ``vit_b_16``) the ``reshape``, the
``permute`` and the ``expand`` were one node, and that node lost ``grad_views``: the ``expand``'s backward
sums its gradient into a new tensor, though it hands it only to the class token's ``AccumulateGrad``. So
``simulate`` let the ``cat``'s ``[n, 1 + patches, d]`` gradient go and held the convolution's own
``[n, d, h, w]`` instead, while the real convolution backward reads a view of the whole ``cat`` gradient:
torchvision's ``vit_b_16`` (32 x 32 images, batch 2) measured 6,144 B (the class token's rows) above its
prediction under every plan. A member whose backward feeds no traced activation now has no say in a view
group's ``grad_views`` (``scheduler/tracing/build.py``, NOTE [ View gradients through views ]).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import scheduler
from scheduler.measuring.steps import allocator_step_peak
from solvers import Plan, simulate

BATCH, WIDTH = 2, 64


class _PatchViT(nn.Module):
    """torchvision's ViT embedding, one block, and its head on the class token."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, WIDTH, 4, 4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos = nn.Parameter(torch.randn(1, 5, WIDTH) * 0.02)
        self.ln, self.fc = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).reshape(n, WIDTH, -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1) + self.pos
        x = x + torch.tanh(self.fc(self.ln(x)))
        return self.head(x[:, 0])


@pytest.mark.parametrize("granularity", ["fold"])
def test_patch_gradient_view_is_predicted(granularity):
    torch.manual_seed(0)
    model = _PatchViT().train()
    x, target = torch.randn(BATCH, 3, 8, 8), torch.randint(0, 10, (BATCH,))

    def loss(out):
        return F.cross_entropy(out, target)

    graph = scheduler.trace(model, (x,), {}, loss=loss, granularity=granularity)
    group = next(nd for nd in graph.nodes if "permute" in nd.members)
    assert group.out_bytes == 0 and group.grad_views, group
    spans = [sp for sp in graph.spans if sp.module in ("conv_proj", "ln", "fc", "head")]
    for pick in [()] + [(sp,) for sp in spans]:
        plan = Plan.from_regions(graph, [(sp.first, sp.last) for sp in pick])
        planned = copy.deepcopy(model)
        scheduler.apply(planned, plan)
        measured = allocator_step_peak(planned, planned, (x,), {}, loss)
        assert measured <= simulate(graph, plan).peak_bytes, ([sp.module for sp in pick], measured)
