"""The dispatch mode that watches every ATen op a node runs while it is measured.

It sees what the fx level cannot: random ops, which parameters and buffers
are touched or written, the convolutions run, the bytes allocated (for the
backward peaks), and each kernel's FLOPs and bytes moved (the roofline's
inputs, NOTE [ Roofline costs ] in ``scheduler.tracing.roofline``).
"""

from __future__ import annotations

import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .records import storage_bytes, storage_key
from .workspaces import conv_signature

__all__ = ["OpWatch"]


class OpWatch(TorchDispatchMode):
    """Sees every aten op: random ops, parameters touched, state written."""

    def __init__(self, param_keys: set[int], state_keys: set[int]):
        super().__init__()
        self.param_keys = param_keys
        self.state_keys = state_keys
        self.reset()

        self.live = 0  # bytes of storages created under the mode and still alive
        self.peak = 0
        self.tracking: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.tracking.discard(key)

    def reset(self) -> None:
        self.stochastic = False
        self.stateful = False
        self.state_read: dict[int, int] = {}  # storage key -> bytes, buffers the node's ops read or wrote
        self.convs: list[tuple] = []
        self.touched: dict[int, None] = {}
        self.written: dict[int, None] = {}  # storage keys written in place (aten schema: Tensor(a!))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.stochastic = True
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                if k in self.param_keys:
                    self.touched[k] = None
                elif k in self.state_keys:
                    self.state_read[k] = storage_bytes(t)
        if func is torch.ops.aten.convolution.default:
            self.convs.append(conv_signature(args))
        if func is torch.ops.aten.native_batch_norm.default and len(args) > 5 and args[5]:
            # training mode updates running_mean/var in place without declaring the write
            for t in args[3:5]:
                if isinstance(t, torch.Tensor) and storage_key(t) in self.state_keys:
                    self.stateful = True
        schema = func._schema
        if schema.is_mutable:
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    v = args[i] if i < len(args) else kwargs.get(a.name)
                    for t in pytree.tree_leaves(v):
                        if isinstance(t, torch.Tensor):
                            if storage_key(t) in self.state_keys:
                                self.stateful = True
                            self.written[storage_key(t)] = None
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                if k is not None and k not in self.tracking and k not in self.param_keys:
                    st = t.untyped_storage()
                    nbytes = int(st.nbytes())
                    self.tracking.add(k)
                    self.live += nbytes
                    weakref.finalize(st, self._freed, k, nbytes)
        self.peak = max(self.peak, self.live)
        return out

