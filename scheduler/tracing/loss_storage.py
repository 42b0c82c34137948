"""Losses whose kernel leaves a storage larger than the loss: what the tracer cannot see on fake tensors.

NOTE [ A loss's input-sized storage ]
    ``F.mse_loss``, ``F.smooth_l1_loss``, ``F.binary_cross_entropy``
    and ``F.soft_margin_loss`` with a ``mean`` or ``sum`` reduction return a
    0-dim tensor whose storage has the size of the elementwise loss: their
    ATen kernels allocate the output for the elementwise result (the
    structured meta function of ``mse_loss`` and ``smooth_l1_loss`` builds
    a binary-op output; ``binary_cross_entropy`` starts from
    ``empty_like(input)``; ``soft_margin_loss`` writes ``neg(input)`` into
    it) and then ``resize_({})`` it in place, which never shrinks a
    storage. Measured on this CPU build: ``F.mse_loss(x, y)`` of two
    ``[2, 2, 64, 64]`` fp32 tensors holds 65,536 B, not 4; ``huber_loss``,
    ``l1_loss``, ``cross_entropy``, ``kl_div`` and
    ``binary_cross_entropy_with_logits`` hold their 4 B. The CUDA kernels are
    the same (one structured meta function for every device; CUDA's
    ``binary_cross_entropy`` starts from ``empty_like`` too;
    ``soft_margin_loss`` is composite). Fake and ``meta`` tensors run
    Python decompositions that return a fresh 4-byte storage, so the tracer
    counts that storage by this rule (:func:`resized_bytes`) for every
    target: ``OpWatch`` holds it live from the op on (a node's forward
    workspace is measured above it), and ``OpRecord.storage_extra_bytes``
    carries what it adds to the tensors' own bytes.

    The caller holds the loss until ``backward()`` returns, so that storage
    lives from the loss's forward to the end of the step, while the gradient
    ``loss.backward()`` seeds (``simulate`` sizes it from the last node's
    ``out_bytes``) is the 4 B of the tensor. So when the graph's last node
    has such a storage (:func:`split_loss_storage`), it keeps the tensor's
    bytes and a node ``<loss>.storage`` is put just before it, carrying the
    rest: zero cost, no inputs, no members (no fx node), no gradient
    (``requires_grad=False``: the backward skips it), read by nobody (a sink
    the caller holds to the end of the step, NOTE [ Execution model ] in
    ``solvers.model.simulate``). Both nodes are ``recomputable=False``: no plan
    puts them in a region (a recompute of the loss would make a second such
    storage that the loss node's bytes do not show), and a span that holds
    the loss holds the storage node too. An earlier node with such a storage
    (``mse(a, b) + mse(c, d)``) counts it in its ``out_bytes``: exact in the
    forward and its recompute, over by the extra bytes for its gradient in
    the backward.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from graphs import Node, Span

__all__ = ["resized_bytes", "split_loss_storage", "STORAGE_SUFFIX"]

#: Name of the storage node: the loss node's name and this suffix.
STORAGE_SUFFIX = ".storage"

_MEAN = 1  # at::Reduction::Mean, the default; None is 0


def _reduction(args: tuple, kwargs: dict, pos: int) -> int:
    value = args[pos] if len(args) > pos else kwargs.get("reduction", _MEAN)
    return int(value)


def resized_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes of the storage the target's kernel leaves behind ``out`` for this loss call, or 0 for any
    other call (NOTE [ A loss's input-sized storage ])."""
    if not isinstance(out, torch.Tensor) or out.dim() != 0 or len(args) < 2:
        return 0
    a, b = args[0], args[1]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return 0
    aten = torch.ops.aten
    if func is aten.mse_loss.default or func is aten.smooth_l1_loss.default:
        shape = torch.broadcast_shapes(a.shape, b.shape) if _reduction(args, kwargs, 2) else None
    elif func is aten.binary_cross_entropy.default:
        shape = a.shape if _reduction(args, kwargs, 3) else None
    elif func is aten.soft_margin_loss.default:
        shape = a.shape if _reduction(args, kwargs, 2) else None
    else:
        return 0
    return 0 if shape is None else shape.numel() * out.element_size()


def split_loss_storage(nodes: list[Node], spans: Sequence[Span], extra: int) -> tuple[list[Node], list[Span]]:
    """``nodes`` and ``spans`` with ``extra`` bytes of the last node's ``out_bytes`` (its loss's storage
    beyond the tensor) moved to a storage node just before it (NOTE [ A loss's input-sized storage ])."""
    if extra <= 0 or not nodes:
        return nodes, list(spans)
    loss = nodes[-1]
    last = len(nodes) - 1
    storage = Node(name=loss.name + STORAGE_SUFFIX, out_bytes=extra, op="storage", module=loss.module,
                   requires_grad=False, recomputable=False)
    loss = dataclasses.replace(loss, out_bytes=loss.out_bytes - extra, recomputable=False)
    moved = [dataclasses.replace(sp, last=sp.last + 1) if sp.last >= last else sp for sp in spans]
    return nodes[:-1] + [storage, loss], moved
