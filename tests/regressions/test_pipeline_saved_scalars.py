"""A pipeline stage holds its own nodes' saved Python scalars once per micro-batch in flight (NOTE [ What a rank
holds ] in ``scheduler.distributed.ranks``).

transformers' GPT-2 activation (``gelu_new``: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``)
multiplies by three Python floats, which autograd's ``MulBackward0`` keeps as 8-byte tensors from each forward to
its backward, past the saved-tensor hooks (NOTE [ Saved Python scalars ] in ``scheduler.tracing.costs``). The
trace counts them once, in the graph's inputs; a middle stage's graph counted none, and a stage holding two
micro-batches holds them twice: rank 2 of a 4-stage 1F1B pipeline of GPT-2 (4 layers) measured 48 B over its
prediction on gloo (``benchmarks/results/distributed.md``). Here on a small decoder with that activation.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

import scheduler
from scheduler.distributed import Layout, solve_layout
from scheduler.distributed.inflight import chunk_memory
from scheduler.distributed.plans import rank_graphs
from scheduler.distributed.stages import stage_starts
from scheduler.models.staged import StagedLM, _Block

SPEC = "test_pipeline_saved_scalars:model"
BATCH, SEQ, MICROBATCHES, STAGES = 8, 32, 4, 4
SCALARS_PER_BLOCK = 3 * 8  # 0.5, 0.044715, sqrt(2 / pi): one float64 ``other`` per MulBackward0


class _GeluNew(nn.Module):
    """transformers' ``NewGELUActivation``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def model() -> StagedLM:
    torch.manual_seed(0)
    blocks = []
    for _ in range(STAGES):
        b = _Block(64, 4)
        b.mlp.act = _GeluNew()
        blocks.append(b)
    return StagedLM(vocab=256, width=64, heads=4, seq=SEQ, blocks=blocks).train()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (BATCH, SEQ), generator=g), torch.randint(0, 256, (BATCH, SEQ), generator=g)


model.batch = _batch  # type: ignore[attr-defined]

LAYOUT = Layout(pp=STAGES, microbatches=MICROBATCHES, schedule="1f1b")


@pytest.fixture(scope="module")
def graph():
    x, y = _batch()
    return scheduler.trace(model(), (x[:BATCH // MICROBATCHES], y[:BATCH // MICROBATCHES]))


def test_each_stage_holds_its_own_scalars_per_micro_batch(graph):
    assert graph.meta["saved_scalar_bytes"] == STAGES * SCALARS_PER_BLOCK
    for k, rg in enumerate(rank_graphs(graph, LAYOUT)):  # one block per stage
        assert rg.meta["saved_scalar_bytes"] == SCALARS_PER_BLOCK, k
        meta = {key: v for key, v in rg.meta.items() if key not in ("saved_scalar_bytes", "saved_scalars")}
        bare = rg.with_nodes(rg.nodes, input_bytes=rg.input_bytes - SCALARS_PER_BLOCK, meta=meta)
        assert chunk_memory(rg, None).retained_bytes == chunk_memory(bare, None).retained_bytes + SCALARS_PER_BLOCK


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")
def test_every_rank_of_a_1f1b_pipeline_is_at_or_below_its_prediction(graph):
    from scheduler.measuring.distributed import PipelineRun, run_distributed

    plans = solve_layout(graph, "1GiB", LAYOUT)
    [result] = run_distributed(SPEC, STAGES, [PipelineRun(stage_starts(graph, LAYOUT), "1f1b", MICROBATCHES)])
    for stage in plans.stages:  # store everything: without the scalars per micro-batch, rank 2 was 48 B over
        assert result.peak(stage.index) <= stage.peak_bytes, (stage.index, result.peak(stage.index), stage.peak_bytes)
