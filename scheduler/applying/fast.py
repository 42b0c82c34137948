"""What a region does at each call, done without generic machinery where the call is plain.

NOTE [ Region call overhead ]
    Every call of a region pays, beside torch's checkpoint, for the rules
    of ``scheduler.applying.modules`` and ``regions``: the running
    statistics and the stochastic modules it holds (NOTE [ Stateful ops
    under recompute ], NOTE [ RNG replay decided at run time ]), its
    arguments split into checkpoint inputs (NOTE [ Every tensor a region
    receives is a checkpoint input ]), the generator watch and the probe
    (NOTE [ Recompute at the region's end ]). Done with ``modules()``
    walks, ``pytree`` and ``register_multi_grad_hook``, a region call cost
    130-170 us more than torch's own checkpoint of the same small block
    (two linears and a norm, forward and backward, best of repeats, both
    trees in one process on a busy machine); the short ways below save
    10-20 us of it. Most of the rest is the probe and the watch, which
    torch's checkpoint does not have (``benchmarks/overhead.py`` measures a
    ViT block; ``--against CHECKOUT`` an older checkout in the same
    rounds). So the common cases go a shorter way, each giving what the
    general way gives:

    * one walk of the region's modules finds the statistics and the
      stochastic modules together (:func:`region_state`), in the order
      ``modules()`` gives them, and a module class's kind (dropout,
      ``RReLU``, a drop-path name) is found once per class;
    * arguments that are all tensors or scalars (no container: nothing a
      later append could change, NOTE [ Containers passed to a region ])
      are split without ``pytree`` (:func:`split_args`); any container
      goes the ``pytree`` way as before;
    * the probe's hook is a plain tensor hook when the region has one
      output that needs a gradient (``register_multi_grad_hook(...,
      mode="any")`` of one tensor is that hook, run once per backward);
    * the generator watch reads no accelerator state for inputs that are
      all on the CPU (there is none to read), and pauses the dispatch
      modes only when some are on (``scheduler.applying.rng``).

    Nothing is cached across calls that a call could change: the module
    walk is made at every call (a module switched to ``eval()``, or a
    dropout rate set to 0, between two steps is seen at the next call).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn

from .rng import draws

__all__ = ["region_state", "split_args", "hook_outputs"]

_NORM = nn.modules.batchnorm._NormBase
#: Types split without pytree: pytree leaves that are tensors, and scalars.
_TENSORS = (torch.Tensor, nn.Parameter)
_LEAVES = frozenset({torch.Tensor, nn.Parameter, type(None), bool, int, float, complex, str})


def region_state(modules: Sequence[nn.Module], *, drawing: bool) -> tuple[list[torch.Tensor], list[nn.Module]]:
    """The running statistics the region's forward updates (BatchNorm-style buffers of modules in training
    mode), and, if ``drawing``, the modules that draw random numbers when called now; both in ``modules()``
    order, each root walked on its own (NOTE [ Region call overhead ])."""
    stats: list[torch.Tensor] = []
    drawn: list[nn.Module] = []
    for top in modules:
        seen: set[int] = set()
        stack = [top]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            if m.training:
                if isinstance(m, _NORM) and m.track_running_stats:
                    stats.extend(dict.fromkeys(b for b in m._buffers.values() if b is not None))
                if drawing and draws(m):
                    drawn.append(m)
            children = m._modules
            if children:
                stack.extend(c for c in reversed(children.values()) if c is not None)
    return stats, drawn


def split_args(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], Callable[[tuple], tuple[tuple, dict]]]:
    """The tensors among a region's arguments, and how to rebuild ``(args, kwargs)`` (fresh containers) from
    them (NOTE [ Every tensor a region receives is a checkpoint input ]; NOTE [ Region call overhead ])."""
    if all(type(v) in _LEAVES for v in args) and all(type(v) in _LEAVES for v in kwargs.values()):
        if not kwargs and all(type(v) in _TENSORS for v in args):
            return list(args), _positional
        arg_at = [i for i, v in enumerate(args) if type(v) in _TENSORS]
        kw_at = [k for k, v in kwargs.items() if type(v) in _TENSORS]
        tensors = [args[i] for i in arg_at] + [kwargs[k] for k in kw_at]
        a_template = [None if type(v) in _TENSORS else v for v in args]
        kw_template = {k: (None if type(v) in _TENSORS else v) for k, v in kwargs.items()}
        cut = len(arg_at)

        def rebuild_flat(values: tuple) -> tuple[tuple, dict]:
            a, kw = list(a_template), dict(kw_template)
            for i, t in zip(arg_at, values):
                a[i] = t
            for k, t in zip(kw_at, values[cut:]):
                kw[k] = t
            return tuple(a), kw

        return tensors, rebuild_flat
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = [leaves[i] for i in tensor_at]
    template = [None if isinstance(v, torch.Tensor) else v for v in leaves]
    del leaves

    def rebuild(values: tuple) -> tuple[tuple, dict]:
        filled = list(template)
        for i, t in zip(tensor_at, values):
            filled[i] = t
        return pytree.tree_unflatten(filled, spec)

    return tensors, rebuild


def _positional(values: tuple) -> tuple[tuple, dict]:
    return tuple(values), {}


def hook_outputs(out: Any, fn: Callable[[Any], None]) -> None:
    """Run ``fn`` when the backward first reaches an output of the region that needs a gradient (NOTE [
    Recompute at the region's end ]); a plain tensor hook when there is one such output."""
    if type(out) in _TENSORS:
        outs = [out] if out.requires_grad else []
    else:
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if len(outs) == 1:
        outs[0].register_hook(fn)
    elif outs:
        torch.autograd.graph.register_multi_grad_hook(outs, fn, mode="any")
