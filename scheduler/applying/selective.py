"""Selective recompute on the user's module: one checkpoint policy per region.

NOTE [ Selective checkpoint policies ]
    A plan that keeps some nodes' outputs inside a region (``Plan.saved``)
    names them for the applier as ``Plan.save_ops``: per region, pairs
    ``(overload, k)``, "the ``k``-th call (from 0) of this ATen overload in
    the region's forward" (NOTE [ Which op a policy keeps ] in
    ``scheduler.tracing.recorder`` says how the tracer finds them). Such a
    region runs under ``torch.utils.checkpoint.checkpoint(...,
    use_reentrant=False, context_fn=...)`` with two dispatch modes of our own
    and a :class:`RegionPolicy`:

    * in the forward (:class:`_Keeping`) the policy counts the calls of each
      listed overload (NOTE [ Calls no policy keeps ]) and answers
      ``MUST_SAVE`` for the listed calls; the mode keeps
      a detached alias of what such a call returned (and its version
      counter). In the recompute (:class:`_Replaying`) the same call, found
      by overload and count, returns the kept tensor instead of running
      again (what ``solvers.model.simulate`` models as NOTE [ Selective
      recompute ]), and the mode lets go of it;
    * the modes count as torch's own selective checkpoint does (``detach``
      and the other ``SAC_IGNORED_OPS`` are never counted), and the policy
      not the calls of our own devices: the recompute probe (NOTE [
      Recompute at the region's end ]) is made while the policy is paused,
      and the BatchNorm snapshot (NOTE [ Stateful ops under recompute ]) is
      taken and put back outside the recompute mode.

NOTE [ Kept calls that do not come ]
    The calls are matched by overload and count, so a forward that runs
    other ATen ops than the trace recorded would keep other tensors than the
    plan was costed for: a region that drops its key/value cache (NOTE [
    Caches under recompute ]) no longer makes the cache writes (``cat``) the
    trace saw; a model moved to bf16, or run under autocast, after an fp32
    trace makes casts (``_to_copy``) the trace did not have; another torch
    decomposes differently. Recomputing a call instead of keeping it is
    always right (the call is deterministic: the tracer never keeps one that
    draws random numbers or updates state) and never costs memory the plan
    did not count, so a mismatch degrades, never fails:

    * an overload is "off" in a region once its calls in a forward differ
      from the traced count (``Plan.save_op_calls``), or a listed call of it
      did not happen: as soon as a forward calls it more often than traced,
      or when the forward ends; what the forward kept of it is let go of
      then, and every later forward of the region keeps none of it (the
      other overloads' calls are still kept: their counts matched);
    * one :class:`KeptOpsDropped` warning per region says which overloads
      are recomputed and why (a region whose cache was dropped has said so
      with ``CacheDropped`` already, and says this once more);
    * a kept tensor written in place after the forward (its version counter
      moved) is recomputed instead of returned.

    Overloads the plan keeps no call of are not compared: eager may run
    calls the trace does not have (transformers' GPT-2 block builds its
    causal mask with ``ones``/``tril`` in eager only).

NOTE [ Double backward through kept calls ]
    A kept tensor is let go of when the recompute returns it, so that it is
    freed as the plan predicts. A second backward through the region
    (``backward(retain_graph=True)`` twice, or the backward of a gradient
    made with ``create_graph=True``) recomputes the region again and finds
    nothing kept: the call runs again, on the same recomputed inputs, and
    returns the same values (torch's own selective checkpoint raises "backward
    an extra time" there). That second recompute is a plain checkpoint's:
    it makes again what the first was handed (``simulate`` models one
    backward; a second one is not part of a plan's prediction, with or
    without kept calls). The unpacked tensors take their
    autograd history from the forward's graph, not from the recompute, so
    higher-order gradients are those of the unplanned step.

    Regions without listed calls run exactly as before (no ``context_fn``).

NOTE [ Kept calls under torch.compile ]
    Dynamo cannot trace our two dispatch modes, but it traces torch's own
    selective checkpoint: while a region is being compiled, its checkpoint
    gets ``context_fn=policy.compiled`` (:func:`compiled_contexts`), which
    resets the counts and returns ``create_selective_checkpoint_contexts``
    with the same :class:`RegionPolicy`. Dynamo keeps that function on its
    checkpoint operator; AOTAutograd calls it when it traces the region's
    forward (once per trace: a compile may trace twice, hence the reset),
    and the policy sees the region's ATen calls as in eager (the same
    ``SAC_IGNORED_OPS`` left out) and answers ``MUST_SAVE`` for the listed
    ones. torch tags those graph nodes and the partitioner saves them
    for the backward instead of recomputing them; every other op of the
    region is ``PREFER_RECOMPUTE``, as for a region without kept calls
    (torch's checkpoint operator runs every region through this path, with
    an always-recompute policy). The gradients are the compiled unplanned
    step's (bitwise under ``aot_eager``): a kept value is the forward's.
    What differs from eager: the policy runs at compile time, not at each
    step, and no forward Python runs to settle it (NOTE [ Kept calls that
    do not come ]): a listed call that does not come keeps nothing, an
    overload called more often than traced is turned off from that call on
    (its earlier listed calls stay kept, more memory than planned, the same
    gradients), and no ``KeptOpsDropped`` is warned; overloads turned off
    in eager stay off. torch logs once that a ``context_fn`` reached
    ``torch.compile`` ("make sure the checkpointed region does not contain
    in-place ops"): the tracer never keeps a call that writes in place.

NOTE [ Calls no policy keeps ]
    Every ATen call of a selective region passes through our mode twice
    (forward and recompute); most are of overloads the plan keeps no call
    of. Each overload is looked at once per policy (``RegionPolicy.hot``:
    whether it is listed in ``save_ops`` or ``save_op_calls``; never a
    ``SAC_IGNORED_OPS`` one); a call of any other overload only runs, in
    both modes: it is neither counted (the counts of NOTE [ Kept calls that
    do not come ] are compared for listed overloads only) nor looked up in
    the store (nothing of it was kept). The calls of a listed overload are
    counted and asked of the policy as before, so what is kept and served
    is unchanged. What the modes count for a :func:`tally` (module
    ``scheduler.applying.tally``, NOTE [ Counting what a selective policy
    served ]) is every call, as before. The compiled path is torch's own
    and still asks the policy about every call.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from .tally import _TALLIES, Tally, _note, count_step_flops, tally

__all__ = ["RegionPolicy", "KeptOpsDropped", "selective_contexts", "compiled_contexts", "Tally", "tally", "count_step_flops"]

try:  # the calls torch's selective checkpoint does not count (the forward and its recompute differ there)
    from torch.utils.checkpoint import SAC_IGNORED_OPS as _IGNORED
except ImportError:  # pragma: no cover (older torch)
    _IGNORED = {torch.ops.aten.detach.default}


class KeptOpsDropped(UserWarning):
    """A region's forward did not make the ATen calls its plan keeps; those calls are recomputed instead
    (NOTE [ Kept calls that do not come ] in ``scheduler.applying.selective``)."""


class RegionPolicy:
    """The selective-checkpoint policy of one region (NOTE [ Selective checkpoint policies ]).

    Args:
        region: the region's module path (for messages).
        save_ops: ``(overload, occurrence)`` pairs, as ``Plan.save_ops`` lists them.
        calls: ``(overload, traced calls)`` pairs, as ``Plan.save_op_calls`` lists
            them; empty: only check that the listed calls happen.

    Attributes:
        counts: calls of each listed overload seen in the running forward (in eager, NOTE [ Calls no
            policy keeps ]; under torch.compile, of every overload).
        saved: ``(overload, occurrence)`` pairs kept in the running forward (and not let go of).
        off: overloads this region no longer keeps, with why (NOTE [ Kept calls that do not come ]).
        cache_dropped: the running call dropped its key/value cache (NOTE [ Caches under recompute ]).
    """

    def __init__(self, region: str, save_ops: Iterable[Sequence[Any]], calls: Iterable[Sequence[Any]] = ()) -> None:
        self.region = region
        self.save_ops = tuple((str(op), int(k)) for op, k in save_ops)
        self.calls = tuple((str(op), int(n)) for op, n in calls)
        self._traced = dict(self.calls)
        self._wanted = frozenset(self.save_ops)
        self._names: dict[Any, str] = {}
        self._kept_names = frozenset(op for op, _ in self.save_ops) | frozenset(self._traced)
        self.hot: dict[Any, bool] = {}  # overload -> whether the eager modes ask this policy (NOTE [ Calls no policy keeps ])
        self.off: dict[str, str] = {}
        self.paused = 0
        self._warned = False
        self.cache_dropped = False  # set by the region when this call dropped its cache (for the warning)
        self._store: _Store | None = None
        self.compiled = compiled_contexts(self)  # NOTE [ Kept calls under torch.compile ]
        self.reset()

    def __getstate__(self) -> dict[str, Any]:  # pickle / deepcopy: the counts of no running forward
        return {"region": self.region, "save_ops": self.save_ops, "calls": self.calls}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["region"], state["save_ops"], state.get("calls", ()))

    def reset(self, store: "_Store | None" = None) -> None:
        """A forward starts (keeping into ``store``)."""
        self.counts: dict[str, int] = defaultdict(int)
        self.saved: list[tuple[str, int]] = []
        self._store = store

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if self.paused:
            return CheckpointPolicy.PREFER_RECOMPUTE
        name = self._names.get(func)
        if name is None:
            name = self._names.setdefault(func, str(func))
        k = self.counts[name]
        self.counts[name] = k + 1
        if name in self.off:
            return CheckpointPolicy.PREFER_RECOMPUTE
        traced = self._traced.get(name)
        if traced is not None and k >= traced:
            self._turn_off(name, f"called more than the {traced} time(s) traced")
            return CheckpointPolicy.PREFER_RECOMPUTE
        if (name, k) in self._wanted:
            self.saved.append((name, k))
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def cares(self, func: Any) -> bool:
        """Whether this policy keeps or checks calls of ``func`` (NOTE [ Calls no policy keeps ])."""
        if func in _IGNORED:
            return False
        name = self._names.get(func)
        if name is None:
            name = self._names.setdefault(func, str(func))
        return name in self._kept_names

    @contextlib.contextmanager
    def pause(self):  # noqa: ANN201
        """Calls made inside are not counted (our own devices: the recompute probe)."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def settle(self) -> dict[str, str]:
        """The forward ended: turn off every kept overload whose calls differed from the trace (NOTE [ Kept
        calls that do not come ]), warn once, and return the overloads off in this region with why."""
        for op, n in self.calls:
            seen = self.counts.get(op, 0)
            if seen != n and op not in self.off:
                self._turn_off(op, f"traced {n} time(s), called {seen} time(s)")
        for op, k in self.save_ops:
            seen = self.counts.get(op, 0)
            if seen <= k and op not in self.off:
                self._turn_off(op, f"call {k} (from 0) kept, called {seen} time(s)")
        self._store = None
        if self.off and not self._warned:
            self._warned = True
            why = "; ".join(f"{op}: {reason}" for op, reason in self.off.items())
            cause = ("this call dropped its key/value cache, so the cache writes the trace saw were not made: trace "
                     "and train with use_cache=False to plan the step that runs" if self.cache_dropped else
                     "the module runs other ops than traced (a dtype or autocast other than the trace's, another "
                     "torch, another branch): trace and solve again on this setup to keep them")
            warnings.warn(
                f"region {self.region!r}: its forward did not make the ATen calls the plan keeps ({why}), so those "
                f"calls are recomputed instead of kept: less memory than planned, more recompute, the same gradients; "
                f"{cause} (NOTE [ Kept calls that do not come ])", KeptOpsDropped, stacklevel=2)
        return dict(self.off)

    def _turn_off(self, op: str, why: str) -> None:
        self.off[op] = why
        self.saved = [s for s in self.saved if s[0] != op]
        if self._store is not None:
            self._store.let_go(op)

    def __repr__(self) -> str:
        return f"RegionPolicy({self.region!r}, {list(self.save_ops)})"


