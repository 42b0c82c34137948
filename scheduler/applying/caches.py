"""Key/value caches passed into a region's call (NOTE [ Caches under recompute ] in ``scheduler.applying.modules``).

NOTE [ Filled caches replayed ]
    A cache that already holds this call's keys before the call (peft's
    prefix tuning hands every decoder layer a ``DynamicCache`` filled with
    the trained prefix) is part of what the call computes: dropping it
    changes the step (without the prefix, attention's keys are shorter than
    the mask, "size of tensor a (64) must match ... b (72)", or, with no
    mask, a silently different loss), and passing it on as is lets the
    recompute append this call's keys a second time. transformers' own
    checkpointing does the latter (the step fails in the backward) and peft
    refuses prefix tuning on a model whose layers checkpoint.

    So a region keeps such a cache: its call runs with it as written, and
    its recompute runs against a new cache built as this one was before the
    call (:class:`CacheReplay`: the attributes of the cache and of the
    objects of its module it holds, transformers' per-layer
    ``DynamicLayer`` s, copied shallowly, tensors by reference), which the
    recompute writes instead. The region holds the objects its call wrote
    as they were (the prefix of its own layer), and the tensors of the
    others only weakly, so that a loop dropping the model's output before
    ``backward()`` (``Trainer``'s) lets every layer's keys go as it does
    without a plan (holding the cache itself measured 40,444 B over the
    prediction on a 2-layer Llama under prefix tuning). A recompute reads
    such a tensor where it is still alive; where it was let go of (or lives
    on only under another tensor object: T5's self-attention keys, whose
    length its layer's cross-attention reads), a tensor on ``meta`` of its
    shape stands in: its length reads right, and a recompute that computed
    with its values would fail, loudly. A cache is filled for a call when
    ``cache.get_seq_length(i) > 0`` for the layer index ``i`` of the
    call's module (its own ``layer_idx`` or that of its first submodule
    with one; 0 when none; a T5 decoder's cross-attention, called after its
    layer's self-attention wrote, is one): the empty cache a
    ``use_cache=True`` model makes for its own forward, which a layer only
    writes, is still dropped, so the step and its memory are the ones
    planned for.

    Under ``torch.compile`` the region's Python runs once, in Dynamo's
    trace of the forward (the recompute is in the compiled backward), so a
    filled cache is passed on as it is.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from typing import Any, Sequence

import torch
from torch import nn

__all__ = ["CacheDropped", "CacheReplay", "CacheState", "Slot", "cache_slots", "filled_in", "slotted", "without_cache",
           "without_cache_traced"]

_CACHE_ARGS = ("cache", "layer_past", "past_key_value", "past_key_values")


class CacheDropped(UserWarning):
    """A key/value cache (or ``use_cache=True``) reached a checkpointed call that trains; the call runs
    without it (NOTE [ Caches under recompute ] in ``scheduler.applying.modules``)."""


@functools.lru_cache(maxsize=None)
def _cache_params(cls: type) -> tuple[inspect.Signature | None, tuple[str, ...]]:
    try:
        sig = inspect.signature(cls.forward)
    except (TypeError, ValueError):
        return None, ()
    names = tuple(n for n in sig.parameters if n in _CACHE_ARGS or n == "use_cache")
    return (sig if names else None), names


@functools.lru_cache(maxsize=None)
def cache_slots(cls: type) -> tuple[tuple[str, int], ...]:
    """Per cache argument of ``cls.forward``: its name and its position among the positional arguments after
    ``self`` (-1: keyword only). Dynamo reads these constants (NOTE [ Regions under torch.compile ])."""
    sig, names = _cache_params(cls)
    if sig is None:
        return ()
    params = list(sig.parameters.values())[1:]
    slots = []
    for name in names:
        index = -1
        for i, p in enumerate(params):
            if p.kind is p.VAR_POSITIONAL or p.kind is p.KEYWORD_ONLY:
                break
            if p.name == name:
                index = i
                break
        slots.append((name, index))
    return tuple(slots)


def _layer_index(module: nn.Module) -> int:
    for m in module.modules():
        index = getattr(m, "layer_idx", None)
        if isinstance(index, int):
            return index
    return 0


def _filled(value: Any, module: nn.Module) -> bool:
    """NOTE [ Filled caches replayed ]: ``value`` holds keys for ``module``'s call already."""
    length = getattr(value, "get_seq_length", None)
    if not callable(length):
        return False
    try:
        return int(length(_layer_index(module))) > 0
    except Exception:  # a cache that cannot say: treated as one the call only writes
        return False


