"""What people use today instead of a planner, prepared for a measured step.

Each peer turns a model into a forward callable that ``ckpt compare`` runs in
the same process, on the same input, as our plans:

* ``per-block``: ``torch.utils.checkpoint`` around every repeated block (the
  children of the model's ``ModuleList``, or its most repeated block class),
  which is what Hugging Face's ``gradient_checkpointing_enable()`` does; a
  transformers model uses that method itself.
* ``checkpoint_sequential``: ``torch.utils.checkpoint.checkpoint_sequential``
  with ``round(sqrt(n))`` segments over the model seen as a sequence of
  single-input layers (an ``nn.Sequential`` flattened, or the longest chain of
  the model's ``torch.fx`` graph with blocks kept whole).
* ``torch.compile``: backend ``aot_eager`` (AOTAutograd's min-cut
  partitioner, the same one inductor uses) with
  ``torch._functorch.config.activation_memory_budget`` set to a fraction.

A peer that cannot run on a model raises :class:`PeerUnavailable` with the
reason, which the comparison table prints instead of a row of numbers.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
import torch.fx
from torch import nn
from torch.fx.node import map_arg
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from graphs import CkptError

__all__ = ["PeerUnavailable", "Prepared", "find_blocks", "per_block", "sequential", "compiled"]

log = logging.getLogger(__name__)

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


class PeerUnavailable(CkptError):
    """A peer method cannot run on this model; the message says why."""


@dataclass(frozen=True)
class Prepared:
    """A method ready to run.

    Attributes:
        forward: called as the model would be (``forward(*args, **kwargs)``).
        note: what was done (blocks wrapped, segments), for the table.
        undo: restores the model (called once, after measuring).
        scope: a context manager every call must run inside (the compile
            config); a null context for eager peers.
        returns_loss: ``forward`` returns the loss itself (an applied plan
            traced with the loss), so the workload's loss is not applied again.
        install, remove: switch the method on the shared model on and off.
            A peer that changes the model in place (per-block wraps the
            blocks' ``forward``) must be on for its own calls only: the
            un-checkpointed reference and our plans run the same model
            object alternately with it, and would otherwise be timed
            checkpointed too. The harness calls ``install`` before each of
            the method's steps and ``remove`` after its backward (NOTE
            [ A peer is on for its own calls only ]).
    """

    forward: Callable[..., Any]
    note: str
    undo: Callable[[], None] = lambda: None
    scope: Callable[[], ContextManager[Any]] = field(default=contextlib.nullcontext)
    returns_loss: bool = False
    install: Callable[[], None] = lambda: None
    remove: Callable[[], None] = lambda: None

    def on(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` (one step of this method) run with the method installed, and removed after it."""

        def step() -> Any:
            self.install()
            try:
                return fn()
            finally:
                self.remove()

        return step


