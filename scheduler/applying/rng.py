"""Whether a region's recompute must replay the generator state, decided as the region runs.

NOTE [ RNG replay decided at run time ]
    A plan says per region whether its traced nodes drew random numbers
    (``Plan.stochastic``), and a region that did not skips
    ``preserve_rng_state``: it stores no generator state (NOTE [ RNG state
    per region ] in ``solvers.model.terms``). The trace is of one call in one mode,
    the training run is another: a model traced in eval mode (what
    ``from_pretrained`` returns) or with dropout 0, then trained with dropout
    on, or a plan whose flags were edited, would recompute such a region
    with other random numbers than its forward drew, and the gradients
    would be wrong without a word (GPT-2 traced after ``eval()``, trained
    after ``train()``: max error 0.082 against a largest gradient of 0.205).
    So the trace's flag is a memory prediction, not the decision. At each
    call of a region the plan calls deterministic:

    * the generators it could draw from are watched (:class:`RngWatch`):
      the CPU generator's state is cloned into a generator object (host
      heap, no tensor: neither the allocator nor the storage count sees
      it), the accelerator generators of the region's inputs are read
      (host tensors); after the forward, the CPU clone and a fresh clone
      each draw one 63-bit number (into a buffer of the watch's own, with
      the dispatch modes of the region paused, so that no storage is
      created and no selective-checkpoint policy counts the call) and the
      accelerator states are compared. A region that drew replays this
      step from the snapshot (under ``fork_rng``, as checkpoint does), is
      switched to checkpoint's replay for every later call, and a warning
      says so once, naming the stochastic modules (a dropout with
      ``p > 0``, ``RReLU``, a stochastic-depth / drop-path module with a
      positive rate, in training mode: :func:`drawing_modules`) that were
      called in that forward (:func:`calls_of`). A region that drew
      nothing drops the snapshot.
    * a stochastic module the region holds decides nothing by itself: only
      a call draws. torchvision's EfficientNet-B0 holds a ``StochasticDepth``
      in each block and calls it only in blocks with a residual; deciding
      by the modules present made three regions without a residual replay,
      each storing the CPU generator's 5,056 B that their plan rightly did
      not count (14,774 B over the budget), with a warning that told a user
      who had traced in training mode to trace in training mode.

    Gradients are therefore those of the step without checkpointing on the
    very first step. What is not exact then is the memory: a region that
    replays stores ``rng_state_bytes`` the plan did not count for it, and
    a model traced in eval mode has no dropout masks in its graph; the
    warning says why the trace saw no draw there (a mode, a rate of 0, a
    branch not taken, an edited plan) and to trace the step as it trains. Under ``torch.compile`` the region always preserves the state:
    nothing can be watched in a compiled graph.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import warnings
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch._ops import _len_torch_dispatch_stack_pre_dispatch
from torch.utils.checkpoint import (DefaultDeviceType, _get_device_module, _infer_device_type, get_device_states,
                                    set_device_states)

__all__ = ["random_modules", "drawing_modules", "draws", "calls_of", "RngWatch", "RandomRegionWarning", "warn_random_region"]

log = logging.getLogger(__name__)

#: Attribute names under which stochastic-depth / drop-path modules keep their rate (timm ``DropPath.drop_prob``,
#: torchvision ``StochasticDepth.p``).
_RATE_ATTRS = ("drop_prob", "p", "drop_rate", "drop_path_rate")
_DROP_NAMES = ("droppath", "stochasticdepth", "dropblock")


class RandomRegionWarning(UserWarning):
    """A region the plan calls deterministic draws random numbers (NOTE [ RNG replay decided at run time ])."""


@functools.lru_cache(maxsize=None)
def _kind(cls: type) -> str:
    """What kind of random module a class is, found once per class: "dropout", "rrelu", "named" (a
    stochastic-depth / drop-path name) or ""."""
    if issubclass(cls, nn.modules.dropout._DropoutNd):
        return "dropout"
    if issubclass(cls, nn.RReLU):
        return "rrelu"
    name = cls.__name__.lower().replace("_", "")
    return "named" if any(d in name for d in _DROP_NAMES) else ""


def draws(m: nn.Module) -> bool:
    """Whether calling ``m`` now draws random numbers (training mode, a positive rate)."""
    if not m.training:
        return False
    kind = _kind(type(m))
    if not kind:
        return False
    if kind == "dropout":
        return float(m.p) > 0
    if kind == "rrelu":
        return True
    rates = [getattr(m, a) for a in _RATE_ATTRS if isinstance(getattr(m, a, None), (int, float))]
    return not rates or any(float(r) > 0 for r in rates)


def drawing_modules(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """The modules under ``modules`` that draw random numbers when called now (training mode, rate > 0)."""
    return [m for top in modules for m in top.modules() if draws(m)]


def random_modules(modules: Iterable[nn.Module]) -> list[str]:
    """Class names of :func:`drawing_modules` (held, whether or not a forward calls them)."""
    return [type(m).__name__ for m in drawing_modules(modules)]


@contextlib.contextmanager
def calls_of(modules: Sequence[nn.Module]) -> Iterator[list[str]]:
    """Within the block, the class names of those of ``modules`` that are called, in call order (forward
    pre-hooks, removed on exit)."""
    called: list[str] = []
    handles = [m.register_forward_pre_hook(lambda mod, _args: called.append(type(mod).__name__))
               for m in modules]
    try:
        yield called
    finally:
        for h in handles:
            h.remove()


class RngWatch:
    """The generators a region may draw from, captured before its forward (NOTE [ RNG replay decided at run time ]).

    Args:
        args: the region's inputs (their accelerator, if any, is watched besides the CPU).
    """

    def __init__(self, args: Sequence[Any]) -> None:
        self.cpu = torch.default_generator.clone_state()
        self.devices: list[int] = []
        self.states: list[torch.Tensor] = []
        if all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in args):
            # what checkpoint's helpers return for CPU inputs, without their tree walks (NOTE [ Region call overhead ])
            self.device_type = DefaultDeviceType.get_device_type()
            return
        self.device_type = _infer_device_type(*args)
        if self.device_type != "cpu":
            self.devices, self.states = get_device_states(*args)

    def drew(self) -> bool:
        """Whether a generator advanced since the snapshot."""
        modes = torch._C._len_torch_dispatch_stack() or _len_torch_dispatch_stack_pre_dispatch()
        with _disable_current_modes() if modes else contextlib.nullcontext():
            if _next(self.cpu.clone_state()) != _next(torch.default_generator.clone_state()):
                return True
            if self.devices:
                module = _get_device_module(self.device_type)
                return any(not torch.equal(s, module.get_rng_state(d)) for d, s in zip(self.devices, self.states))
        return False

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run the recompute from the snapshot, leaving the generators as they were (as checkpoint does)."""
        with torch.random.fork_rng(devices=self.devices, device_type=self.device_type):
            torch.default_generator.set_state(self.cpu.get_state())
            if self.devices:
                set_device_states(self.devices, self.states, device_type=self.device_type)
            yield


_local = threading.local()
_local.buf = torch.empty((), dtype=torch.int64)  # the importing thread's, made before any step is measured


def _next(gen: torch.Generator) -> int:
    """One draw of ``gen``, into a buffer made once per thread (no storage is created per call)."""
    out = getattr(_local, "buf", None)
    if out is None:
        out = _local.buf = torch.empty((), dtype=torch.int64)
    torch.randint(1 << 62, (), generator=gen, out=out)
    return int(out)


def warn_random_region(path: str, why: str) -> None:
    """Say once per region that it replays the generator state although its plan did not count it."""
    msg = (f"checkpoint region {path!r} drew random numbers ({why}) although no random op ran in it in the "
           "traced step, so its plan counts neither the generator state its recompute now stores and replays nor "
           "random masks: gradients stay exact, the step's peak can exceed the prediction. The traced step differed "
           "from this one (modules in eval mode with mode='as-is', a dropout or drop-path rate of 0, a branch not "
           "taken, or an edited plan): trace the step as it trains and solve again")
    log.info(msg)
    warnings.warn(msg, RandomRegionWarning, stacklevel=4)