# --------------------------------------------------------------------------- the two dispatch modes
def _detached(t: Any) -> Any:
    """A detached alias sharing ``t``'s version counter (below autograd, ``detach`` needs the view key
    back on for that), and the version it had."""
    if not isinstance(t, torch.Tensor):
        return t
    with torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.ADInplaceOrView, False):
        alias = t.detach()
    return _Kept(alias, t._version)


class _Kept:
    __slots__ = ("tensor", "version")

    def __init__(self, tensor: torch.Tensor, version: int) -> None:
        self.tensor, self.version = tensor, version


class _Store:
    """What one region call keeps: ``(overload, index) -> output`` with ``_Kept`` leaves."""

    def __init__(self) -> None:
        self.entries: dict[tuple[Any, int], Any] = {}

    def let_go(self, op: str) -> None:
        for key in [key for key in self.entries if str(key[0]) == op]:
            del self.entries[key]

    def take(self, key: tuple[Any, int]) -> Any:
        """The kept output for ``key``, let go of (None: recompute the call: never kept, taken by an earlier
        backward, or written in place since)."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return None
        if type(entry) is _Kept:  # one tensor (most calls): no tree walk
            return entry.tensor if entry.tensor._version == entry.version else None
        leaves = pytree.tree_leaves(entry, is_leaf=lambda x: isinstance(x, _Kept))
        if any(isinstance(x, _Kept) and x.tensor._version != x.version for x in leaves):
            return None
        return pytree.tree_map(lambda x: x.tensor if isinstance(x, _Kept) else x, entry,
                               is_leaf=lambda x: isinstance(x, _Kept))


class _Keeping(TorchDispatchMode):
    """The forward's mode: counts calls, keeps what the policy says (NOTE [ Selective checkpoint policies ]);
    calls of overloads the policy does not care about only run (NOTE [ Calls no policy keeps ])."""

    def __init__(self, policy: RegionPolicy, store: _Store) -> None:
        super().__init__()
        self.policy, self.store, self.hot = policy, store, policy.hot
        self.index: dict[Any, int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **kwargs) if kwargs else func(*args)
        hot = self.hot.get(func)
        if hot is None:
            hot = self.hot[func] = self.policy.cares(func)
        keep = False
        if hot:
            i = self.index[func]
            self.index[func] = i + 1
            keep = self.policy(None, func, *args, **(kwargs or {})) is CheckpointPolicy.MUST_SAVE
            if keep:
                self.store.entries[(func, i)] = (_detached(out) if type(out) is torch.Tensor
                                                 else pytree.tree_map(_detached, out))
        if _TALLIES and func not in _IGNORED:
            _note("forward", func, args, kwargs or {}, out, keep)
        return out


class _Replaying(TorchDispatchMode):
    """The recompute's mode: a kept call returns what the forward kept, once (NOTE [ Double backward through
    kept calls ]); every other call runs."""

    def __init__(self, store: _Store, hot: dict[Any, bool]) -> None:
        super().__init__()
        self.store, self.hot = store, hot
        self.index: dict[Any, int] = defaultdict(int)

    def __enter__(self) -> Any:
        self.index.clear()
        return super().__enter__()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kept = None
        if self.hot.get(func):  # an overload the forward asked the policy about (NOTE [ Calls no policy keeps ])
            i = self.index[func]
            self.index[func] = i + 1
            kept = self.store.take((func, i))
        out = (func(*args, **kwargs) if kwargs else func(*args)) if kept is None else kept
        if _TALLIES and func not in _IGNORED:
            _note("recomputed" if kept is None else "served", func, args, kwargs or {}, out)
        return out


class _Forward:
    """The forward context: the keeping mode, then the policy's settling when the forward returns."""

    def __init__(self, policy: RegionPolicy, store: _Store) -> None:
        self.policy, self.mode = policy, _Keeping(policy, store)

    def __enter__(self) -> None:
        self.policy.reset(self.mode.store)
        self.mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)
        if exc[0] is None:
            self.policy.settle()


