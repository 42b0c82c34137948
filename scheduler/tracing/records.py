"""What the tracer measures per compute fx node (:class:`OpRecord`), and storage identity.

The measuring itself is ``scheduler.tracing.costs.measure_ops``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from graphs import CUDA_BLOCK

__all__ = ["OpRecord", "storage_key", "storage_bytes", "fake_copy"]


@dataclass(frozen=True)
class OpRecord:
    """Costs of one compute fx node (plus the ``get_attr`` nodes folded before it).

    Attributes:
        name: the fx node's name.
        members: fx node names covered (``get_attr`` nodes first, then ``name``).
        op: the fx target, printable.
        module: dotted module path ("" at the top level).
        inputs: positions (in the record list) of the records this one reads:
            direct producers and the owners of storages it reads through views.
        owners: the subset of ``inputs`` that own storage this node reads.
        out_bytes: bytes of the storages this node creates and returns (on the
            target's kernels: ``storage_extra_bytes`` included).
        storage_extra_bytes: what the target's kernel holds behind a returned
            loss beyond its fake storage (NOTE [ A loss's input-sized storage ]
            in ``scheduler.tracing.loss_storage``).
        saves: positions of records whose output this node saves (may include
            its own position).
        own_saved_bytes: bytes of saved tensors owned by nobody else.
        fwd_flops, bwd_flops: counted FLOPs (NOTE [ Ops without a FLOP formula ]).
        grad_views: the backward returned views of its output's gradient for
            its inputs (``cat``): measured in the backward hooks.
        estimated_fwd_flops, estimated_bwd_flops: the part of ``fwd_flops``
            and ``bwd_flops`` counted as one per element rather than by
            ``FlopCounterMode``.
        param_keys: storage keys of the parameters the node touched.
        requires_grad, stochastic, stateful: flags.
        state_bytes: bytes of the buffers a stateful node reads or writes (all
            of a BatchNorm's: ``native_batch_norm`` updates the running
            statistics without declaring the write; ``num_batches_tracked``
            is what marks it stateful).
        returned: the graph's output returns this node's value.
        output: the model's return value holds a storage this node owns
            (NOTE [ Finding the model's outputs ] in ``scheduler.tracing.outputs``).
        bwd_peak_bytes: the most bytes the node's backward had allocated at
            once (gradients of its inputs and parameters, and temporaries),
            including the sum the engine makes when it adds the node's
            contribution into a parameter gradient that another node's
            backward already started (NOTE [ Shared parameter gradients ]).
        kernels: per ATen op the node's forward runs that does work (views and
            bare allocations left out), ``(dtype, FLOPs, bytes moved, random
            numbers drawn)``: the
            roofline's inputs (NOTE [ Roofline costs ] in
            ``scheduler.tracing.roofline``).
        fwd_cost: the node's recompute cost in FLOP-equivalents, set by a
            cost model (``roofline``, ``time``); None: ``fwd_flops``.
        dispatch: the ATen overloads the node's forward runs below autograd,
            in order, as a selective-checkpoint policy counts them.
        sac_op: position in ``dispatch`` of the one call that creates exactly
            the storages the node owns, or -1 (NOTE [ Which op a policy keeps ]
            in ``scheduler.tracing.recorder``).
        free_calls: every call in ``dispatch`` is free (a view or bare
            relabelling: no kernel, no write, no random numbers).
        rows: the rows of the node's first tensor output, the product of its
            shape but the last dimension (1 for a scalar); 0 when it returns
            no tensor (NOTE [ Chunk counts and rows ] in ``solvers.model.chunks``).
    """

    name: str
    members: tuple[str, ...]
    op: str
    module: str
    inputs: tuple[int, ...]
    owners: tuple[int, ...]
    out_bytes: int
    saves: tuple[int, ...]
    own_saved_bytes: int
    fwd_flops: int
    bwd_flops: int
    param_keys: tuple[int, ...]
    requires_grad: bool
    stochastic: bool
    stateful: bool
    returned: bool
    bwd_peak_bytes: int = 0
    estimated_fwd_flops: int = 0
    estimated_bwd_flops: int = 0
    grad_views: bool = False
    state_bytes: int = 0
    fwd_workspace_bytes: int = 0  # measured: the forward's calls above the node's end state (NOTE [ Op workspaces ])
    aliases: tuple[int, ...] = ()  # records owning the storages its outputs view (NOTE [ Views of written storages ])
    writes: tuple[int, ...] = ()  # records owning the storages its ops write in place
    direct: tuple[int, ...] = ()  # records whose values it takes as arguments (``inputs`` without the owners)
    calls: tuple[tuple[str, str], ...] = ()  # (call id, class) of the submodule calls it runs in (tracing.spans)
    kernels: tuple[tuple[str, int, int, int], ...] = ()
    kernel_ops: tuple[str, ...] = ()  # the ATen overload of each of ``kernels`` (NOTE [ Measured op classes ])
    class_times: tuple[tuple[str, float], ...] = ()  # (class, seconds) timed at their shapes (same NOTE)
    fwd_cost: int | None = None
    dispatch: tuple[str, ...] = ()
    sac_op: int = -1
    free_calls: bool = False
    output: bool = False
    storage_extra_bytes: int = 0
    rows: int = 0

    @property
    def cost(self) -> int:
        """The recompute objective: ``fwd_cost`` when a cost model set it, else ``fwd_flops``."""
        return self.fwd_flops if self.fwd_cost is None else self.fwd_cost

    @property
    def estimated_flops(self) -> int:
        return self.estimated_fwd_flops + self.estimated_bwd_flops


def storage_key(t: torch.Tensor) -> int | None:
    """An id of the storage behind ``t`` (views share it); None without storage."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None




_FOR_CUDA: list[bool] = []  # traces in progress: for a CUDA target? (their fake tensors may be on meta or the CPU)


@contextlib.contextmanager
def cuda_blocks(on: bool) -> Iterator[None]:
    """While a trace runs: its storages are counted as a card's blocks when ``on`` (a CUDA target), as bytes
    otherwise, whatever device its fake tensors are on."""
    _FOR_CUDA.append(on)
    try:
        yield
    finally:
        _FOR_CUDA.pop()


def block_bytes(nbytes: int, device: torch.device) -> int:
    """What ``nbytes`` of storage take on ``device``: rounded up to :data:`CUDA_BLOCK` inside a trace for a CUDA
    target (:func:`cuda_blocks`), and outside traces on a CUDA device.

    NOTE [ CUDA blocks ]
        PyTorch's CUDA caching allocator rounds every request up to a multiple
        of 512 B (``round_size``; no allocation for 0 B), and
        ``torch.cuda.max_memory_allocated``, what "fits" means on a GPU,
        counts the rounded blocks. A trace for a CUDA target counts each
        storage so, whatever device its fake tensors are on (on the card, or
        a model on ``meta`` or the CPU traced for a card by name: inside
        :func:`cuda_blocks`; a ``meta`` model is traced for a GPU by default):
        on an H200, GPT-2's plan at the library's peak measured 2,552 B
        over a prediction made of the requested bytes, and the small modules
        of ``benchmarks.generated`` up to 29 % over. What the allocator does
        beyond (a cached block handed out whole when the rest would be too
        small to keep, 4.26 MB on ResNet-50's least plan) is not modelled:
        ``ckpt fit`` keeps a reserve (NOTE [ Reserve ] in
        ``scheduler.sizing.memory``).
    """
    if nbytes > 0 and (_FOR_CUDA[-1] if _FOR_CUDA else device.type == "cuda"):
        return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
    return nbytes


def storage_bytes(t: torch.Tensor) -> int:
    try:
        st = t.untyped_storage()
        return block_bytes(int(st.nbytes()), st.device)
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()



def fake_copy(fake: Any, t: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """A fake tensor of ``fake`` (a ``FakeTensorMode``) standing for ``t``; a ``meta`` tensor moved
    to ``device`` when one is given (NOTE [ Trace targets ] in ``scheduler.tracing.target``).

    Moved tensors wrap a detached alias of ``t``: views of one storage stay one storage.
    """
    if device is None or t.device.type != "meta" or device.type == "meta":
        return fake.from_tensor(t, static_shapes=True)
    out = fake.fake_tensor_converter.from_meta_and_device(fake, t.detach(), device)
    return out.requires_grad_(t.requires_grad) if t.requires_grad and out.is_leaf else out
