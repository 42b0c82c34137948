"""``scheduler.solve_compiled``: the plan for a peak measured under ``torch.compile``, the fastest measured.

The search is :class:`scheduler.sizing.compiled.Search` (NOTE [ Compile-aware budget ]); each plan is measured
by :func:`scheduler.measuring.compiled.compiled_step` (a copy of the model, planned, compiled, its peak by the
allocator and its step timed). ``scheduler.api.solve_compiled`` passes its ``solve`` in.

May import ``graphs``, ``solvers``, ``scheduler.sizing``, the tracer and ``scheduler.measuring.compiled``
(the layer of ``scheduler.sizing.fit``: ``tests/test_layers.py``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .sizing.compiled import (KERNEL_DROPS, Fit, Point, Search, best_fit, family_plans, graph_of, inductor_costs,
                              kernel_plans, plan_key, sweep_plans, unfused_twin)

__all__ = ["solve_compiled", "least_plan", "coarse_plan"]


def solve_compiled(model: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *, budget: Any,
                   solve: Callable[..., Any], loss: Any = None, graph: Any = None, solver: str = "ilp", backend: Any = "inductor",
                   compile_options: dict[str, Any] | None = None, loop: str = "held", compiles: int = 4,
                   solves: int = 8, families: int = 3, sweep: int = 6, kernels: int = len(KERNEL_DROPS), timed: int = 5,
                   bound: bool = True, **options: Any) -> Fit:
    """A plan whose training step, compiled with ``torch.compile``, peaks at or under ``budget`` by the allocator,
    the fastest measured of those that do.

    ``solve``'s prediction is eager's; inductor fuses and partitions, and the
    same plan measures another peak compiled (NOTE [ Compile-aware budget ]).
    So each candidate is applied onto a copy of ``model``, compiled, run,
    measured and timed (the median of ``timed`` steps), and the eager budget
    searched until a plan measures at or under ``budget``: a few compiles
    (``compiles`` at most, beside the unplanned step's), ``solves`` solves at
    most; with a ``chunks=`` menu that has a count above 1 the eager budget is
    searched so again without chunks (each search with its own ``compiles``
    and ``solves``, a plan compiled once). Plans solved with the recompute
    priced as inductor runs it (:func:`inductor_costs`: fused calls almost
    free) at ``sweep`` eager budgets from the floor up, the head whole, are
    measured too (:func:`sweep_plans`), and so are the model's ``families`` largest
    families of repeated module calls (:func:`module_families`: its blocks,
    their MLPs...) are measured as plans too, each call a region, and so
    are ``kernels`` plans that keep what compile's partitioner keeps
    (:func:`kernel_plans`: the outermost calls as regions, their GEMMs,
    convolutions, attention and lookups kept, less the cheapest to
    recompute per byte; ResNet-18's fit 0.3 of its compiled peak). Where the
    least-peak plan measures over, a few more plans are compiled once each:
    the least-peak plan at each count of a ``chunks=`` menu alone, the
    least-peak plan with the head unfused where the menu fuses it, and a
    coarse plan (every child module a region). Of every plan measured at or
    under ``budget``, the fastest compiled step is kept.

    Args:
        model, args, kwargs, loss, loop: the model and one training step, as
            ``scheduler.trace`` takes them (``model`` is not changed).
        budget: the compiled step's peak: ``"6GiB"``, bytes, or a fraction in
            (0, 1] of the compiled unplanned step's measured peak.
        solve: ``scheduler.solve`` (``(graph, budget, solver, **options) -> Plan``).
        graph: the model's trace (traced here when None).
        solver, **options: as for ``scheduler.solve`` (``chunks=``, ``time_limit_s=``...).
        backend, compile_options: ``torch.compile``'s backend and its other
            keyword arguments (``mode``, ``fullgraph``, ``dynamic``...).
        families: how many families of module calls to measure as plans (0: none).
        sweep: how many plans solved at inductor's costs to measure (0: none).
        kernels: how many plans of :func:`kernel_plans` to measure (0: none; at most ``len(KERNEL_DROPS)``).
        timed: compiled steps timed per plan (0: none; then the least predicted recompute is the fastest).
        bound: read the plan kept's compiled peak bound (``.bound``; a fake compile, seconds).

    Returns:
        A :class:`Fit`: ``.plan`` (apply it, then compile the model as
        measured), ``.measured`` and ``.predicted`` bytes, ``.point.time_s``
        (its compiled step, seconds), ``.reached`` (False: nothing measured at
        or under the budget; ``.plan`` is then the lowest measured), ``.tries``
        (every plan measured), ``.bound`` (a ``CompiledBound``: a bound on
        the plan's compiled peak read from the graphs inductor's partitioner
        makes, on fake tensors; NOTE [ Compiled peak bound ]; None with
        another ``backend`` than inductor).
    """
    import solvers
    from solvers import Plan
    from solvers.errors import SolverOptionError

    from .measuring.compiled import compiled_step
    from .measuring.inductor import compiled_bound
    from .sizing.budget import parse_size

    if compiles < 1 or solves < 1 or min(families, sweep, timed, kernels) < 0:
        raise SolverOptionError(f"compiles={compiles}, solves={solves}: each must be at least 1; families={families}"
                                f", sweep={sweep}, kernels={kernels}, timed={timed}: each at least 0")
    kwargs = dict(kwargs or {})
    if graph is None:
        from .tracing.tracer import trace

        graph = trace(model, tuple(args), kwargs, loss=loss)
    graph = graph.with_loop(loop)

    def measure(plan: Any) -> tuple[int, float | None]:
        return compiled_step(model, plan, args, kwargs, loss, backend=backend, options=compile_options, loop=loop,
                             timed=timed)

    def bounded(plan: Any) -> Any:  # inductor's partition read on fake tensors; another backend partitions otherwise
        if not bound or backend != "inductor":
            return None
        return compiled_bound(model, plan, args, kwargs, loss, loop=loop, graph=graph)

    plain, plain_s = measure(None)
    target = _compiled_target(budget, plain, parse_size)
    predicted = solvers.simulate(graph, None).peak_bytes
    if plain <= target:  # the unplanned step fits: no plan is the fastest
        none = Plan.from_regions(graph, [])
        point = Point(budget=predicted, predicted=predicted, measured=plain, key=plan_key(none), plan=none,
                      time_s=plain_s)
        return Fit(target=target, point=point, reached=True, tries=[point], bound=bounded(None))

    # NOTE [ Compile-aware budget ]: where the floor measures over, so does the floor at each head chunk count,
    # and the floor with the head unfused (solved, predicted and costed on that twin of the graph)
    menu = tuple(dict.fromkeys(options.get("chunks") or ()))
    twin = unfused_twin(graph, menu)

    def simulated(plan: Any) -> Any:
        return solvers.simulate(graph_of(plan, graph, twin), plan, record=False)

    def cost(plan: Any) -> float:
        sim = simulated(plan)
        return (sim.recompute_time_s or 0.0) + sum((sim.overhead_s or {}).values())

    def least(g: Any, opts: dict[str, Any]) -> Callable[[], Any]:
        return lambda: least_plan(solve, g, solver, opts)

    floors = [("floor plan", least(graph, {**options, "chunks": (k,)})) for k in menu] if len(menu) > 1 else []
    if twin is not None:  # at each count alone: a region may hold a part of an unfused head's chunk
        floors += [("floor plan, head unfused", least(twin, {**options, "chunks": (k,)})) for k in menu if k > 1]
    search = Search(lambda b: solve(graph, b, solver, **options), measure, lambda plan: simulated(plan).peak_bytes,
                    key=plan_key, cost=cost, plain=(predicted, plain),
                    others=floors + [("coarse plan", lambda: coarse_plan(graph))],
                    candidates=(family_plans(graph, families) if families else [])
                    + kernel_plans(graph, KERNEL_DROPS[:kernels])
                    + sweep_plans(lambda g, b: solve(g, b, solver, **{**options, "chunks": None}), inductor_costs(graph),
                                  predicted, sweep))
    fits = [search.fit(target, compiles=compiles, solves=solves)]
    if any(k > 1 for k in menu):  # and without chunks: inductor may measure regions alone under a chunked head
        whole = {**options, "chunks": None}
        fits.append(Search(lambda b: solve(graph, b, solver, **whole), measure,
                           lambda plan: simulated(plan).peak_bytes, key=plan_key, cost=cost, plain=(predicted, plain),
                           measured=search.measured).fit(target, compiles=compiles, solves=solves))
    kept = best_fit(fits)
    if kept.point is not None:
        kept.bound = bounded(kept.plan)
    return kept


def least_plan(solve: Callable[..., Any], graph: Any, solver: str, options: dict[str, Any]) -> Any:
    """The least-peak plan of ``solver`` with ``options`` (``solve`` is ``scheduler.solve``)."""
    from solvers.errors import InfeasibleBudget

    try:
        return solve(graph, 1, solver, **options)
    except InfeasibleBudget as exc:
        return solve(graph, exc.min_feasible_bytes, solver, **options)


def coarse_plan(graph: Any) -> Any:
    """Every outermost module call of the graph (the model's children, or a ``ModuleList``'s blocks) its own
    region: a plan no solver of ours picks, measured when the least-peak plan is over a compiled budget (NOTE
    [ Compile-aware budget ]: inductor's channels-last copies are made inside the regions it recomputes)."""
    from solvers import Plan

    spans = sorted(((sp.first, sp.last) for sp in graph.spans if sp.module), key=lambda ab: (ab[0], -ab[1]))
    regions: list[tuple[int, int]] = []
    for a, b in spans:
        if not regions or a > regions[-1][1]:
            regions.append((a, b))
    return Plan.from_regions(graph, regions)


def _compiled_target(budget: Any, plain: int, parse_size: Any) -> int:
    """Bytes from a size, or a fraction of the compiled unplanned step's measured peak."""
    from .sizing.budget import BudgetError

    if isinstance(budget, bool):
        raise BudgetError(f"budget={budget!r}: give a size such as '6GiB' or a fraction in (0, 1]")
    if isinstance(budget, int):
        return budget
    try:
        fraction = float(budget)
    except (TypeError, ValueError):
        return parse_size(str(budget))
    if not 0 < fraction <= 1:
        raise BudgetError(f"budget={budget!r}: a fraction is in (0, 1] (of the compiled unplanned step's peak, "
                          f"{plain / 2**20:.2f} MiB here); give a size such as '6GiB' otherwise")
    return int(fraction * plain)
