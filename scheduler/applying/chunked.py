"""A chunked head applied onto the user's model: the head call and the loss over row chunks.

NOTE [ Chunked head (applying) ]
    ``Plan.chunks`` (NOTE [ Chunked head ] in ``solvers.model.chunks``) is lowered
    onto a transformers causal-LM or masked-LM model by replacing its
    ``forward`` on the instance with a :class:`ChunkedHead`: the LM's
    nearest the head, the model itself or the LM a module wraps (peft's
    ``PeftModel``; a module whose forward calls the LM with ``labels`` and
    returns its loss, where one installed on the wrapper saw no labels and
    ran the head whole: a small Llama's plan with its head in 8 chunks,
    predicted at 10.8 MiB, measured 19.5).
    A training call without labels (the loss computed outside the LM's
    forward) runs the head whole, over the plan's peak, and warns once
    (``ChunkedHeadWarning``). When a call
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
    (``None``: they are never whole, as with any fused linear cross-entropy);
    asked for the tuple form (``return_dict=False``, in the call or the
    config), it is transformers' ``(loss, logits, ...)`` with ``None`` in the
    logits' place, so every other field keeps its position. Without labels,
    without grad, or in eval mode (``model.eval()``, gradients on or off)
    the model runs as written and returns its logits: only a training call
    is planned. The installed forward shows the model's own signature
    (``__signature__``): ``transformers.Trainer`` keeps only the batch
    columns the forward names, and a ``(*args, **kwargs)`` one lost them all
    (``KeyError: 'input_ids'``). A batch with fewer token rows than k runs
    one chunk per row (NOTE [ Chunk counts and rows ] in ``solvers.model.chunks``).
    Where the plan's graph ran the head fused (NOTE [ Fused head ] in
    ``solvers.model.fused``) the chunks run fused, in 1 chunk or more.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from graphs import CkptError
from solvers import Plan
from solvers.model.chunks import LOSS_SUFFIX, parse_chunk_module
from solvers.model.fused import fused_heads, fused_layer

from ..tracing.chunk_loop import IGNORE_INDEX, chunked_head_loss, fused_head_loss, output_layer, over_chunks
from ..tracing.spans import lm_heads
from .regions import run_region

__all__ = ["ChunkedHead", "ChunkedCall", "ChunkedHeadError", "ChunkedHeadWarning", "split_chunks", "install", "IGNORE_INDEX"]

class ChunkedHeadError(CkptError, RuntimeError):
    """A chunked head could not be installed or run on this model (the message says why)."""


class ChunkedHeadWarning(UserWarning):
    """A planned chunked head ran whole in a training call (no labels): the step is over the plan's peak."""


def split_chunks(plan: Plan) -> tuple[Plan, list[tuple[str, int, frozenset[int], bool, bool | None]]]:
    """``plan`` without its chunk regions, and per chunked call ``(path, k, checkpointed chunks, is the tail,
    fused)`` (the checkpointed chunks: the indices of those the plan runs as regions; fused: whether the plan's
    model runs the tail fused, NOTE [ Fused head ] in ``solvers.model.fused``, None for a plan from before it)."""
    if len(plan.chunk_modules) != len(plan.chunks):
        raise ChunkedHeadError("this plan runs calls in chunks but names none of their modules (chunk_modules); "
                               "solve it again with scheduler.solve(..., chunks=...)")
    counts = {path: k for path, (_, _, k) in zip(plan.chunk_modules, plan.chunks)}
    flags: dict[str, set[int]] = {path: set() for path in counts}
    keep = []
    for r, path in enumerate(plan.modules or [""] * len(plan.regions)):
        parsed = parse_chunk_module(path)
        if parsed is None or parsed[0] not in flags:
            keep.append(r)
            continue
        if parsed[2] != counts[parsed[0]] or parsed[1] >= parsed[2]:
            raise ChunkedHeadError(f"region {path!r} names chunk {parsed[1]} of {parsed[2]}, but the plan runs "
                                   f"{parsed[0]!r} in {counts[parsed[0]]} chunks (an edited plan? solve again)")
        flags[parsed[0]].add(parsed[1])
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
    fused = fused_heads(plan.graph_meta or {})
    entries = [(path.removesuffix(LOSS_SUFFIX), k, frozenset(flags[path]), path.endswith(LOSS_SUFFIX),
                None if fused is None else fused_layer(fused, path.removesuffix(LOSS_SUFFIX)) is not None)
               for path, (_, _, k) in zip(plan.chunk_modules, plan.chunks)]
    return rest, entries


