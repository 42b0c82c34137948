"""One training step, run the same way wherever a step runs: gradients cleared, the base tensors, forward, loss
and backward in the user's loop, seeded.

The meters (``scheduler.measuring.storages``, ``scheduler.measuring.profiler``) and what measures with them
(``scheduler.measuring.steps``, ``verify``, ``ckpt compare``) all run this step.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from graphs import LOOPS

__all__ = ["LossFn", "clear_grads", "step_tensors", "training_step", "seeded_step"]

LossFn = Callable[[Any], torch.Tensor]


def clear_grads(params: nn.Module | Iterable[torch.Tensor]) -> None:
    """Set the gradients of a module's parameters (or of ``params``) to None, as ``zero_grad(set_to_none=True)``."""
    for p in params.parameters() if isinstance(params, nn.Module) else params:
        p.grad = None


def step_tensors(model: nn.Module, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
                 ) -> list[torch.Tensor]:
    """What is alive before and throughout a step: parameters, buffers and the input tensors (the base)."""
    leaves = torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs or {})))
    return list(model.parameters()) + list(model.buffers()) + [t for t in leaves if isinstance(t, torch.Tensor)]


def training_step(run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                  loss: LossFn | None = None, *, loop: str = "held") -> torch.Tensor:
    """Forward, loss, backward; returns the loss, detached.

    The loss is dropped only after the backward, as in a training loop; the
    rest of the output (e.g. logits) after the backward too with ``loop="held"``
    (``out = model(**batch); out.loss.backward()``), or as soon as the loss is
    taken from it with ``loop="dropped"`` (``Trainer``): NOTE [ The user's loop ]
    in ``graphs.graph``.

    Raises:
        TypeError: the step does not produce a scalar loss (pass ``loss=``).
        ValueError: ``loop`` is neither ``"held"`` nor ``"dropped"``.
    """
    if loop not in LOOPS:
        raise ValueError(f"loop={loop!r} is not one of {', '.join(map(repr, LOOPS))}")
    out = run(*args, **kwargs)
    value = loss(out) if loss is not None else out
    if loop == "dropped":
        del out
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise TypeError("the step must produce a scalar loss tensor; pass loss= to reduce the model's output")
    value.backward()
    return value.detach()


def seeded_step(run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], loss: LossFn | None = None,
                *, seed: int | None = 0, loop: str = "held") -> Callable[[], torch.Tensor]:
    """``step()`` running :func:`training_step` from ``torch.manual_seed(seed)`` (dropout masks equal on every run)."""
    args, kwargs = tuple(args), dict(kwargs)

    def step() -> torch.Tensor:
        if seed is not None:
            torch.manual_seed(seed)
        return training_step(run, args, kwargs, loss, loop=loop)

    return step
