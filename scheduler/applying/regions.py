"""The region wrappers ``scheduler.apply`` installs: one submodule call (or a run of
``nn.Sequential`` children) run under non-reentrant checkpoint.

The rules they follow are the NOTEs of ``scheduler.applying.modules``:
[ Checkpointing forward, not __call__ ], [ Recompute at the region's end ],
[ Stateful ops under recompute ], [ RNG state per region ], [ Caches under
recompute ], and [ Containers passed to a region ], [ Every tensor a region
receives is a checkpoint input ], [ Regions under torch.compile ] and [ Python
state written inside a region ] below; a region that keeps some op outputs runs under its selective-checkpoint policy (NOTE [ Selective checkpoint policies ] in
``scheduler.applying.selective``).

NOTE [ Regions under torch.compile ]
    While Dynamo traces a region's call (``torch.compiler.is_compiling()``),
    the region is torch's own checkpoint, which Dynamo turns into its
    checkpoint operator and traces into the graph (AOTAutograd then
    recomputes the region's ops in the backward): a plan adds no graph break,
    and ``fullgraph=True`` works wherever it works without the plan. For
    that, nothing Dynamo traces builds a bound method per call (the class's
    forward is called as a function, ``RegionForward._own_forward``, read
    off the class when the plan is applied: Dynamo cannot read an attribute
    of a class that ``torch._dynamo.allow_in_graph`` marked, as diffusers
    marks its ``Attention``, and ran every such region eagerly) and
    nothing inside the checkpoint's function changes Python state (Dynamo
    refuses side effects inside its checkpoint operator and would run the
    whole region eagerly): the ``gradient_checkpointing`` flags are set to
    their values before ``apply`` *outside* the checkpoint, for the region's
    module and every region module under it (``wrapper.marked``; NOTE [
    Visible to gradient-checkpointing checks ]), and put back after it.
    The eager devices stay out of the compiled call: no probe (NOTE [
    Recompute at the region's end ]: the partitioner places the recompute),
    no RNG watch (the generator state is always preserved; the compiled
    graph replays its random ops), no statistics snapshot: the traced
    forward updates BatchNorm's running statistics once, and the backward
    recomputes values, not buffer updates. A compiled planned step equals
    the compiled unplanned one (bitwise under ``aot_eager``, dropout
    included; within inductor's own tolerance under inductor). Kept ops are
    kept by torch's own selective checkpoint (NOTE [ Kept calls under
    torch.compile ] in ``scheduler.applying.selective``). Caches are dropped as in eager (NOTE [ Caches
    under recompute ]; a cache written inside the checkpoint is a side
    effect Dynamo refuses), from where the signature puts them, found once
    per class (:func:`_cache_slots`), but without the ``CacheDropped``
    warning (Dynamo cannot trace a warning without a break).

    When Dynamo cannot trace a region's forward (a graph break inside the
    user's module), it runs that checkpoint eagerly: then the region's
    function runs again in the backward, outside any compiled frame, and
    (as in eager, NOTE [ Stateful ops under recompute ]) the running
    statistics are put back after any run that autograd's backward makes
    (``torch._C._current_graph_task_id() != -1``), so they are still
    updated once; and each run sets the flags to their values before
    ``apply`` itself, since by the backward the caller has put them back
    (transformers 5.25's decoder layers, which checkpoint in their own
    forward when the flag is on, failed Llama's first compiled backward with
    "no attribute '_gradient_checkpointing_func'" when they ran eagerly).
    Such a region adds breaks of its own (a CNN whose two
    regions each hold a ``graph_break()``: 2 breaks, 1 without the plan).

NOTE [ Python state written inside a region ]
    Dynamo refuses, inside its checkpoint operator, any write to Python
    state made outside it ("HOP: Unsafe side effect"): eager checkpointing
    writes it again in the recompute, which a compiled graph cannot. Such
    writes are common in libraries' layers: transformers 5.25's attention
    layers set the kernels hub's routing context variable and put it back
    around their forward (``CompileableContextVar``, a plain attribute under
    compile), so each decoder-layer region broke the graph and ran eagerly
    (Llama, 2 layers: 7 breaks with our plan, 6 with
    ``gradient_checkpointing_enable()``, 0 without either), outside
    inductor's memory planning. The region's function is traced through
    Dynamo's own allowance for that (the one FSDP's pre- and post-forward
    get): the write happens once, in the forward, as in the compiled
    unplanned step, which never recomputes; a set-and-put-back pair leaves
    the state as before. Llama's planned step then compiles whole (0
    breaks), bitwise the compiled twin's under ``aot_eager``. A torch
    without the allowance traces as before (a break per such region).
    Under ``backend="eager"`` (no AOTAutograd) torch runs its checkpoint
    operator as an eager checkpoint of the captured graph, whose recompute
    writes BatchNorm's buffers again: autograd refuses it ("modified by an
    inplace operation"), as it does for ``torch.utils.checkpoint`` itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .caches import (CacheDropped, CacheReplay, CacheState, cache_slots, filled_in, slotted, without_cache,
                     without_cache_traced)
from .fast import hook_outputs, region_state, split_args
from .rng import RngWatch, calls_of, warn_random_region
from .selective import RegionPolicy, selective_contexts
from .visible import as_before, flags_as_before, restore_flag

__all__ = ["RegionForward", "SequentialRuns", "run_region", "CacheDropped"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- the region
class _Probe:
    """An empty tensor a region saves first; unpacking it runs the region's recompute.

    See NOTE [ Recompute at the region's end ].
    """

    __slots__ = ("node",)

    def __init__(self) -> None:
        # sin saves its input: a 0-byte leaf, packed by the checkpoint's hook.
        self.node = torch.empty(0, requires_grad=True).sin().grad_fn

    def unpack(self, _grad: Any = None) -> None:
        node, self.node = self.node, None
        if node is not None:
            node._saved_self  # noqa: B018  (the checkpoint's unpack hook recomputes the region)


def _running_stats(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """The buffers a region's forward updates: BatchNorm-style running statistics (training mode)."""
    out = []
    for top in modules:
        for m in top.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and m.training:
                out.extend(b for b in m.buffers(recurse=False) if b is not None)
    return out


def _is_fsdp(module: nn.Module) -> bool:
    return any(c.__name__ == "FSDPModule" for c in type(module).__mro__)


def run_region(fn: Callable[..., Any], args: tuple, kwargs: dict, *, modules: Sequence[nn.Module], path: str,
               stochastic: bool, counter: "RegionForward | SequentialRuns", policy: RegionPolicy | None = None,
               caches: Sequence[Any] = ()) -> Any:
    """``fn(*args, **kwargs)`` as one checkpoint region (the NOTEs of this module), under
    ``policy`` when the region keeps some op outputs (NOTE [ Selective checkpoint policies ]).

    ``stochastic`` is what the plan says of the region's randomness; whether the recompute replays
    the generator state is decided here, as it runs (NOTE [ RNG replay decided at run time ]). ``caches``: the
    filled key/value caches the call keeps, which its recompute sees as they were (NOTE [ Filled caches replayed ]
    in ``scheduler.applying.caches``)."""
    if torch.compiler.is_compiling():  # NOTE [ Regions under torch.compile ]
        return traced_region(fn, args, kwargs, modules=modules, policy=policy)
    # A stochastic module the region holds but does not call (torchvision's EfficientNet keeps a
    # StochasticDepth in blocks without a residual) draws nothing: the watch decides, and names the
    # stochastic modules that were called (NOTE [ RNG replay decided at run time ]).
    stats, drawing = region_state(modules, drawing=not stochastic)  # NOTE [ Region call overhead ]
    watched: list[RngWatch | None] = [None]  # a deterministic region's snapshot while it may be needed
    # NOTE [ Containers passed to a region ]: checkpoint keeps the arguments for the recompute by
    # reference; torchvision's DenseNet passes a list of features that it appends to after the call,
    # so the recompute concatenated more channels ("running_mean should contain 1024 elements not 832").
    # The recompute gets containers of its own (same tensors): every call rebuilds them.
    # NOTE [ Every tensor a region receives is a checkpoint input ]
    #     checkpoint saves its positional tensor arguments through the saved-tensor hooks that are active
    #     (an inner region's, inside its outer region: the outer's, which keeps nothing: NOTE [ Nested
    #     regions ] in solvers.model.nested); anything else the function holds (keyword arguments, tensors in
    #     containers) stays referenced by its closure from the forward to the region's backward. An inner
    #     region that takes its input by keyword (transformers' attention: ``hidden_states=``) therefore kept
    #     the forward copy through the whole step, which the plan does not count (32 KiB over on a block
    #     whose MLP took its input by keyword). So every tensor leaf of the arguments is passed to checkpoint
    #     as a positional input, and the call is rebuilt from them in both runs; the closure keeps only the
    #     non-tensor leaves and the structure.
    live = list(caches)  # the filled caches, held for the forward's call only (NOTE [ Filled caches replayed ])
    replays: list[CacheReplay] = []
    if caches:
        args, kwargs = slotted(args, kwargs, caches)
    tensors, rebuild = split_args(args, kwargs)
    del args, kwargs, caches
    probes: list[_Probe | None] = []
    use_probe = not any(_is_fsdp(m) for m in modules)
    calls = 0
    options: dict[str, Any] = {}
    if policy is not None:
        options["context_fn"] = selective_contexts(policy, stats)  # it snapshots the statistics itself
    quiet = policy.pause if policy is not None else contextlib.nullcontext

    def run(*values: Any) -> Any:
        nonlocal calls
        calls += 1
        a, kw = rebuild(values)
        with quiet():
            probe = _Probe() if use_probe else None  # the region's first saved tensor, in both runs
        if calls == 1:
            probes.append(probe)
            if not live:
                return first(a, kw, values)
            a, kw = filled_in(a, kw, live)
            before = [CacheState([c]) for c in live]
            try:
                return first(a, kw, values)
            finally:
                replays.extend(CacheReplay(c, b, CacheState([c])) for c, b in zip(live, before))
                live.clear()
        counter.recomputes += 1
        if replays:
            a, kw = filled_in(a, kw, [r.build() for r in replays])
        return again(a, kw)

    def first(a: tuple, kw: dict, values: tuple) -> Any:
        if stochastic:
            return fn(*a, **kw)
        watch = RngWatch(values)
        with calls_of(drawing) if drawing else contextlib.nullcontext([]) as called:
            result = fn(*a, **kw)
        if watch.drew():
            watched[0] = watch
            counter.saw_random(path, f"{called[0]} called in training mode" if called
                               else "a generator advanced during its forward")
        return result

    def again(a: tuple, kw: dict) -> Any:
        replay = watched[0].replay() if watched[0] is not None else contextlib.nullcontext()
        if not stats or policy is not None:
            with replay:
                return fn(*a, **kw)
        saved = [b.detach().clone() for b in stats]
        try:
            with replay:
                return fn(*a, **kw)
        finally:
            with torch.no_grad():
                for b, s in zip(stats, saved):
                    b.copy_(s)

    out = checkpoint(run, *tensors, use_reentrant=False, preserve_rng_state=stochastic, **options)
    probe = probes.pop() if probes else None  # the checkpoint holds run(): the probe must not stay there
    if probe is not None:
        hook_outputs(out, probe.unpack)
    return out


def traced_region(fn: Callable[..., Any], args: tuple, kwargs: dict, *, modules: Sequence[nn.Module],
                  policy: RegionPolicy | None = None) -> Any:
    """``fn(*args, **kwargs)`` as one region while Dynamo traces (NOTE [ Regions under torch.compile ]), its
    kept calls saved by torch's selective checkpoint (NOTE [ Kept calls under torch.compile ])."""
    body = functools.partial(_traced_body, fn, tuple(modules))
    if policy is not None:
        kwargs = {**kwargs, "context_fn": policy.compiled}
    return checkpoint(body, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


def _traced_body(fn: Callable[..., Any], modules: tuple[nn.Module, ...], *args: Any, **kwargs: Any) -> Any:
    if torch.compiler.is_compiling():  # traced into the graph: the caller set the flags around it
        return _side_effects_once(fn, *args, **kwargs)  # NOTE [ Python state written inside a region ]
    # Dynamo ran this region eagerly: its forward, or autograd's recompute in the backward, where the caller's
    # flags are put back already (transformers' layers that checkpoint in their own forward read them there)
    changed = flags_as_before(modules)
    try:
        if torch._C._current_graph_task_id() == -1:
            return fn(*args, **kwargs)
        stats = _running_stats(modules)  # a recompute: BatchNorm's statistics are updated once
        saved = [b.detach().clone() for b in stats]
        try:
            return fn(*args, **kwargs)
        finally:
            with torch.no_grad():
                for b, s in zip(stats, saved):
                    b.copy_(s)
    finally:
        _put_back(changed)


def _side_effects_once(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` while Dynamo traces a region: Python state it writes is written once, by the
    forward (NOTE [ Python state written inside a region ]), through Dynamo's own allowance (the one FSDP's
    pre- and post-forward get). A torch without it traces as before."""
    allow = getattr(torch._dynamo.utils, "_disable_side_effect_safety_checks_for_current_subtracer", None)
    if allow is None:
        return fn(*args, **kwargs)
    return allow(fn, *args, **kwargs)


def _put_back(changed: list) -> None:
    for module, present, value in changed:
        restore_flag(module, present, value)


class RegionForward:
    """Installed as ``module.forward``: the module's call is one checkpoint region.

    Attributes:
        module: the submodule.
        path: its path in the model (the plan's name for the region).
        stochastic: preserve and replay the RNG state (NOTE [ RNG state per region ]); set
            when a region the plan calls deterministic is found drawing random numbers
            (NOTE [ RNG replay decided at run time ]).
        policy: the region's selective-checkpoint policy when the plan keeps
            some of its op outputs, else None (NOTE [ Selective checkpoint policies ]).
        previous: an instance-level ``forward`` that was there before (else None:
            the class's forward).
        recomputes: how many recomputes ran (tests and ``verify`` read it).
    """

    def __init__(self, module: nn.Module, path: str, *, stochastic: bool, previous: Any = None,
                 save_ops: Sequence[tuple[str, int]] = (), save_op_calls: Sequence[tuple[str, int]] = ()) -> None:
        self.module = module
        self.path = path
        self.stochastic = stochastic
        self.previous = previous
        self.recomputes = 0
        self.policy = RegionPolicy(path, save_ops, save_op_calls) if save_ops else None
        self.marked: tuple[nn.Module, ...] = (module,)  # NOTE [ Regions under torch.compile ]; set by apply
        self.cache_slots = cache_slots(type(module))
        self.forward_fn = type(module).forward  # read here: Dynamo cannot read it off a class allowed in its graph

    def _own_forward(self, *args: Any, **kwargs: Any) -> Any:
        """The class's forward, called as a function (NOTE [ Regions under torch.compile ])."""
        return self.forward_fn(self.module, *args, **kwargs)

    def original(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        return self._own_forward

    def saw_random(self, path: str, why: str) -> None:
        """The region draws random numbers: replay from now on (NOTE [ RNG replay decided at run time ])."""
        self.stochastic = True
        warn_random_region(path, why)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fwd = self.original()
        if not torch.is_grad_enabled():
            return fwd(*args, **kwargs)
        if torch.compiler.is_compiling():  # NOTE [ Regions under torch.compile ]
            changed = flags_as_before(self.marked)
            args, kwargs = without_cache_traced(self.module, self.cache_slots, args, kwargs)
            out = traced_region(fwd, args, kwargs, modules=(self.module,), policy=self.policy)
            _put_back(changed)
            return out
        fwd = as_before(self.module, fwd)  # NOTE [ Visible to gradient-checkpointing checks ]
        given = args, kwargs
        args, kwargs, kept = without_cache(self.module, args, kwargs, self.path)
        if self.policy is not None:  # for its warning (NOTE [ Kept calls that do not come ])
            self.policy.cache_dropped = args is not given[0] or kwargs is not given[1]
        return run_region(fwd, args, kwargs, modules=(self.module,), path=self.path, stochastic=self.stochastic,
                          counter=self, policy=self.policy, caches=kept)

    def __repr__(self) -> str:
        return f"RegionForward({self.path!r})"


class SequentialRuns:
    """Installed as an ``nn.Sequential``'s ``forward``: runs of its children are checkpoint regions.

    The children run in order, as ``nn.Sequential.forward`` does; each run
    ``i..j`` (inclusive) is one region, as ``checkpoint_sequential`` makes them.
    ``save_ops`` maps a run's path to the calls its policy keeps and the traced
    calls of their overloads (``Plan.save_ops``, ``Plan.save_op_calls``).
    """

    def __init__(self, module: nn.Sequential, runs: Sequence[tuple[int, int, str, bool]], *,
                 previous: Any = None, save_ops: dict[str, tuple[Sequence[tuple[str, int]], Sequence[tuple[str, int]]]]
                 | None = None) -> None:
        self.module = module
        self.runs = tuple(sorted(runs))
        self.previous = previous
        self.recomputes = 0
        self.policies = {path: RegionPolicy(path, ops, calls) for path, (ops, calls) in (save_ops or {}).items() if ops}
        self.random: set[str] = set()  # runs found drawing random numbers (NOTE [ RNG replay decided at run time ])
        self.marked: tuple[nn.Module, ...] = ()  # region modules in its children (NOTE [ Regions under torch.compile ])

    @property
    def path(self) -> str:
        return ", ".join(r[2] for r in self.runs)

    def saw_random(self, path: str, why: str) -> None:
        """Run ``path`` draws random numbers: replay from now on (NOTE [ RNG replay decided at run time ])."""
        self.random.add(path)
        warn_random_region(path, why)

    def _own_forward(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.module).forward(self.module, *args, **kwargs)

    def original(self) -> Callable[..., Any]:
        if self.previous is not None:
            return self.previous
        return self._own_forward

    def __call__(self, input: Any) -> Any:  # noqa: A002  (nn.Sequential.forward's name)
        if not torch.is_grad_enabled():
            return self.original()(input)
        changed = flags_as_before(self.marked) if torch.compiler.is_compiling() else []
        children = list(self.module)
        starts = {i: (j, stochastic, path) for i, j, path, stochastic in self.runs}
        k = 0
        while k < len(children):
            if k in starts:
                j, stochastic, path = starts[k]
                run = functools.partial(_run_children, tuple(children[k:j + 1]))
                input = run_region(run, (input,), {}, modules=children[k:j + 1], path=path,
                                   stochastic=stochastic or path in self.random, counter=self,
                                   policy=self.policies.get(path))
                k = j + 1
            else:
                input = children[k](input)
                k += 1
        _put_back(changed)
        return input

    def __repr__(self) -> str:
        return f"SequentialRuns({self.path!r})"


def _run_children(children: Sequence[nn.Module], x: Any) -> Any:
    for child in children:
        x = child(x)
    return x
