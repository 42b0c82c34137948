"""The dispatch mode that watches every ATen op a node runs while it is measured.

It sees what the fx level cannot: random ops, which parameters and buffers
are touched or written, the bytes allocated (for the backward peaks), the
calls whose workspaces are measured (NOTE [ Op workspaces ] in
``scheduler.tracing.workspaces``), and each kernel's FLOPs and bytes moved
(the roofline's inputs, NOTE [ Roofline costs ] in
``scheduler.tracing.roofline``).
"""

from __future__ import annotations

import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .loss_storage import resized_bytes
from .records import block_bytes, storage_bytes, storage_key
from .roofline import TANH_GELU

__all__ = ["OpWatch", "kernel_of", "draws_random", "sac_ignored"]


def sac_ignored(func) -> bool:  # noqa: ANN001
    """Whether selective checkpointing leaves ``func`` out of its op counts (``SAC_IGNORED_OPS``: ``detach``...)."""
    try:
        from torch.utils.checkpoint import SAC_IGNORED_OPS
    except ImportError:  # an older torch: detach is the one it skips
        return func is torch.ops.aten.detach.default
    return func in SAC_IGNORED_OPS


#: ATen ops that allocate without writing, or only relabel storage (not views by their schema): no kernel.
_NO_KERNEL = frozenset(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view",
                        "lift_fresh", "resize_", "set_"))


def kernel_of(func, args: tuple, kwargs: dict, out: object, flops: int  # noqa: ANN001
              ) -> tuple[str, int, int, int] | None:
    """``(dtype, FLOPs, bytes moved, random numbers drawn)`` of one ATen op, or None for a view or bare allocation.

    Bytes moved: every distinct tensor argument read (at most its storage's
    size: an expanded tensor is read once) plus every tensor returned
    (written). The dtype is the first floating-point output's (else
    input's), which picks the peak FLOP rate. Random numbers: the elements
    a random op (``nondeterministic_seeded``: ``bernoulli_``, ``rand``...)
    returns.
    """
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "is_view", False) or schema.name.split("::")[-1] in _NO_KERNEL:
        return None
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not outs:
        return None
    seen: set[int] = set()
    nbytes = 0
    ins = []
    for t in pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            ins.append(t)
            nbytes += min(t.numel() * t.element_size(), storage_bytes(t))
    nbytes += sum(t.numel() * t.element_size() for t in {id(t): t for t in outs}.values())
    floating = [t.dtype for t in outs + ins if t.is_floating_point()]
    dtype = str(floating[0]).replace("torch.", "") if floating else "float32"
    randoms = sum(t.numel() for t in outs) if torch.Tag.nondeterministic_seeded in func.tags else 0
    return dtype, int(flops), int(nbytes), int(randoms)


def draws_random(func, args: tuple, kwargs: dict) -> bool:  # noqa: ANN001
    """Whether the op consumes the generator: tagged ``nondeterministic_seeded``, except attention
    called with ``dropout_p=0`` (SDPA in a model whose attention dropout is 0, or in eval-style
    configs), which draws nothing and needs no RNG replay."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    for i, a in enumerate(func._schema.arguments):
        if a.name == "dropout_p":
            v = args[i] if i < len(args) else kwargs.get(a.name, a.default_value)
            return not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0)
    return True


def tanh_gelu(func, args: tuple, kwargs: dict) -> str:  # noqa: ANN001
    """``TANH_GELU`` for a GELU run with ``approximate="tanh"``, else "": noted on the kernel's op name, a
    class of its own (NOTE [ Slow elementwise kernels ] in ``scheduler.tracing.roofline``)."""
    if func not in (torch.ops.aten.gelu.default, torch.ops.aten.gelu_.default):
        return ""
    approximate = args[1] if len(args) > 1 else kwargs.get("approximate", "none")
    return TANH_GELU if approximate == "tanh" else ""


class OpWatch(TorchDispatchMode):
    """Sees every aten op: random ops, parameters touched, state written, kernels run.

    Args:
        param_keys, state_keys: storage keys of the parameters (and watched
            inputs) and of every parameter and buffer.
        counter: the ``FlopCounterMode`` running below this mode; each
            kernel's FLOPs are its total's growth across the op.
        probe: a ``WorkspaceProbe`` noting the calls whose workspaces are
            measured; each noted call is logged in ``calls`` as
            ``(context, signature, bytes live before it)``, the context
            being what the recorder set (which node, forward or backward).
    """

    def __init__(self, param_keys: set[int], state_keys: set[int], counter=None, probe=None):  # noqa: ANN001
        super().__init__()
        self.param_keys = param_keys
        self.state_keys = state_keys
        self.counter = counter
        self.probe = probe
        self.context: tuple | None = None
        self.calls: list[tuple[tuple, tuple, int]] = []
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
        self.touched: dict[int, None] = {}
        self.written: dict[int, None] = {}  # storage keys written in place (aten schema: Tensor(a!))
        self.kernels: list[tuple[str, int, int, int]] = []  # (dtype, FLOPs, bytes, random numbers) per kernel
        self.kernel_ops: list[str] = []  # the ATen overload of each kernel (NOTE [ Measured op classes ])
        # (overload, storage keys of its tensor outputs, does no work) per op a selective-checkpoint
        # policy would see: NOTE [ Which op a policy keeps ] in scheduler.tracing.recorder
        self.policy_calls: list[tuple[str, tuple[int, ...], bool]] = []
        # storage key -> bytes the target's kernel holds beyond the fake storage (NOTE [ A loss's
        # input-sized storage ] in scheduler.tracing.loss_storage)
        self.extra_storage: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if draws_random(func, args, kwargs):
            self.stochastic = True
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                if k in self.param_keys:
                    self.touched[k] = None
                elif k in self.state_keys:
                    self.state_read[k] = storage_bytes(t)
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
        f0 = self.counter.get_total_flops() if self.counter is not None else 0
        live_before = self.live
        out = func(*args, **kwargs)
        if self.probe is not None and self.context is not None:
            sig = self.probe.note(func, args, kwargs)
            if sig is not None:
                self.calls.append((self.context, sig, live_before))
        flops = self.counter.get_total_flops() - f0 if self.counter is not None else 0
        kernel = kernel_of(func, args, kwargs, out, flops)
        if kernel is not None:
            self.kernels.append(kernel)
            self.kernel_ops.append(str(func) + tanh_gelu(func, args, kwargs))
        if not sac_ignored(func):
            keys = tuple(k for k in (storage_key(t) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
                         if k is not None)
            free = kernel is None and not schema.is_mutable and torch.Tag.nondeterministic_seeded not in func.tags
            self.policy_calls.append((str(func), keys, free))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                if k is not None and k not in self.tracking and k not in self.param_keys:
                    st = t.untyped_storage()
                    raw = int(st.nbytes())
                    nbytes = block_bytes(raw + max(0, resized_bytes(func, args, kwargs, t) - raw), st.device)
                    extra = nbytes - block_bytes(raw, st.device)
                    if extra:
                        self.extra_storage[k] = extra
                    self.tracking.add(k)
                    self.live += nbytes
                    weakref.finalize(st, self._freed, k, nbytes)
        self.peak = max(self.peak, self.live)
        return out