def _loss_owner(model: nn.Module, head: str) -> tuple[str, str]:
    """``(path, kind)``: the transformers causal-LM or masked-LM model nearest above ``head`` (``model`` itself, or
    a module the head lies in when the model wraps one: peft's ``PeftModel``, a module whose forward calls the LM
    with ``labels`` and returns its loss), whose forward takes the labels and computes the loss; ``kind`` says how
    the labels line up with the logits (NOTE [ Chunked head (applying) ])."""
    known = lm_heads(model)
    parts = head.split(".")
    for depth in reversed(range(len(parts))):
        path = ".".join(parts[:depth])
        if path in known:
            return path, known[path]
    raise ChunkedHeadError(f"a chunked head runs on transformers causal-LM and masked-LM models (their loss is known); "
                           f"{type(model).__name__} is neither. Solve without chunks")


def install(model: nn.Module, entries: Sequence[tuple]) -> None:
    """Install each chunked call of :func:`split_chunks` on ``model`` in place (NOTE [ Chunked head (applying) ]):
    a :class:`ChunkedCall` as the call's ``forward``, a :class:`ChunkedHead` as the forward of the LM that computes
    the tail's loss (:func:`_loss_owner`)."""
    for path, k, checkpointed, tail, *rest in entries:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise ChunkedHeadError(f"this plan runs {path!r} in chunks, which {type(model).__name__} does not have; "
                                   "trace and solve this model") from None
        if tail:
            at, kind = _loss_owner(model, path)
            owner = model.get_submodule(at) if at else model
            owner.forward = ChunkedHead(owner, path[len(at) + 1:] if at else path, k, checkpointed, kind=kind,
                                        previous=owner.__dict__.get("forward"), fused=rest[0] if rest else None,
                                        where=path)
        else:
            module.forward = ChunkedCall(module, path, k, checkpointed, previous=module.__dict__.get("forward"))


class _Chunks:
    """What both chunked forwards share: the wrapped forward, the chunks' regions, the recompute count."""

    def __init__(self, module: nn.Module, path: str, k: int, checkpointed: Iterable[int], previous: Any) -> None:
        self.module, self.path, self.k = module, path, int(k)
        self.checkpointed, self.previous = frozenset(checkpointed), previous
        self.recomputes = 0
        self.forward_fn = type(module).forward  # read here (NOTE [ Regions under torch.compile ])

    def _own_forward(self, *args: Any, **kwargs: Any) -> Any:
        """The class's forward, called as a function (no bound method built per call: NOTE [ Regions under
        torch.compile ] in ``scheduler.applying.regions``)."""
        return self.forward_fn(self.module, *args, **kwargs)

    def original(self) -> Any:
        if self.previous is not None:
            return self.previous
        return self._own_forward

    @property
    def __signature__(self) -> inspect.Signature:
        """The wrapped forward's own parameters, for callers that read them (``transformers.Trainer`` drops
        every batch column the forward does not name; NOTE [ Chunked head (applying) ])."""
        if self.previous is not None:
            return inspect.signature(self.previous)
        return inspect.signature(type(self.module).forward.__get__(self.module))

    def saw_random(self, path: str, why: str) -> None:
        raise ChunkedHeadError(f"the chunked call {path!r} draws random numbers ({why}); chunks would draw otherwise "
                               "than the whole. Solve without chunks")

    def chunked(self, fn: Any, rows: torch.Tensor, *others: torch.Tensor, region: nn.Module) -> list[Any]:
        """``fn(rows chunk, *others chunks)`` for each of the k row chunks, as the plan checkpoints them (the loop:
        ``scheduler.tracing.chunk_loop``, which the trace times)."""
        return over_chunks(fn, rows, *others, k=self.k, run=self._runner(region))

    def _runner(self, region: nn.Module) -> Any:
        def run(c: int, fn: Any, args: Sequence[torch.Tensor]) -> Any:
            if c in self.checkpointed:
                return run_region(fn, tuple(args), {}, modules=(region,), path=f"{self.path}@chunk{c}",
                                  stochastic=False, counter=self)
            return fn(*args)
        return run


