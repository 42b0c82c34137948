"""A chunked head applied onto the user's model: the head call and the loss over row chunks.

NOTE [ Chunked head (applying) ]
    ``Plan.chunks`` (NOTE [ Chunked head ] in ``solvers.chunks``) is lowered
    onto a transformers causal-LM or masked-LM model by replacing the model's
    ``forward`` on the instance with a :class:`ChunkedHead`. When a call
    trains (grad enabled) and passes ``labels``, it runs the model's own
    forward without ``labels`` and with the head's ``forward`` handing its
    input on unchanged (so the forward computes no logits and no loss), checks
    that what the model returned as logits is that very input (a model that
    changes the logits after its head, soft-capping or scaling them, is
    refused), then runs the head and the loss over k chunks of the token rows
    (batch x sequence flattened, ``narrow`` views of the hidden states: each
    chunk's input gradient is a full-size tensor added into the first, as the
    plan's model counts). The labels are shifted as transformers shifts them
    for a causal model (padded with ``-100``, one position left); each chunk
    returns its summed token losses over the count of labels not ``-100``
    (``num_items_in_batch`` when the call passes it), and the loss is the sum
    of the chunks. Chunks the plan checkpoints run as regions
    (``scheduler.applying.regions.run_region``); the others run plainly. The
    output is the model's own output type with that loss and no logits
    (``None``: they are never whole, as with any fused linear cross-entropy).
    Without labels or without grad the model runs as written.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Sequence

import torch
from torch import nn

from graphs import CkptError
from solvers import Plan
from solvers.chunks import LOSS_SUFFIX, parse_chunk_module

from .regions import run_region

__all__ = ["ChunkedHead", "ChunkedCall", "ChunkedHeadError", "split_chunks", "install", "IGNORE_INDEX"]

#: Labels that take no part in the loss (transformers' and torch's default ``ignore_index``).
IGNORE_INDEX = -100


class ChunkedHeadError(CkptError, RuntimeError):
    """A chunked head could not be installed or run on this model (the message says why)."""


def split_chunks(plan: Plan) -> tuple[Plan, list[tuple[str, int, tuple[bool, ...], bool]]]:
    """``plan`` without its chunk regions, and per chunked call ``(path, k, checkpointed chunks, is the tail)``."""
    if len(plan.chunk_modules) != len(plan.chunks):
        raise ChunkedHeadError("this plan runs calls in chunks but names none of their modules (chunk_modules); "
                               "solve it again with scheduler.solve(..., chunks=...)")
    flags = {path: [False] * k for path, (_, _, k) in zip(plan.chunk_modules, plan.chunks)}
    keep = []
    for r, path in enumerate(plan.modules or [""] * len(plan.regions)):
        parsed = parse_chunk_module(path)
        if parsed is None or parsed[0] not in flags:
            keep.append(r)
            continue
        flags[parsed[0]][parsed[1]] = True
        if plan.save_ops and plan.save_ops[r]:
            raise ChunkedHeadError(f"the plan keeps op outputs inside chunk {parsed[1]} of {parsed[0]!r}; a chunk "
                                   "recomputes whole (solve again)")

    def pick(values: Sequence[Any]) -> tuple:
        return tuple(values[r] for r in keep) if values else ()

    regions = pick(plan.regions)
    saved = tuple(i for i in plan.saved if any(a <= i <= b for a, b in regions))
    rest = dataclasses.replace(plan, regions=regions, modules=pick(plan.modules), stochastic=pick(plan.stochastic),
                               save_ops=pick(plan.save_ops), save_op_calls=pick(plan.save_op_calls), saved=saved,
                               node_names=pick(plan.node_names), chunks=(), chunk_modules=())
    entries = [(path.removesuffix(LOSS_SUFFIX), k, tuple(flags[path]), path.endswith(LOSS_SUFFIX))
               for path, (_, _, k) in zip(plan.chunk_modules, plan.chunks)]
    return rest, entries


def _loss_kind(model: nn.Module) -> str:
    from transformers.models.auto import modeling_auto as auto

    names = {c.__name__ for c in type(model).__mro__}
    if names & set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return "causal"
    if names & set(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES.values()):
        return "masked"
    raise ChunkedHeadError(f"a chunked head runs on transformers causal-LM and masked-LM models (their loss is known); "
                           f"{type(model).__name__} is neither. Solve without chunks")


def install(model: nn.Module, entries: Sequence[tuple[str, int, tuple[bool, ...], bool]]) -> None:
    """Install each chunked call of :func:`split_chunks` on ``model`` in place (NOTE [ Chunked head (applying) ]):
    a :class:`ChunkedCall` as the call's ``forward``, a :class:`ChunkedHead` as the model's for the tail."""
    for path, k, checkpointed, tail in entries:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise ChunkedHeadError(f"this plan runs {path!r} in chunks, which {type(model).__name__} does not have; "
                                   "trace and solve this model") from None
        if tail:
            model.forward = ChunkedHead(model, path, k, checkpointed, kind=_loss_kind(model),
                                        previous=model.__dict__.get("forward"))
        else:
            module.forward = ChunkedCall(module, path, k, checkpointed, previous=module.__dict__.get("forward"))


class _Chunks:
    """What both chunked forwards share: the wrapped forward, the chunks' regions, the recompute count."""

    def __init__(self, module: nn.Module, path: str, k: int, checkpointed: Sequence[bool], previous: Any) -> None:
        self.module, self.path, self.k = module, path, int(k)
        self.checkpointed, self.previous = tuple(checkpointed), previous
        self.recomputes = 0

    def original(self) -> Any:
        if self.previous is not None:
            return self.previous
        return types.MethodType(type(self.module).forward, self.module)

    def saw_random(self, path: str, why: str) -> None:
        raise ChunkedHeadError(f"the chunked call {path!r} draws random numbers ({why}); chunks would draw otherwise "
                               "than the whole. Solve without chunks")

    def chunked(self, fn: Any, rows: torch.Tensor, *others: torch.Tensor, region: nn.Module) -> list[Any]:
        """``fn(rows chunk, *others chunks)`` for each of the k row chunks, as the plan checkpoints them."""
        size = -(-rows.shape[0] // self.k)
        out = []
        for c in range(self.k):
            start = min(c * size, rows.shape[0])
            length = min(size, rows.shape[0] - start)
            args = tuple(t.narrow(0, start, length) for t in (rows, *others))
            if self.checkpointed[c]:
                out.append(run_region(fn, args, {}, modules=(region,), path=f"{self.path}@chunk{c}",
                                      stochastic=False, counter=self))
            else:
                out.append(fn(*args))
        return out


class ChunkedCall(_Chunks):
    """Installed as a row-wise call's ``forward`` (an MLP's): it runs over ``k`` chunks of the token rows,
    the outputs concatenated (NOTE [ Chunked head ] in ``solvers.chunks``). Without grad it runs as written."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fwd = self.original()
        if not torch.is_grad_enabled():
            return fwd(*args, **kwargs)
        if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
            raise ChunkedHeadError(f"the chunked call {self.path!r} takes one tensor (its traced input); it got "
                                   f"{len(args)} positional and {len(kwargs)} keyword arguments. Solve without chunks")
        x = args[0]
        ys = self.chunked(fwd, x.reshape(-1, x.shape[-1]), region=self.module)
        if not all(isinstance(y, torch.Tensor) for y in ys):  # the graph saw one tensor of a tuple, say
            raise ChunkedHeadError(f"the chunked call {self.path!r} returns {type(ys[0]).__name__}, not one tensor, so "
                                   "its chunks cannot be joined. Solve without chunks for it (mlp_chunks=(1,))")
        return torch.cat(ys, 0).view(*x.shape[:-1], ys[0].shape[-1])

    def __repr__(self) -> str:
        return f"ChunkedCall({self.path!r}, k={self.k})"


class ChunkedHead(_Chunks):
    """Installed as ``model.forward``: the head and the loss run in ``k`` chunks.

    Attributes:
        module: the model; path: the head's module path; k: the chunk count;
        checkpointed: per chunk, whether it is a checkpoint region; kind:
        ``causal`` or ``masked`` (how labels line up with logits); previous:
        the instance-level ``forward`` there before (None: the class's);
        recomputes: chunk recomputes run (tests read it).
    """

    def __init__(self, model: nn.Module, head: str, k: int, checkpointed: Sequence[bool], *, kind: str,
                 previous: Any = None) -> None:
        super().__init__(model, head, k, checkpointed, previous)
        self.kind = kind

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        labels = kwargs.get("labels")
        if labels is None or not torch.is_grad_enabled():
            return self.original()(*args, **kwargs)
        head = self.module.get_submodule(self.path)
        seen: list[torch.Tensor] = []

        def hand_on(x: torch.Tensor, *_a: Any, **_k: Any) -> torch.Tensor:
            seen.append(x)
            return x

        before = head.__dict__.get("forward")
        head.forward = hand_on
        try:
            out = self.original()(*args, **{**kwargs, "labels": None})
        finally:
            if before is None:
                del head.__dict__["forward"]
            else:
                head.__dict__["forward"] = before
        if len(seen) != 1 or getattr(out, "logits", None) is not seen[0]:
            raise ChunkedHeadError(f"{type(self.module).__name__} changes the logits after its head {self.path!r} (or "
                                   "calls it more than once), so its loss cannot be computed in chunks of the head's "
                                   "output. Solve without chunks")
        loss = self.loss(head, seen[0], labels, kwargs.get("num_items_in_batch"))
        fields = {key: value for key, value in out.items() if key not in ("logits", "loss")}
        return type(out)(loss=loss, **fields)

    def loss(self, head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, num_items: Any) -> torch.Tensor:
        """The loss of ``head`` over ``hidden``, summed over k chunks of the token rows."""
        if self.kind == "causal":
            labels = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
        labels = labels.reshape(-1).to(hidden.device)
        rows = hidden.reshape(-1, hidden.shape[-1])
        count = num_items if num_items is not None else (labels != IGNORE_INDEX).sum()
        if isinstance(count, torch.Tensor):
            count = count.to(hidden.device)

        def chunk_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = head(x)
            if self.kind == "causal":
                logits = logits.float()  # as transformers' causal-LM loss upcasts
            return nn.functional.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum") / count

        losses = self.chunked(chunk_loss, rows, labels, region=head)
        return sum(losses[1:], losses[0])

    def __repr__(self) -> str:
        return f"ChunkedHead({self.path!r}, k={self.k})"
