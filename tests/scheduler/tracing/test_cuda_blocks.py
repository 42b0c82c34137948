"""NOTE [ CUDA blocks ]: a trace whose tensors live on CUDA counts each storage as the caching allocator's
512-B multiple (what ``torch.cuda.max_memory_allocated`` counts); a CPU trace counts the bytes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import scheduler
from scheduler.tracing.records import CUDA_BLOCK, block_bytes

from row_nets import RowNet


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).train()


def test_block_bytes_rounds_on_cuda_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [block_bytes(n, cuda) for n in (0, 1, 512, 513, 2**20 + 4)] == [0, 512, 512, 1024, 2**20 + 512]
    assert [block_bytes(n, cpu) for n in (0, 1, 513)] == [0, 1, 513]


def test_a_trace_for_a_gpu_counts_whole_allocator_blocks():
    x = torch.randn(3, 5)
    cpu = scheduler.trace(_model(), (x,), {})
    with torch.device("meta"):
        model = _model()
    gpu = scheduler.trace(model, (x.to("meta"),), {}, target="H100")
    assert [n.name for n in gpu.nodes] == [n.name for n in cpu.nodes]
    assert any(n.out_bytes % CUDA_BLOCK for n in cpu.nodes)  # the CPU counts bytes: 3 x 7 floats are 84 B
    for a, b in zip(gpu.nodes, cpu.nodes):
        assert a.out_bytes == -(-b.out_bytes // CUDA_BLOCK) * CUDA_BLOCK, (a, b)
    assert scheduler.simulate(gpu).peak_bytes > scheduler.simulate(cpu).peak_bytes


@pytest.mark.parametrize("k,checkpointed", [(3, False), (3, True), (4, True)])
def test_each_chunk_of_a_plan_for_a_gpu_is_counted_in_whole_blocks(k, checkpointed):
    """A chunk's tensors are blocks of their own: 18 rows of 40 B are 720 B (two blocks) as one tensor, and three
    chunks of 240 B take a block each, where a share of the whole call's two blocks is 352 B. Measured on the CPU
    with every storage counted as the card's allocator counts it (the storage meter inside ``cuda_blocks``)."""
    from graphs import storage_unit
    from scheduler.measuring.steps import measure_step_peak
    from scheduler.tracing.records import cuda_blocks
    from solvers import Plan
    from solvers.model.chunks import expand, find_calls, parse_chunk_module

    torch.manual_seed(0)
    model = RowNet(width=10, vocab=13).train()
    x, labels = torch.randn(2, 9, 5), torch.randint(0, 13, (18,))

    def loss(out: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), labels)

    graph = scheduler.trace(model, (x,), {}, loss=loss, target="H100")
    assert storage_unit(graph.meta) == CUDA_BLOCK
    (call,) = find_calls(graph)
    chunks = ((call.first, call.last, k),)
    work = expand(graph, chunks)
    for nd in work.nodes:
        assert nd.out_bytes % CUDA_BLOCK == 0 and nd.saved_bytes % CUDA_BLOCK == 0, nd
    regions = [(sp.first, sp.last) for sp in work.spans if parse_chunk_module(sp.module)] if checkpointed else []
    plan = Plan.from_regions(graph, regions, chunks=chunks)
    predicted = scheduler.simulate(graph, plan).peak_bytes
    scheduler.apply(model, plan)
    with cuda_blocks(True):
        measured = measure_step_peak(model, model, (x,), {}, loss)
    assert measured <= predicted, f"{measured} B measured in blocks, {predicted} B predicted"
