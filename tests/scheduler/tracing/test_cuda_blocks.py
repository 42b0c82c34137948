"""NOTE [ CUDA blocks ]: a trace whose tensors live on CUDA counts each storage as the caching allocator's
512-B multiple (what ``torch.cuda.max_memory_allocated`` counts); a CPU trace counts the bytes."""

from __future__ import annotations

import torch
from torch import nn

import scheduler
from scheduler.tracing.records import CUDA_BLOCK, block_bytes


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
