"""An applied plan, seen by the checks libraries make for gradient checkpointing.

NOTE [ Visible to gradient-checkpointing checks ]
    Libraries ask a model whether it checkpoints by looking for a true
    ``gradient_checkpointing`` attribute on any of its modules: transformers'
    ``is_activation_checkpointing`` (``is_gradient_checkpointing`` before),
    peft's prefix tuning (which refuses to run under checkpointing, since its
    prefix is a key/value cache and a region drops caches, NOTE [ Caches under
    recompute ] in ``scheduler.applying.modules``; unseen, it failed deep in
    attention), ``Trainer``'s and TRL's checks before generating. So
    :func:`mark` sets that attribute on each module whose call is a region
    (the ``nn.Sequential`` holding runs of regions), and :func:`unmark`
    (``remove``) puts back what was there. It is a plain attribute: names,
    ``state_dict`` and pickling are unchanged.

    A module may itself read the attribute: transformers' decoder layers
    checkpoint their own forward when it is true, and some models drop their
    cache. Inside the region the module runs as without the plan: the
    region's function (forward and recompute) sees the value the module had
    before (:func:`as_before`), so nothing is checkpointed twice. Under
    ``torch.compile`` the flags are set so around the region's checkpoint
    instead of inside it (:func:`flags_as_before`, NOTE [ Regions under
    torch.compile ] in ``scheduler.applying.regions``).

    transformers before 5.2x reads the flag in ``GradientCheckpointingLayer.__call__``,
    before any forward runs: with the flag on, the layer's call goes through
    its ``_gradient_checkpointing_func``, which only
    ``gradient_checkpointing_enable()`` sets (5.17 on a ViT layer region: "no
    attribute '_gradient_checkpointing_func'"; after the user's enable and
    disable, their checkpoint around ours). So :func:`mark` also sets that
    attribute, on the instance, to :func:`_call_through`, which calls the
    layer as without the flag: what is left of the flag there is what
    transformers' own checkpointing does too, dropping the layer's cache
    arguments, as a region does anyway (NOTE [ Caches under recompute ] in
    ``scheduler.applying.modules``). :func:`unmark` puts back what was there.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from torch import nn

__all__ = ["FLAG", "mark", "unmark", "as_before", "is_marked", "flags_as_before", "restore_flag"]

#: The attribute libraries read.
FLAG = "gradient_checkpointing"
#: Where :func:`mark` keeps the module's own value: ``(had it, value)``.
_BEFORE = "_ckpt_flag_before"
#: What transformers' layers call when the flag is on (before 5.2x, in ``__call__``), and where its value is kept.
FUNC = "_gradient_checkpointing_func"
_FUNC_BEFORE = "_ckpt_func_before"


def _call_through(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A layer's checkpointing function that checkpoints nothing: the region around the layer does."""
    return fn(*args, **kwargs)


def mark(module: nn.Module) -> None:
    """Set ``module.gradient_checkpointing = True`` and its checkpointing function to :func:`_call_through`,
    keeping the instance's own values for :func:`unmark`."""
    d = module.__dict__
    if _BEFORE not in d:
        d[_BEFORE] = (FLAG in d, d.get(FLAG))
        d[_FUNC_BEFORE] = (FUNC in d, d.get(FUNC))
    d[FLAG] = True
    d[FUNC] = _call_through


def unmark(module: nn.Module) -> None:
    """Put back the values :func:`mark` found (no instance attribute, when there was none)."""
    d = module.__dict__
    if _BEFORE not in d:
        return
    for key, kept in ((FLAG, d.pop(_BEFORE)), (FUNC, d.pop(_FUNC_BEFORE, (False, None)))):
        had, value = kept
        if had:
            d[key] = value
        else:
            d.pop(key, None)


def as_before(module: nn.Module, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with ``module.gradient_checkpointing`` as it was before :func:`mark` (False if unset)."""
    d = module.__dict__
    if _BEFORE not in d:
        return fn
    return functools.partial(_run_as_before, d, fn)  # no closure per call (NOTE [ Region call overhead ])


def _run_as_before(d: dict, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    present, current = FLAG in d, d.get(FLAG)  # a recompute may run after remove(): read the state then
    had, value = d.get(_BEFORE, (False, None))
    d[FLAG] = bool(value) if had else False
    try:
        return fn(*args, **kwargs)
    finally:
        if present:
            d[FLAG] = current
        else:
            d.pop(FLAG, None)


def is_marked(module: nn.Module) -> bool:
    """Whether :func:`mark` set the flag on ``module`` (and :func:`unmark` has not put it back)."""
    return _BEFORE in module.__dict__


def flags_as_before(modules: Any) -> list[tuple[nn.Module, bool, Any]]:
    """Set the flag of each marked module in ``modules`` to its value before :func:`mark`, where it differs;
    return ``(module, present, value)`` for :func:`restore_flag`. Traceable by Dynamo (plain dict reads and
    writes, none where nothing changes: a region inside another finds its flag set already)."""
    changed = []
    for m in modules:
        d = m.__dict__
        if _BEFORE not in d:
            continue
        had, value = d[_BEFORE]
        want = bool(value) if had else False
        present = FLAG in d
        current = d.get(FLAG)
        if present and current is want:
            continue
        d[FLAG] = want
        changed.append((m, present, current))
    return changed


def restore_flag(module: nn.Module, present: bool, value: Any) -> None:
    """Put back what :func:`flags_as_before` changed."""
    if present:
        module.__dict__[FLAG] = value
    else:
        module.__dict__.pop(FLAG, None)
