"""How much longer the user's eager Python keeps tensors than the traced graph does, per submodule call.

NOTE [ Eager lifetimes in a recompute ]
    A region applied onto the module recomputes by running the submodule's
    *eager* forward again. Python locals keep an intermediate referenced
    until they are rebound or the function returns, where the traced graph
    (and ``solvers.model.simulate``) free it right after its last use. BLOOM's
    attention keeps ``attention_scores`` (batch x heads x seq x seq) through
    the softmax and the dropout; timm's bottleneck keeps its shortcut and
    pre-activation tensors: with the recompute at the peak, plans measured
    0.6-1.1 MiB above their prediction. So the tracer runs the model's eager
    forward once (train mode, grad on, the RNG forked and the buffers restored
    afterwards) under a dispatch mode that records, per storage, the op that
    made it, the last op that read it, the op after which it was freed
    (weakref finalizers) and whether autograd saved it; module hooks record
    where each submodule call starts and ends. For a call running ops
    ``s..e``, the storages it made that nobody saved, that were freed inside
    the call but after their last read, are what eager holds and the graph
    does not; their most at once is the span's ``extra_bytes``, which
    ``simulate`` adds to every step of that region's recompute (an upper
    bound: the most at once, for the whole recompute). Storages whose making
    and death the trace lines up with its nodes are left out: the graph has
    their lifetimes, in the forward and in a recompute alike (NOTE [ Forward
    holds ] in ``scheduler.tracing.forward_holds``, which this run also
    measures). On the ``meta`` device the run gives the holds only (meta
    tensors have storages, lifetimes and ops, but meta's kernels are
    decompositions: attention's math path materialises scores the target's
    fused kernel never makes, and Llama-2-7B's extras made its planned cards
    1.8x larger); extras stay 0 there, as do a call's held arguments. A model
    whose eager forward fails there (an op reading values) gets no holds, and
    the log says so.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..measuring.storages import storage_key
from .records import storage_bytes

__all__ = ["measure_call_extras"]

log = logging.getLogger(__name__)


@dataclass
class _Storage:
    nbytes: int
    made: int
    last_read: int
    freed: int | None = None
    saved: bool = False


class _Recorder(TorchDispatchMode):
    """Per storage: made, last read, freed (op indices), saved by autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.op = 0
        self.live: dict[int, _Storage] = {}  # storage key -> its record, while alive
        self.records: list[_Storage] = []
        self.ops: list[str] = []  # the overload of each op, in order (op ``i`` is ``ops[i - 1]``)

    @staticmethod
    def _key(t: torch.Tensor) -> int | None:
        key = storage_key(t)
        return key if key is not None and t.untyped_storage().nbytes() else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        self.op += 1
        self.ops.append(str(func))
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                rec = self.live.get(self._key(t))
                if rec is not None:
                    rec.last_read = self.op
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = self._key(t)
                if key is not None and key not in self.live:
                    rec = _Storage(storage_bytes(t), self.op, self.op)
                    self.live[key] = rec
                    self.records.append(rec)
                    weakref.finalize(t.untyped_storage(), self._freed, key, rec)
        return out

    def _freed(self, key: int, rec: _Storage) -> None:
        rec.freed = self.op
        if self.live.get(key) is rec:
            del self.live[key]

    def saved(self, t: torch.Tensor) -> None:
        """Mark what autograd saves; keep none of it, so that every storage dies when Python lets go of it
        (NOTE [ Forward holds ] in ``scheduler.tracing.forward_holds``: no backward follows this run)."""
        rec = self.live.get(self._key(t)) if isinstance(t, torch.Tensor) else None
        if rec is not None:
            rec.saved = True
        return None


