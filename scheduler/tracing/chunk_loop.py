"""The loop a chunked call runs: shared by the applier (``scheduler.applying.chunked``) and the trace that times
it at its shape (NOTE [ Chunk loops timed at their shapes ] in ``scheduler.tracing.chunk_times``), so that what is
timed is what runs. NOTE [ Chunked head (applying) ] says what it computes."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

__all__ = ["IGNORE_INDEX", "over_chunks", "chunked_head_loss"]

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
