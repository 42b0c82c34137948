"""The loop a chunked call runs: shared by the applier (``scheduler.applying.chunked``) and the trace that times
it at its shape (NOTE [ Chunk loops timed at their shapes ] in ``scheduler.tracing.chunk_times``), so that what is
timed is what runs. NOTE [ Chunked head (applying) ] says what it computes."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

__all__ = ["IGNORE_INDEX", "over_chunks", "chunked_head_loss", "fusable", "output_layer", "fused_head_loss"]

#: Labels that take no part in the loss (transformers' and torch's default ``ignore_index``).
IGNORE_INDEX = -100

#: ``run(c, fn, args)``: how chunk ``c`` is run (the applier runs a checkpointed one as a region).
ChunkRunner = Callable[[int, Callable[..., Any], Sequence[torch.Tensor]], Any]


def _plain(c: int, fn: Callable[..., Any], args: Sequence[torch.Tensor]) -> Any:
    return fn(*args)


def over_chunks(fn: Callable[..., Any], rows: torch.Tensor, *others: torch.Tensor, k: int,
                run: ChunkRunner = _plain) -> list[Any]:
    """``fn(rows chunk, *others chunks)`` for each of ``k`` chunks of the leading dimension (``narrow`` views;
    ``ceil(rows / k)`` rows each, the last shorter; fewer rows than k: one chunk per row, none empty)."""
    size = max(-(-rows.shape[0] // k), 1)
    out = []
    for c in range(max(1, min(k, -(-rows.shape[0] // size)))):
        start = c * size
        length = min(size, rows.shape[0] - start)
        out.append(run(c, fn, tuple(t.narrow(0, start, length) for t in (rows, *others))))
    return out


def chunked_head_loss(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, kind: str, k: int,
                      num_items: Any = None, run: ChunkRunner = _plain) -> torch.Tensor:
    """The loss of ``head`` over ``hidden``, summed over ``k`` chunks of the token rows: each chunk's summed token
    losses over the count of labels not ``IGNORE_INDEX`` (``num_items`` when given); a ``causal`` model's labels
    shifted as transformers shifts them, its logits upcast as its loss does."""
    if kind == "causal":
        labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    labels = labels.reshape(-1).to(hidden.device)
    rows = hidden.reshape(-1, hidden.shape[-1])
    count = num_items if num_items is not None else (labels != IGNORE_INDEX).sum()
    if isinstance(count, torch.Tensor):
        count = count.to(hidden.device)

    def chunk_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = head(x)
        if kind == "causal":
            logits = logits.float()  # as transformers' causal-LM loss upcasts
        return nn.functional.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum") / count

    losses = over_chunks(chunk_loss, rows, labels, k=k, run=run)
    return sum(losses[1:], losses[0])


def fusable(head: nn.Module) -> bool:
    """Whether ``head`` runs fused with its loss (NOTE [ Fused head ] in ``solvers.model.fused``): a plain
    ``nn.Linear`` (not a subclass: an adapter's or FSDP's layer is one) with no hooks of its own or global, and no
    parametrization, whose forward is therefore ``F.linear`` of its weight and bias."""
    from torch.nn.modules import module as _module

    if type(head) is not nn.Linear or "forward" in head.__dict__:
        return False
    hooks = (head._forward_hooks, head._forward_pre_hooks, head._backward_hooks, head._backward_pre_hooks,
             _module._global_forward_hooks, _module._global_forward_pre_hooks, _module._global_backward_hooks,
             _module._global_backward_pre_hooks)
    return not any(hooks) and not getattr(head, "parametrizations", None)


def output_layer(head: nn.Module, model: nn.Module | None = None) -> str | None:
    """The path below ``head`` ("" for the head itself) of the layer that runs fused with the loss: ``model``'s
    output embeddings (transformers' ``get_output_embeddings``; without ``model``, ``head`` itself) when it is
    ``head`` or inside it and :func:`fusable`; None otherwise (BERT's head ``cls``: its decoder, after a dense
    layer, GELU and layer norm that run as written)."""
    getter = getattr(model, "get_output_embeddings", None) if model is not None else None
    layer = getter() if callable(getter) else head
    if not isinstance(layer, nn.Module) or not fusable(layer):
        return None
    return next((path for path, m in head.named_modules() if m is layer), None)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """The loss of ``linear(x, weight, bias)`` over ``labels`` and its gradients, computed in the forward over
    row chunks (NOTE [ Fused head ] in ``solvers.model.fused``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                count: Any, k: int, upcast: bool) -> torch.Tensor:
        counted = isinstance(count, torch.Tensor)  # saved, so that it goes with the graph's saved tensors
        ctx.save_for_backward(x, weight, bias, labels, *((count,) if counted else ()))
        ctx.count, ctx.upcast = None if counted else count, upcast
        gx = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        gw = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        gb = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        size = max(-(-x.shape[0] // k), 1)
        ctx.loss_dtype = torch.float32
        for start in range(0, x.shape[0], size):
            xc, y = x[start:start + size], labels[start:start + size]
            logits = nn.functional.linear(xc, weight, bias)
            dtype = logits.dtype
            valid = y != IGNORE_INDEX
            yc = torch.where(valid, y, 0)[:, None]
            if start == 0:  # the dtype the plain loss computes in: fp32 for a causal LM (transformers upcasts);
                # else cross_entropy's own (under CPU autocast fp32 from bf16 logits; a bf16 model's bf16)
                ctx.loss_dtype = torch.float32 if upcast else \
                    nn.functional.cross_entropy(logits[:1], yc[:1, 0], reduction="sum").dtype
            lsm = torch.log_softmax(logits.to(ctx.loss_dtype), -1)
            del logits
            total -= torch.where(valid, lsm.gather(1, yc).squeeze(1), 0).sum()
            g = lsm.exp_().scatter_add_(1, yc, torch.full_like(yc, -1, dtype=lsm.dtype)).to(dtype)
            del lsm
            scale = (valid.to(dtype) / count)[:, None]  # ignored rows take no part; the mean over the count
            if gx is not None:
                gx[start:start + size] = (g @ weight.to(dtype)) * scale
            if gw is not None:
                xs = xc.to(dtype) * scale
                if gw.dtype == dtype:
                    gw.addmm_(g.t(), xs)
                else:  # autocast: the product in its dtype, added into the parameter's as autograd does
                    gw.add_(g.t() @ xs)
            if gb is not None:
                gb.add_((g.t() @ scale).squeeze(1))
            del g  # before the next chunk's logits: one chunk's transients at a time
        ctx.grads = (gx, gw, gb)
        return (total / count).to(ctx.loss_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        grads, ctx.grads = ctx.grads, None
        graph = torch.is_grad_enabled()  # create_graph: a gradient penalty differentiates these gradients
        if grads is None or graph:  # or a second backward (retain_graph): the gradients again, as expressions
            x, weight, bias, labels, *count = ctx.saved_tensors
            with torch.set_grad_enabled(graph):
                got = _gradients(x, weight, bias, labels, count[0] if count else ctx.count, ctx.loss_dtype, grad)
            return (*(g if need else None for g, need in zip(got, ctx.needs_input_grad)), None, None, None, None)
        # loss.backward() hands 1: nothing to scale (compiled, no check: .item() would break Dynamo's graph)
        if torch.compiler.is_compiling() or grad.device.type != "cpu" or grad.item() != 1.0:
            for t in grads:
                if t is not None:
                    t.mul_(grad)
        return (*grads, None, None, None, None)


def _gradients(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, count: Any,
               loss_dtype: torch.dtype, grad: torch.Tensor) -> tuple:
    """The loss's gradients for ``x``, ``weight`` and ``bias`` written out in torch ops, so that under grad mode they
    are functions of them (a gradient penalty differentiates them; ``autograd.grad`` of a recomputed loss would also
    follow ``x``'s history back to a weight the head shares with the embedding, and free what it saved)."""
    logits = nn.functional.linear(x, weight, bias)
    dtype = logits.dtype
    probs = torch.softmax(logits.to(loss_dtype), -1)
    valid = labels != IGNORE_INDEX
    target = nn.functional.one_hot(torch.where(valid, labels, 0), probs.shape[-1]).to(probs.dtype)
    g = ((probs - target) * (valid.to(probs.dtype) / count)[:, None] * grad).to(dtype)
    return g @ weight.to(dtype), (g.t() @ x.to(dtype)).to(weight.dtype), \
        None if bias is None else g.sum(0).to(bias.dtype)


def fused_head_loss(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, kind: str, k: int,
                    num_items: Any = None, layer: str = "") -> torch.Tensor:
    """:func:`chunked_head_loss` with the head's output layer (``layer`` below ``head``, :func:`output_layer`)
    fused with the loss (NOTE [ Fused head ] in ``solvers.model.fused``): the same loss, its gradients computed
    chunk by chunk in the forward, so no chunk's logits outlive it. What the head runs before that layer runs
    as written, whole; the head must return that layer's output unchanged (else ``ValueError``)."""
    if layer:
        out_layer = head.get_submodule(layer)
        seen: list[torch.Tensor] = []

        def hand_on(x: torch.Tensor, *_a: Any, **_k: Any) -> torch.Tensor:
            seen.append(x)
            return x

        out_layer.forward = hand_on
        try:
            out = head(hidden)
        finally:
            del out_layer.__dict__["forward"]
        if len(seen) != 1 or out is not seen[0]:
            raise ValueError(f"the head changes the output of its layer {layer!r} (or calls it {len(seen)} times)")
        return fused_head_loss(out_layer, seen[0], labels, kind, k, num_items)
    if kind == "causal":
        labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    labels = labels.reshape(-1).to(hidden.device)
    count = num_items if num_items is not None else (labels != IGNORE_INDEX).sum()
    if isinstance(count, torch.Tensor):
        count = count.to(hidden.device)
    rows = hidden.reshape(-1, hidden.shape[-1])
    return _FusedLinearCrossEntropy.apply(rows, head.weight, head.bias, labels, count, k, kind == "causal")
