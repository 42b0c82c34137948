"""Measured backward workspaces of convolutions (``capture(..., workspaces="measure")``).

NOTE [ Convolution workspaces ]
    A convolution's backward allocates buffers that exist only inside the op
    and are no tensor the tracer can see: on this project's CPU build one
    3x3 convolution at VGG-19's first shape (384x16x64x64) peaks at 288 MiB
    allocated for a 96 MiB input gradient. Such buffers set the allocator's
    peak of conv nets (VGG-19 at batch 384: 320 MiB of tensors, 512 MiB
    allocated). With ``workspaces="measure"`` every distinct convolution of
    the graph (shapes, dtype, strides, which inputs need a gradient) is run
    once, forward then backward, on real tensors of the target device, and
    the backward's peak beyond the gradients it leaves behind is added to the
    node's backward transient (``Node.workspace_bytes``). On the CPU the
    profiler's allocator events give the peak, on CUDA
    ``torch.cuda.max_memory_allocated``. A graph traced on the ``meta``
    device is measured on the CPU (the kernels, and so the workspaces, of
    another device can differ). Off by default: it allocates real memory of
    the size of the largest convolution, and the storage count of
    ``scheduler.measuring.storages`` does not see these buffers either.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

import torch

if TYPE_CHECKING:  # costs imports conv_signature from here
    from .costs import OpRecord

__all__ = ["conv_signature", "measure_conv_workspaces", "conv_backward_workspace"]

log = logging.getLogger(__name__)


def conv_signature(args: Sequence[Any]) -> tuple:
    """What decides a convolution's kernels: shapes, dtype, geometry, which inputs need grad."""
    x, w, b = args[0], args[1], args[2]
    return (tuple(x.shape), str(x.dtype), bool(x.requires_grad), tuple(w.shape), bool(w.requires_grad),
            None if b is None else (tuple(b.shape), bool(b.requires_grad)),
            tuple(args[3]), tuple(args[4]), tuple(args[5]), bool(args[6]), tuple(args[7]), int(args[8]))


def conv_backward_workspace(sig: tuple, device: torch.device) -> int:
    """Bytes the backward of one convolution holds beyond the gradients it leaves."""
    shape, dtype, x_rg, w_shape, w_rg, bias, stride, padding, dilation, transposed, out_pad, groups = sig
    dt = getattr(torch, dtype.split(".")[-1])
    x = torch.randn(shape, dtype=dt, device=device, requires_grad=x_rg)
    w = torch.randn(w_shape, dtype=dt, device=device, requires_grad=w_rg)
    b = None if bias is None else torch.randn(bias[0], dtype=dt, device=device, requires_grad=bias[1])
    y = torch.ops.aten.convolution.default(x, w, b, list(stride), list(padding), list(dilation), transposed,
                                           list(out_pad), groups)
    if not y.requires_grad:
        return 0
    gy = torch.randn_like(y)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        y.backward(gy)
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y.backward(gy)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return max(0, peak - live)


def measure_conv_workspaces(records: Sequence[OpRecord], device: torch.device) -> list[OpRecord]:
    """``records`` with each convolution's measured backward workspace added to its backward peak."""
    device = torch.device("cpu") if device.type == "meta" else device
    cache: dict[tuple, int] = {}
    out = []
    for r in records:
        if not r.convs or not r.requires_grad:
            out.append(r)
            continue
        extra = 0
        for sig in r.convs:
            if sig not in cache:
                cache[sig] = conv_backward_workspace(sig, device)
            extra += cache[sig]
        out.append(replace(r, bwd_peak_bytes=r.bwd_peak_bytes + extra) if extra else r)
    log.info("measured %d distinct convolution backward(s) on %s: up to %d bytes of workspace", len(cache),
             device, max(cache.values(), default=0))
    return out
