"""Selective recompute on the user's module: one checkpoint policy per region.

NOTE [ Selective checkpoint policies ]
    A plan that keeps some nodes' outputs inside a region (``Plan.saved``)
    names them for the applier as ``Plan.save_ops``: per region, pairs
    ``(overload, k)``, "the ``k``-th call (from 0) of this ATen overload in
    the region's forward" (NOTE [ Which op a policy keeps ] in
    ``scheduler.tracing.recorder`` says how the tracer finds them). Such a
    region runs under ``torch.utils.checkpoint.checkpoint(...,
    use_reentrant=False, context_fn=...)`` with the contexts of
    ``create_selective_checkpoint_contexts`` and a :class:`RegionPolicy`:

    * in the forward the policy counts the calls of each overload and
      answers ``CheckpointPolicy.MUST_SAVE`` for the listed ones and
      ``PREFER_RECOMPUTE`` for every other; the checkpoint's caching mode
      keeps what a saved call returned, and its recompute returns that
      instead of running the call again (what ``solvers.model.simulate`` models
      as NOTE [ Selective recompute ]);
    * the policy counts as the checkpoint's own modes do (``detach`` and the
      other ``SAC_IGNORED_OPS`` are never shown to it), and not the calls of
      our own devices: the recompute probe (NOTE [ Recompute at the
      region's end ]) is made while the policy is paused, and the BatchNorm
      snapshot (NOTE [ Stateful ops under recompute ]) is taken and put back
      outside the checkpoint's recompute mode, which would otherwise look the
      ``clone`` up among the forward's calls and fail;
    * when the region's forward ends, every listed call must have happened,
      and each listed overload must have been called as many times as in
      the trace (``Plan.save_op_calls``, when the plan carries it). A count
      that differs (another torch whose ops decompose differently, a forward
      that takes another branch at this shape) raises
      :class:`SaveOpsMismatch`, naming the region and the call, instead of a
      plan that silently keeps other tensors than the ones it was costed
      for. Gradients would be right either way (a cached call returns what
      the forward computed); the memory would not be the predicted one.
      Overloads the plan keeps no call of are not compared: eager may run
      calls the trace does not have (transformers' GPT-2 block builds its
      causal mask with ``ones``/``tril`` in eager only).

    Regions without listed calls run exactly as before (no ``context_fn``).
    Under ``torch.compile`` the regions are plain checkpoints: the policy
    counts Python state that Dynamo does not trace.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from typing import Any, Iterable, Sequence

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from graphs import CkptError

__all__ = ["RegionPolicy", "SaveOpsMismatch", "selective_contexts"]


class SaveOpsMismatch(CkptError, RuntimeError):
    """A region's forward did not make the ATen calls its plan keeps (the message names the region and call)."""


class RegionPolicy:
    """The selective-checkpoint policy of one region (NOTE [ Selective checkpoint policies ]).

    Args:
        region: the region's module path (for messages).
        save_ops: ``(overload, occurrence)`` pairs, as ``Plan.save_ops`` lists them.
        calls: ``(overload, traced calls)`` pairs, as ``Plan.save_op_calls`` lists
            them; empty: only check that the listed calls happen.

    Attributes:
        counts: calls of each overload seen in the running forward.
        saved: ``(overload, occurrence)`` pairs saved in the running forward.
    """

    def __init__(self, region: str, save_ops: Iterable[Sequence[Any]], calls: Iterable[Sequence[Any]] = ()) -> None:
        self.region = region
        self.save_ops = tuple((str(op), int(k)) for op, k in save_ops)
        self.calls = tuple((str(op), int(n)) for op, n in calls)
        self._wanted = frozenset(self.save_ops)
        self._names: dict[Any, str] = {}
        self.paused = 0
        self.reset()

    def __getstate__(self) -> dict[str, Any]:  # pickle / deepcopy: the counts of no running forward
        return {"region": self.region, "save_ops": self.save_ops, "calls": self.calls}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["region"], state["save_ops"], state.get("calls", ()))

    def reset(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.saved: list[tuple[str, int]] = []

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if self.paused:
            return CheckpointPolicy.PREFER_RECOMPUTE
        name = self._names.get(func)
        if name is None:
            name = self._names.setdefault(func, str(func))
        k = self.counts[name]
        self.counts[name] = k + 1
        if (name, k) in self._wanted:
            self.saved.append((name, k))
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    @contextlib.contextmanager
    def pause(self):  # noqa: ANN201
        """Calls made inside are not counted (our own devices: the recompute probe)."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def check(self) -> None:
        """Raise :class:`SaveOpsMismatch` when a listed call did not happen in the forward that just
        ended, or a listed overload was called another number of times than traced."""
        for op, n in self.calls:
            seen = self.counts.get(op, 0)
            if seen != n:
                raise SaveOpsMismatch(
                    f"region {self.region!r}: the traced region calls {op} {n} time(s) and the plan keeps some of "
                    f"those calls, but the region's forward called it {seen} time(s), so the kept calls would be "
                    "other tensors than planned. The module runs other ATen ops than the traced graph recorded "
                    "(another torch version or device, another branch at this shape); trace and solve again on "
                    "this setup, or solve with -S selective=false for a plan without kept ops")
        for op, k in self.save_ops:
            seen = self.counts.get(op, 0)
            if seen <= k:
                raise SaveOpsMismatch(
                    f"region {self.region!r}: the plan keeps call {k} (counting from 0) of {op}, but the region's "
                    f"forward called {op} {seen} time(s). The module runs other ATen ops than the traced graph "
                    "recorded (another torch version or device, another branch at this shape); trace and solve "
                    "again on this setup, or solve with -S selective=false for a plan without kept ops")

    def __repr__(self) -> str:
        return f"RegionPolicy({self.region!r}, {list(self.save_ops)})"


class _Forward:
    """The forward context: the caching mode, then the policy's check when the forward returns."""

    def __init__(self, policy: RegionPolicy, mode: Any) -> None:
        self.policy, self.mode = policy, mode

    def __enter__(self) -> None:
        self.policy.reset()
        self.mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)
        if exc[0] is None:
            self.policy.check()


class _Recompute:
    """The recompute context: BatchNorm snapshot outside the cached mode (NOTE [ Selective checkpoint policies ])."""

    def __init__(self, mode: Any, stats: Sequence[torch.Tensor]) -> None:
        self.mode, self.stats = mode, stats
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
    caching, cached = create_selective_checkpoint_contexts(policy)
    return _Forward(policy, caching), _Recompute(cached, stats)


def selective_contexts(policy: RegionPolicy, stats: Sequence[torch.Tensor]) -> Any:
    """The ``context_fn`` for ``checkpoint`` running a region under ``policy``; ``stats`` are
    the running statistics to snapshot around its recompute (NOTE [ Stateful ops under recompute ])."""
    return functools.partial(_contexts, policy, tuple(stats))