def _no_cache(name: str, value: Any, module: nn.Module) -> Any:
    if name == "use_cache":
        return False if value else value
    if value is None or isinstance(value, torch.Tensor) or _filled(value, module):
        return value
    return None


def without_cache_traced(module: nn.Module, slots: tuple[tuple[str, int], ...], args: tuple, kwargs: dict
                         ) -> tuple[tuple, dict]:
    """NOTE [ Caches under recompute ] while Dynamo traces: as :func:`without_cache`, no warning."""
    if not slots:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for name, index in slots:
        if name in kwargs:
            kwargs[name] = _no_cache(name, kwargs[name], module)
        elif 0 <= index < len(args):
            args[index] = _no_cache(name, args[index], module)
    return tuple(args), kwargs


def without_cache(module: nn.Module, args: tuple, kwargs: dict, where: str = ""
                  ) -> tuple[tuple, dict, list[Any]]:
    """NOTE [ Caches under recompute ]: no empty cache argument and ``use_cache=False`` for a training call,
    with a :class:`CacheDropped` warning (once per region: Python's default filter shows a message once);
    returns the call's arguments and the filled caches it keeps (NOTE [ Filled caches replayed ])."""
    sig, names = _cache_params(type(module))
    if sig is None or not any(n in kwargs or 0 <= i < len(args) for n, i in cache_slots(type(module))):
        return args, kwargs, []  # no cache argument given: nothing to bind (NOTE [ Region call overhead ])
    try:
        bound = sig.bind(module, *args, **kwargs)
    except TypeError:
        return args, kwargs, []
    changed: list[str] = []
    kept: list[Any] = []
    for name in names:
        if name in bound.arguments:
            value = bound.arguments[name]
            if name == "use_cache" and value:
                bound.arguments[name] = False
                changed.append("use_cache=False")
            elif name != "use_cache" and value is not None and not isinstance(value, torch.Tensor):
                if _filled(value, module):
                    kept.append(value)
                else:
                    bound.arguments[name] = None
                    changed.append(f"{name}=None")
    if not changed:
        return args, kwargs, kept
    if len(changed) > 1 or changed[0] != "use_cache=False" or not kept:
        warnings.warn(f"{type(module).__name__} ({where or 'a checkpointed call'}): a key/value cache is incompatible "
                      f"with checkpointing (the recompute would write it twice), so the call runs with "
                      f"{', '.join(changed)}, as transformers does under gradient checkpointing; pass use_cache=False "
                      "when training with a plan", CacheDropped, stacklevel=2)
    return tuple(bound.args[1:]), dict(bound.kwargs), kept


class CacheState:
    """The state of filled caches at one moment (NOTE [ Filled caches replayed ]): the attributes of each cache
    and of the objects of its module that it holds, copied shallowly (lists and dicts with a copy of their
    items, everything by reference)."""

    def __init__(self, caches: Sequence[Any]) -> None:
        self.saved: dict[int, tuple[Any, dict[str, Any]]] = {}
        todo = list(caches)
        while todo:
            obj = todo.pop()
            if id(obj) in self.saved or not hasattr(obj, "__dict__"):
                continue
            self.saved[id(obj)] = (obj, {k: _copied(v) for k, v in vars(obj).items()})
            home = type(obj).__module__
            for value in vars(obj).values():
                items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) \
                    else (value,)
                todo.extend(x for x in items if type(x).__module__ == home and hasattr(x, "__dict__"))

    def written(self, after: "CacheState") -> set[int]:
        """The ids of the objects whose attributes differ in ``after`` (what a call wrote)."""
        out = set()
        for key_id, (obj, attrs) in self.saved.items():
            later = after.saved.get(key_id, (obj, {}))[1]
            if any(not _same(attrs.get(k, _ABSENT), later.get(k, _ABSENT)) for k in attrs.keys() | later.keys()):
                out.add(key_id)
        return out


