"""Measured workspaces of ATen ops (``capture(..., workspaces="measure")``, and ``"auto"`` off ``meta``).

NOTE [ Op workspaces ]
    Many ATen kernels allocate buffers that exist only inside the call and
    are no tensor the tracer can see: a convolution's backward (on this
    project's CPU build one 3x3 convolution at VGG-19's first shape,
    384x16x64x64, peaks at 288 MiB allocated for a 96 MiB input gradient), a
    depthwise convolution's forward (ConvNeXt's 7x7: its input and weight
    reordered for the kernel), SDPA's CPU backward, layer and group norm...
    Such buffers set the allocator's peak above what the tensors alone say.

    So while the tracer runs the graph on fake tensors (forward and
    backward), :class:`WorkspaceProbe` notes every ATen call that may hold
    such buffers (not views, bare allocations, copies, or ops tagged
    pointwise whose tensor arguments are all contiguous) by a signature: the
    op, and per argument its shape, strides, dtype and layout, or its value.
    A pointwise kernel may copy a non-contiguous argument before it runs:
    on this project's CPU build ``gelu_backward`` (oneDNN) copies a gradient
    that is a slice of a ``cat``'s output gradient (``cat((gelu(a(x)),
    b(x)), -1)``: the slice strides over the other half), and every plan of
    such a module measured 96 B above ``simulate`` (the 128 B copy at the
    gelu's backward; ``tests/regressions/test_pointwise_strided_workspace.py``);
    ``tanh_backward``, ``mul`` and most others take the slice as it is, and
    measure no more than their output. Afterwards each distinct signature is
    run once more, twice in fact (the first call warms the kernel's caches,
    the second is measured), on real tensors of the target device (random
    floats, zero integers), and what the call allocates at its peak
    (outputs included) is its *peak delta*: on the CPU from the profiler's
    memory events inside a ``record_function`` range (all signatures in one
    profiler session), on CUDA from ``torch.cuda.max_memory_allocated``.

    The recorder knows the fake bytes live before each call, so a call's
    real peak is ``live before + peak delta``. In a node's backward that
    raises the measured backward peak (``OpRecord.bwd_peak_bytes``, hence
    the node's ``workspace_bytes``); in its forward, what the node's calls
    reach above the bytes live when the node ends (its outputs and buffers)
    is ``OpRecord.fwd_workspace_bytes``, which the graph builder adds at
    that node's step of the group's temporaries (NOTE [ Merging nodes ]),
    and ``simulate`` holds it for the node's forward and recompute steps.

    The live bytes before a backward call are those of the trace, which runs
    without regions: autograd holds a node's saved tensors through its whole
    backward. Under a checkpoint region a saved tensor is the recomputed copy,
    and once unpacked only the backward formula holds it, so it can be freed
    before a later call of the same node: on an H200, ViT-B/16's fc2 (batch
    64) frees its 155 MB recomputed input after the weight gradient, before
    the bias gradient's ``sum`` (77.5 MB of workspace), and the per-layer
    plan measured 1.639 GB for 1.715 GB predicted. Such a prediction errs
    high (the safe side); the next model of the step should know it.

    A graph traced on the ``meta`` device is measured on the CPU with
    ``"measure"`` (the kernels, and so the workspaces, of another device can
    differ), and not at all with ``"auto"``. ``graph.meta["workspaces"]``
    names the device measured on. Workspaces are no part of the fingerprint.
    ``scheduler.measuring.storages``'s storage count does not see these
    buffers (they are no tensors): compare it with a ``workspaces="none"``
    trace.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

__all__ = ["WorkspaceProbe"]

log = logging.getLogger(__name__)

#: Ops whose only allocations are their outputs (copies, fills, allocations) or that are no kernels.
_NO_WORKSPACE = frozenset((
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view", "lift_fresh",
    "lift_fresh_copy", "resize_", "set_", "clone", "_to_copy", "copy_", "detach", "alias", "zeros_like",
    "ones_like", "full_like", "fill_", "zero_", "zeros", "ones", "full", "scalar_tensor", "_local_scalar_dense",
    "new_zeros", "new_ones", "new_full", "arange", "randn", "rand", "randint", "randn_like", "rand_like",
))


class _Spec:
    """A tensor argument to rebuild: shape, strides, dtype, whether it was a CPU tensor (the layout is always
    strided here).

    A kernel of a GPU may take some arguments on the CPU: SDPA's memory-efficient attention with dropout
    returns its Philox seed and offset as CPU tensors and its backward reads them on the host. Built on the GPU,
    that backward read a device pointer on the host and crashed the process (GPT-2 as ``GPT2Config()`` ships it,
    dropout 0.1, traced on an H200: a segmentation fault). So an argument that was on the CPU while the call
    ran for another device is built on the CPU, and so is the seed and offset of an attention kernel (an
    integer tensor of at most two elements), which the fake tensors put on the GPU with the other arguments."""

    __slots__ = ("shape", "stride", "dtype", "on_cpu")

    def __init__(self, t: torch.Tensor, seed: bool = False) -> None:
        self.shape = tuple(int(s) for s in t.shape)
        self.stride = tuple(int(s) for s in t.stride())
        self.dtype = t.dtype
        self.on_cpu = t.device.type == "cpu" or (seed and not t.is_floating_point() and t.numel() <= 2)

    def key(self) -> tuple:
        return ("T", self.shape, self.stride, str(self.dtype), self.on_cpu)

    def build(self, device: torch.device) -> torch.Tensor:
        device = torch.device("cpu") if self.on_cpu else device
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)
        if t.is_floating_point() or t.is_complex():
            t.normal_()
        else:
            t.zero_()
        return t


def _eligible(func: Any, leaves: list[Any]) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "is_view", False):
        return False
    if schema.name.split("::")[-1] in _NO_WORKSPACE:
        return False
    if torch.Tag.pointwise not in func.tags:
        return True
    # a pointwise kernel may copy a strided argument first (NOTE [ Op workspaces ]: gelu_backward on the CPU)
    return any(isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_contiguous() for v in leaves)


class WorkspaceProbe:
    """Notes the ATen calls of a trace by signature and measures their peak deltas (NOTE [ Op workspaces ])."""

    def __init__(self) -> None:
        self.specs: dict[tuple, tuple[Any, Any]] = {}  # signature -> (op, spec'd (args, kwargs))
        self.deltas: dict[tuple, int] = {}

    def note(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        """The call's signature when it may hold a workspace (remembered on first sight), else None."""
        leaves, tree = pytree.tree_flatten((args, kwargs))
        if not _eligible(func, leaves):
            return None
        if not any(isinstance(v, torch.Tensor) for v in leaves):
            return None
        key: list[Any] = [str(func)]
        attention = "attention" in str(func)  # its Philox seed and offset live on the CPU (_Spec)
        for v in leaves:
            if isinstance(v, torch.Tensor):
                if v.layout != torch.strided or v.is_quantized or v.is_nested:
                    return None
                key.append(_Spec(v, attention).key())
            else:
                key.append((type(v).__name__, repr(v)))
        sig = (tuple(key), str(tree))
        if sig not in self.specs:
            spec = [(_Spec(v, attention) if isinstance(v, torch.Tensor) else v) for v in leaves]
            self.specs[sig] = (func, (spec, tree))
        return sig

    def measure(self, device: torch.device) -> dict[tuple, int]:
        """Peak bytes each noted signature allocates inside the call (outputs included), on ``device``."""
        device = torch.device("cpu") if device.type == "meta" else device
        pending = [s for s in self.specs if s not in self.deltas]
        if not pending:
            return self.deltas
        # the probed calls draw random numbers too (dropout): the user's generators stay where they were
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            if device.type == "cuda":
                for sig in pending:
                    self.deltas[sig] = self._cuda(sig, device)
            else:
                self._cpu(pending, device)
        log.info("measured %d distinct op signature(s) on %s: up to %d bytes above their inputs", len(pending),
                 device, max((self.deltas.get(s, 0) for s in pending), default=0))
        return self.deltas

    def _call(self, sig: tuple, device: torch.device) -> Callable[[], Any] | None:
        func, (spec, tree) = self.specs[sig]
        try:
            leaves = [(v.build(device) if isinstance(v, _Spec) else v) for v in spec]
            args, kwargs = pytree.tree_unflatten(leaves, tree)
            func(*args, **kwargs)  # warm the kernel's caches
        except Exception as exc:  # an op that needs real data (indices, probabilities): not measured
            log.debug("workspace of %s not measured: %s", func, exc)
            return None
        return lambda: func(*args, **kwargs)

    def _cuda(self, sig: tuple, device: torch.device) -> int:
        call = self._call(sig, device)
        if call is None:
            return 0
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = call()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        del out
        return max(0, int(peak))

    def _cpu(self, pending: list[tuple], device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, record_function

        from ..measuring.profiler import quiet_profile

        names: dict[str, tuple] = {}
        with quiet_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for k, sig in enumerate(pending):
                call = self._call(sig, device)
                if call is None:
                    self.deltas[sig] = 0
                    continue
                name = f"ckpt-workspace#{k}"
                names[name] = sig
                with record_function(name):
                    out = call()
                del out, call
        ranges, mem = [], []
        for e in prof.profiler.kineto_results.events():
            if e.name() == "[memory]":
                mem.append((e.start_ns(), e.nbytes()))
            elif e.name() in names:
                ranges.append((e.start_ns(), e.start_ns() + e.duration_ns(), names[e.name()]))
        mem.sort()
        times = [t for t, _ in mem]
        live = [0]
        for _, nbytes in mem:
            live.append(live[-1] + nbytes)
        for start, end, sig in ranges:
            i, j = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
            base = live[i]
            self.deltas[sig] = max(0, max(live[i:j + 1]) - base)
        for sig in names.values():
            self.deltas.setdefault(sig, 0)