# NOTE [ A peer is on for its own calls only ]
#     Per-block checkpointing changes the model itself (an instance
#     ``forward`` on every block, or HF's ``gradient_checkpointing`` flag),
#     while the reference step and our applied plans call the same model
#     object. Left installed for the whole measurement, the reference steps
#     timed alternately with it were checkpointed as well, so per-block read
#     "x1.00 of the plain step" and every plan of ours looked slower than it.
#     ``per_block`` therefore returns with nothing installed: its ``install``
#     and ``remove`` wrap exactly one training step (forward and backward; a
#     non-reentrant checkpoint's recompute calls the block's original forward,
#     captured when the block ran, so removing the wrapper after the forward
#     would be safe too, but the step is the simpler unit).


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks, as ``(qualified name, module)``.

    The children of the largest ``ModuleList`` whose children share a class
    (transformer layers); otherwise the outermost instances of the most
    repeated non-container class that has submodules (ResNet bottlenecks).
    Empty when there is none (a flat stack of layers).
    """
    best: list[tuple[str, nn.Module]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) >= 2 and len({type(c) for c in mod}) == 1:
            kids = [(f"{name}.{i}" if name else str(i), c) for i, c in enumerate(mod)]
            if len(kids) > len(best):
                best = kids
    if best:
        return best
    counts: Counter[type] = Counter()
    for name, mod in model.named_modules():
        if name and not isinstance(mod, _CONTAINERS) and any(True for _ in mod.children()):
            counts[type(mod)] += 1
    for cls, n in counts.most_common():
        if n < 2:
            break
        chosen: list[tuple[str, nn.Module]] = []
        for name, mod in model.named_modules():
            if type(mod) is cls and not any(name.startswith(c + ".") for c, _ in chosen):
                chosen.append((name, mod))
        if len(chosen) >= 2:
            return chosen
    return []


def _checkpointed_forward(orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return checkpoint(orig, *args, use_reentrant=False, **kwargs)


def per_block(model: nn.Module) -> Prepared:
    """Checkpoint every repeated block, as HF's ``gradient_checkpointing_enable()``.

    Raises:
        PeerUnavailable: the model has no repeated blocks.

    Nothing is installed on return: ``install``/``remove`` switch it on for
    one step (NOTE [ A peer is on for its own calls only ]).
    """
    if getattr(model, "supports_gradient_checkpointing", False) and hasattr(model, "gradient_checkpointing_enable"):
        n = len(find_blocks(model))

        def hf_on() -> None:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

        def hf_off() -> None:
            model.gradient_checkpointing_disable()

        return Prepared(forward=model, note=f"HF gradient_checkpointing_enable(), {n} blocks",
                        undo=hf_off, install=hf_on, remove=hf_off)
    blocks = find_blocks(model)
    if not blocks:
        raise PeerUnavailable("no repeated blocks (no ModuleList of layers, no block class used twice)")

    def on() -> None:
        for _, blk in blocks:
            if "forward" not in blk.__dict__:
                blk.forward = functools.partial(_checkpointed_forward, blk.forward)  # instance attribute shadows the class's

    def off() -> None:
        for _, blk in blocks:
            if isinstance(blk.__dict__.get("forward"), functools.partial):
                del blk.forward

    cls = type(blocks[0][1]).__name__
    return Prepared(forward=model, note=f"{len(blocks)} x {cls}", undo=off, install=on, remove=off)


class _BlockTracer(torch.fx.Tracer):
    def __init__(self, blocks: set[int]) -> None:
        super().__init__()
        self._blocks = blocks

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return id(m) in self._blocks or super().is_leaf_module(m, qualname)


def _flatten(seq: nn.Sequential) -> list[nn.Module]:
    out: list[nn.Module] = []
    for m in seq:
        out.extend(_flatten(m) if isinstance(m, nn.Sequential) else [m])
    return out


def _eval(gm: torch.fx.GraphModule, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    args = map_arg(node.args, lambda n: env[n])
    kwargs = map_arg(node.kwargs, lambda n: env[n])
    if node.op == "call_module":
        return gm.get_submodule(node.target)(*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        obj, *rest = args
        return getattr(obj, node.target)(*rest, **kwargs)
    if node.op == "get_attr":
        obj: Any = gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return obj
    raise PeerUnavailable(f"cannot run fx node {node.name} ({node.op})")


def _longest_chain(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The longest run of compute nodes each fed only by the previous one (and parameters)."""
    compute = [n for n in graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    best: list[torch.fx.Node] = []
    run: list[torch.fx.Node] = []
    for n in compute:
        ins = [a for a in n.all_input_nodes if a.op != "get_attr"]
        if run and ins == [run[-1]] and len(run[-1].users) == 1:
            run.append(n)
        else:
            run = [n] if len(ins) == 1 else []
        if len(run) > len(best):
            best = list(run)
    return best


def sequential(model: nn.Module, *, segments: int | None = None) -> Prepared:
    """``checkpoint_sequential`` with ``round(sqrt(n))`` segments over the model as a sequence.

    Raises:
        PeerUnavailable: the model is not a sequence of single-input layers
            (fx cannot trace it, or skip connections leave no chain covering
            its blocks / most of its layers).
    """
    if isinstance(model, nn.Sequential):
        fns = _flatten(model)
        k = segments or max(1, round(math.sqrt(len(fns))))
        return Prepared(forward=lambda x: checkpoint_sequential(fns, k, x, use_reentrant=False),
                        note=f"{len(fns)} layers in {k} segments")
    blocks = find_blocks(model)
    tracer = _BlockTracer({id(b) for _, b in blocks})
    try:
        graph = tracer.trace(model)
    except Exception as exc:  # fx raises many types on dynamic control flow
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PeerUnavailable(f"not a sequence: torch.fx cannot trace the model ({first[:120]})") from None
    gm = torch.fx.GraphModule(tracer.root, graph)
    chain = _longest_chain(graph)
    modules = [n for n in graph.nodes if n.op == "call_module"]
    block_names = {name for name, _ in blocks}
    in_chain = {n.target for n in chain if n.op == "call_module"}
    covered = block_names <= in_chain if block_names else 2 * len(in_chain) >= len(modules)
    if len(chain) < 4 or not covered:
        raise PeerUnavailable(
            f"not a sequence: the longest chain of single-input layers has {len(chain)} of {len(modules)} "
            "modules (skip connections or several inputs break it)")
    k = segments or max(1, round(math.sqrt(len(chain))))
    first, members = chain[0], set(chain)
    (src,) = [a for a in first.all_input_nodes if a.op != "get_attr"]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]

    def layer(node: torch.fx.Node, prev: torch.fx.Node, env: dict) -> Callable[[Any], Any]:
        return lambda x: _eval(gm, node, {**env, prev: x})

    def forward(*args: Any, **kwargs: Any) -> Any:
        env: dict[torch.fx.Node, Any] = {}
        for i, ph in enumerate(placeholders):
            env[ph] = args[i] if i < len(args) else kwargs.get(ph.target, ph.args[0] if ph.args else None)
        for n in graph.nodes:
            if n.op == "get_attr":
                env[n] = _eval(gm, n, env)
        for n in graph.nodes:
            if n.op in ("placeholder", "get_attr") or (n in members and n is not first):
                continue
            if n is first:
                fns = [layer(m, p, env) for p, m in zip([src] + chain[:-1], chain)]
                env[chain[-1]] = checkpoint_sequential(fns, k, env[src], use_reentrant=False)
            elif n.op == "output":
                return map_arg(n.args[0], lambda a: env[a])
            else:
                env[n] = _eval(gm, n, env)
        raise PeerUnavailable("the traced graph has no output")

    return Prepared(forward=forward, note=f"{len(chain)} layers ({len(in_chain)} of {len(modules)} modules) in {k} segments")


def compiled(model: nn.Module, fraction: float) -> Prepared:
    """``torch.compile(backend="aot_eager")`` under ``activation_memory_budget=fraction``.

    Dynamo's caches are reset before and after, so each budget compiles afresh.
    """
    torch._dynamo.reset()
    fn = torch.compile(model, backend="aot_eager")
    return Prepared(forward=fn, note=f"aot_eager, activation_memory_budget={fraction:g}", undo=torch._dynamo.reset,
                    scope=lambda: torch._functorch.config.patch(activation_memory_budget=fraction))