class _Recompute:
    """The recompute context: BatchNorm snapshot outside the replaying mode (NOTE [ Selective checkpoint
    policies ])."""

    def __init__(self, store: _Store, stats: Sequence[torch.Tensor], hot: dict[Any, bool]) -> None:
        self.mode, self.stats = _Replaying(store, hot), stats
        self.saved: list[torch.Tensor] = []

    def __enter__(self) -> None:
        self.saved = [b.detach().clone() for b in self.stats]
        self.mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            self.mode.__exit__(*exc)
        finally:
            with torch.no_grad():
                for b, s in zip(self.stats, self.saved):
                    b.copy_(s)
            self.saved = []


def _contexts(policy: RegionPolicy, stats: Sequence[torch.Tensor]) -> tuple[_Forward, _Recompute]:
    store = _Store()
    return _Forward(policy, store), _Recompute(store, stats, policy.hot)


def selective_contexts(policy: RegionPolicy, stats: Sequence[torch.Tensor]) -> Any:
    """The ``context_fn`` for ``checkpoint`` running a region under ``policy``; ``stats`` are
    the running statistics to snapshot around its recompute (NOTE [ Stateful ops under recompute ])."""
    return functools.partial(_contexts, policy, tuple(stats))


def compiled_contexts(policy: RegionPolicy) -> Any:
    """The ``context_fn`` of a region's checkpoint while Dynamo traces it (NOTE [ Kept calls under
    torch.compile ]): a plain function (Dynamo takes it as a constant), each call a fresh count."""

    def context_fn() -> tuple[Any, Any]:
        policy.reset()
        return create_selective_checkpoint_contexts(policy)

    return context_fn