class CacheReplay:
    """What a region's recompute needs of a filled cache (NOTE [ Filled caches replayed ]): the objects its call
    wrote, as they were before the call, in a structure like the cache's. Nothing else of the cache is held:
    the tensors of the objects the call did not write are held weakly (another layer's keys, which the user's
    loop may let go of), so a loop that drops the model's output before ``backward()`` frees the cache as it
    does without a plan. :meth:`build` makes a new cache for each recompute, which writes there."""

    def __init__(self, root: Any, before: CacheState, after: CacheState) -> None:
        objs = [obj for obj, _ in before.saved.values()]
        index = {id(o): i for i, o in enumerate(objs)}
        written = before.written(after)
        self.types = [type(o) for o in objs]
        self.states = [{k: _encode(v if items is None else type(v)(items), index, id(o) in written)
                        for k, (v, items) in attrs.items()} for o, attrs in before.saved.values()]
        self.root = index[id(root)]

    def build(self) -> Any:
        new = [object.__new__(t) for t in self.types]
        for obj, state in zip(new, self.states):
            vars(obj).update({k: _decode(v, new) for k, v in state.items()})
        return new[self.root]


class _Weak:
    """A tensor of an object the call did not write, held weakly (NOTE [ Filled caches replayed ]); once let go
    of, a tensor on ``meta`` of its shape and dtype stands in (its length can be read, its values cannot)."""

    __slots__ = ("ref", "shape", "dtype")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.ref, self.shape, self.dtype = weakref.ref(tensor), tuple(tensor.shape), tensor.dtype

    def get(self) -> torch.Tensor:
        tensor = self.ref()
        return torch.empty(self.shape, dtype=self.dtype, device="meta") if tensor is None else tensor


class _Ref:
    """An object of the cache, by its index in :class:`CacheReplay`."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _encode(value: Any, index: dict[int, int], keep: bool) -> Any:
    def one(v: Any) -> Any:
        if id(v) in index:
            return _Ref(index[id(v)])
        if isinstance(v, torch.Tensor) and not keep:
            return _Weak(v)
        return v
    if type(value) is list:
        return [one(v) for v in value]
    if type(value) is dict:
        return {k: one(v) for k, v in value.items()}
    return one(value)


def _decode(value: Any, new: list[Any]) -> Any:
    def one(v: Any) -> Any:
        if isinstance(v, _Weak):
            return v.get()
        return new[v.index] if isinstance(v, _Ref) else v
    if type(value) is list:
        return [one(v) for v in value]
    if type(value) is dict:
        return {k: one(v) for k, v in value.items()}
    return one(value)


class Slot:
    """A filled cache's place among a region's arguments, so that the checkpoint's closure does not hold the
    cache itself (:class:`CacheReplay`)."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k


def slotted(args: tuple, kwargs: dict, caches: Sequence[Any]) -> tuple[tuple, dict]:
    """``args, kwargs`` with each of ``caches`` (top-level arguments) in a :class:`Slot`."""
    at = {id(c): k for k, c in enumerate(caches)}
    return (tuple(Slot(at[id(v)]) if id(v) in at else v for v in args),
            {n: Slot(at[id(v)]) if id(v) in at else v for n, v in kwargs.items()})


def filled_in(args: tuple, kwargs: dict, caches: Sequence[Any]) -> tuple[tuple, dict]:
    """``args, kwargs`` with each :class:`Slot` replaced by its cache."""
    return (tuple(caches[v.k] if isinstance(v, Slot) else v for v in args),
            {n: caches[v.k] if isinstance(v, Slot) else v for n, v in kwargs.items()})


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    if a is _ABSENT or b is _ABSENT:
        return a is b
    (va, ia), (vb, ib) = a, b
    if va is not vb:
        return False
    if isinstance(ia, dict):
        return ia.keys() == ib.keys() and all(ia[k] is ib[k] for k in ia)
    return ia is None or (len(ia) == len(ib) and all(x is y for x, y in zip(ia, ib)))


def _copied(value: Any) -> tuple[Any, Any]:
    """``(value, a copy of its items)`` for a list or dict, ``(value, None)`` for anything else."""
    if type(value) is list:
        return value, list(value)
    if type(value) is dict:
        return value, dict(value)
    return value, None