def measure_call_extras(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
                        loss: Callable[[Any], torch.Tensor] | None, paths: Sequence[str],
                        held: list[tuple[int, tuple[str, ...]]] | None = None,
                        returns: dict[str, str] | None = None,
                        lifetimes: Callable[[Sequence[str], Sequence[tuple[int, int | None]]], set[int]] | None = None,
                        ) -> dict[str, int]:
    """``{call path: extra bytes}`` for the given submodule calls (NOTE [ Eager lifetimes in a recompute ]).

    ``paths`` are module paths (called once) or ``parent[i:j]`` runs of an
    ``nn.Sequential``'s children. Calls that did not run, and every call on
    the ``meta`` device, get 0. ``held``, when given, gets one ``(bytes, call paths)`` per storage of
    the tensor arguments calls receive and do not read, made before the call and saved by nobody
    (NOTE [ A call's held arguments ] in ``scheduler.tracing.held_arguments``; module paths only).
    ``returns``, when given, gets ``{module path: type name}`` of the calls whose first run returned something
    other than one tensor (``graphs.CALL_RETURNS_META``: a chunk menu offers no such call); left empty on ``meta``.
    ``lifetimes``, when given, is called with the run's ops (overload names, op ``i`` at ``[i - 1]``) and, per
    storage, the op that made it and the last op before Python let it go (``None``: alive at the end); it returns
    the storages the graph now keeps as long as eager does (NOTE [ Forward holds ] in
    ``scheduler.tracing.forward_holds``), which the extras leave out.
    """
    from .spans import parse_run_path

    wanted: dict[str, str] = {}
    for p in paths:
        run = parse_run_path(p)
        if run is None:
            wanted[p] = p
        else:
            parent, i, j = run
            prefix = f"{parent}." if parent else ""
            wanted[f"{prefix}{i}"] = wanted.get(f"{prefix}{i}", f"{prefix}{i}")
            wanted[f"{prefix}{j}"] = wanted.get(f"{prefix}{j}", f"{prefix}{j}")
    names = {id(m): n for n, m in model.named_modules() if n in wanted}
    rec = _Recorder()
    starts: dict[str, int] = {}
    ends: dict[str, int] = {}

    def pre(mod: nn.Module, _args: Any) -> None:
        n = names.get(id(mod))
        if n is not None and n not in starts:
            starts[n] = rec.op + 1

    def post(mod: nn.Module, _args: Any, out: Any) -> None:
        n = names.get(id(mod))
        if n is not None and n not in ends:
            ends[n] = rec.op
            if returns is not None and not isinstance(out, torch.Tensor):
                returns[n] = type(out).__name__

    unread: dict[str, tuple[int, dict[int, _Storage]]] = {}  # path -> (first op, storages passed in, not read)

    def passed(mod: nn.Module, a: Any, k: Any) -> None:
        n = names.get(id(mod))
        if n is None or n in unread:
            return
        first = rec.op + 1
        found = {}
        for t in pytree.tree_leaves((a, k)):
            r = rec.live.get(rec._key(t)) if isinstance(t, torch.Tensor) else None
            if r is not None and r.made < first:
                found[id(r)] = r
        unread[n] = (first, found)

    def returned(mod: nn.Module, _a: Any, _k: Any, result: Any) -> None:
        n = names.get(id(mod))
        if n is not None and n in unread:
            first, found = unread[n]
            out = {id(r) for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)
                   and (r := rec.live.get(rec._key(t))) is not None}
            # read inside, or handed back (dropout with p=0 returns its input): the graph has it
            unread[n] = (first, {i: r for i, r in found.items() if r.last_read < first and i not in out})

    handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
               torch.nn.modules.module.register_module_forward_hook(post)]
    if held is not None:
        for m in model.modules():
            if id(m) in names and parse_run_path(names[id(m)]) is None:
                handles.append(m.register_forward_pre_hook(passed, with_kwargs=True))
                handles.append(m.register_forward_hook(returned, with_kwargs=True))
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers]
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(rec.saved, lambda packed: packed):
            with rec:
                out = model(*args, **kwargs)
                value = loss(out) if loss is not None else out
            del out, value
    except Exception as exc:  # noqa: BLE001  (a failure here must not stop the trace: no extras)
        log.warning("eager lifetimes not measured (%s: %s); span extras 0", type(exc).__name__, exc)
        return {p: 0 for p in paths}
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)
    records = rec.records
    modelled: set[int] = set()
    if lifetimes is not None:
        modelled = lifetimes(rec.ops, [(r.made, r.freed) for r in records])
    leaves = list(model.parameters()) + [t for t in pytree.tree_leaves((tuple(args), dict(kwargs)))
                                         if isinstance(t, torch.Tensor)]
    if any(t.device.type == "meta" for t in leaves):
        # meta runs its kernels' decompositions (attention's math path, its scores materialised): what a call's
        # temporaries hold there is not the target's; Python's holds are the same (lined up with the records)
        if returns is not None:
            returns.clear()
        return {p: 0 for p in paths}
    if held is not None:
        storages: dict[int, tuple[_Storage, list[str]]] = {}
        for n, (_, found) in unread.items():
            for i, r in found.items():
                if not r.saved:  # saved: alive to a backward after this call's
                    storages.setdefault(i, (r, []))[1].append(n)
        held.extend((r.nbytes, tuple(calls)) for r, calls in storages.values())
    out: dict[str, int] = {}
    for p in paths:
        run = parse_run_path(p)
        if run is None:
            s, e = starts.get(p), ends.get(p)
        else:
            parent, i, j = run
            prefix = f"{parent}." if parent else ""
            s, e = starts.get(f"{prefix}{i}"), ends.get(f"{prefix}{j}")
        out[p] = 0 if s is None or e is None else _extra(records, s, e, modelled)
    return out


def _extra(records: Sequence[_Storage], s: int, e: int, modelled: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """The most bytes at once made in ops ``s..e``, unsaved, freed inside the call after their last read
    (but the ``modelled`` ones: positions in ``records`` whose lifetimes the graph has)."""
    events: list[tuple[int, int]] = []
    for i, r in enumerate(records):
        if i in modelled:
            continue
        if s <= r.made <= e and not r.saved and r.freed is not None and r.freed <= e and r.freed > r.last_read:
            events.append((r.last_read + 1, r.nbytes))  # dead for the graph from here
            events.append((r.freed + 1, -r.nbytes))     # gone in eager from here
    best = run = 0
    for _, delta in sorted(events):
        run += delta
        best = max(best, run)
    return best