class ChunkedCall(_Chunks):
    """Installed as a row-wise call's ``forward`` (an MLP's): it runs over ``k`` chunks of the token rows,
    the outputs concatenated (NOTE [ Chunked head ] in ``solvers.model.chunks``). Without grad it runs as written."""

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
        checkpointed: the chunks (by index) run as checkpoint regions; kind:
        ``causal`` or ``masked`` (how labels line up with logits); previous:
        the instance-level ``forward`` there before (None: the class's);
        recomputes: chunk recomputes run (tests read it).
    """

    def __init__(self, model: nn.Module, head: str, k: int, checkpointed: Iterable[int], *, kind: str,
                 previous: Any = None, fused: bool | None = None, where: str | None = None) -> None:
        super().__init__(model, head, k, checkpointed, previous)
        self.kind, self.fused, self.where, self.unplanned_calls = kind, fused, where or head, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        labels = kwargs.get("labels")
        if labels is None or not torch.is_grad_enabled() or not self.module.training:
            if labels is None and torch.is_grad_enabled() and self.module.training:
                self._whole_in_training()
            return self.original()(*args, **kwargs)  # NOTE [ Chunked head (applying) ]: eval returns the logits
        head = self.module.get_submodule(self.path)
        seen: list[torch.Tensor] = []

        def hand_on(x: torch.Tensor, *_a: Any, **_k: Any) -> torch.Tensor:
            seen.append(x)
            return x

        as_tuple = kwargs.get("return_dict")
        if as_tuple is None:
            as_tuple = getattr(getattr(self.module, "config", None), "return_dict", True)
        as_tuple = not as_tuple
        before = head.__dict__.get("forward")
        head.forward = hand_on
        try:
            out = self.original()(*args, **{**kwargs, "labels": None, "return_dict": True})
        finally:
            if before is None:
                del head.__dict__["forward"]
            else:
                head.__dict__["forward"] = before
        name = type(self.module).__name__
        if not hasattr(out, "logits") or not hasattr(out, "items"):
            raise ChunkedHeadError(f"{name} returned a {type(out).__name__} with no logits field although asked for "
                                   "return_dict=True, so its head's output cannot be found. Solve without chunks")
        if len(seen) != 1 or out.logits is not seen[0]:
            raise ChunkedHeadError(f"{name} changes the logits after its head {self.path!r} (or calls it "
                                   f"{len(seen)} times), so its loss cannot be computed in chunks of the head's "
                                   "output. Solve without chunks")
        loss = self.loss(head, seen[0], labels, kwargs.get("num_items_in_batch"))
        fields = {key: value for key, value in out.items() if key not in ("logits", "loss")}
        result = type(out)(loss=loss, **fields)
        if as_tuple:  # transformers' tuple form: (loss, logits, ...); no logits, so None keeps the positions
            return (loss, None, *result.to_tuple()[1:])
        return result

    def _whole_in_training(self) -> None:
        """A training call without ``labels``: the head runs whole, its logits whole, over the plan's peak (a model
        wrapped so that its loss is computed outside the LM's forward). Warned once per model."""
        self.unplanned_calls += 1
        if self.unplanned_calls == 1:
            warnings.warn(f"the plan runs the head {self.where!r} and its loss in {self.k} chunks, but "
                          f"{type(self.module).__name__} was called to train without labels, so its head runs whole "
                          "and the step's peak is over the plan's (the whole logits and their gradient). Pass labels "
                          "to the model so that it computes its loss, or solve without chunks (chunks=(1,))",
                          ChunkedHeadWarning, stacklevel=3)

    def loss(self, head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, num_items: Any) -> torch.Tensor:
        """The loss of ``head`` over ``hidden``, summed over k chunks of the token rows (fused where the plan's
        model says, NOTE [ Fused head ] in ``solvers.model.fused``; a plan from before it: where the head can)."""
        layer = output_layer(head, self.module)
        fused = self.fused if self.fused is not None else layer is not None and not self.checkpointed
        if fused:
            if layer is None:
                raise ChunkedHeadError(f"the plan runs the output layer of the head {self.path!r} fused with its "
                                       "loss, as traced, but it is no longer a plain nn.Linear without hooks inside "
                                       "the head; trace and solve the model as it is now")
            try:
                return fused_head_loss(head, hidden, labels, self.kind, self.k, num_items, layer=layer)
            except ValueError as exc:
                raise ChunkedHeadError(f"{type(self.module).__name__}: {exc}, so its loss cannot be fused with it. "
                                       "Solve without chunks") from None
        return chunked_head_loss(head, hidden, labels, self.kind, self.k, num_items, run=self._runner(head))

    def __repr__(self) -> str:
        return f"ChunkedHead({self.path!r}, k={self.k})"
