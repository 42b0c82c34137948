"""The public verbs: ``trace``, ``solve``, ``simulate``, ``apply``, ``remove``, ``verify``, ``fit``, ``compare``.

``scheduler`` re-exports them. ``solve`` and ``simulate`` are written here (the
solvers and the cost model, with budgets people write and plans checked
against their graph); ``fit`` is :func:`scheduler.sizing.fit.fit`. The verbs
that need torch are loaded on first use, so ``import scheduler`` imports
neither torch, OR-Tools, matplotlib nor transformers:

* ``trace``: :func:`scheduler.tracing.tracer.trace`, a model and example inputs -> a cost graph;
* ``apply`` / ``remove``: :func:`scheduler.applying.apply`, a plan onto the user's module, and its undo;
* ``verify``: :func:`scheduler.measuring.verification.verify`, real steps with and without a plan;
* ``compare``: :func:`scheduler.comparing.run.compare`, our plans beside the tools people use today;
* ``solve_compiled``: :func:`scheduler.compiled.solve_compiled` with :func:`solve`, a plan whose step under
  ``torch.compile`` measures at or under a budget, and the fastest of those measured.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable, Sequence

import solvers
from graphs import Graph
from solvers import InfeasibleBudget, Plan, Simulation, SolverOptionError
from solvers.menus.chunks import solve_chunked
from graphs.reading import checking
from solvers.deadline import READ_OUT_S, Deadline, spent_before
from solvers.menus.nested import solve_nested

from .sizing.budget import BudgetSpec
from .sizing.memory import ReserveSpec, step_budget_bytes
from .sizing.floor import explain_floor
from .sizing.fit import fit

__all__ = ["trace", "solve", "simulate", "apply", "remove", "verify", "fit", "compare", "solve_compiled"]

#: The verbs that import torch, served on first use: name -> "module:attribute".
LAZY = {
    "trace": "scheduler.tracing.tracer:trace",
    "apply": "scheduler.applying:apply",
    "remove": "scheduler.applying:remove",
    "verify": "scheduler.measuring.verification:verify",
    "compare": "scheduler.comparing.run:compare",
}


#: The clock a chunked or nested solve's shared time limit reads (tests inject their own).
_clock = time.perf_counter


def __getattr__(name: str) -> Any:
    target = LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'scheduler.api' has no attribute {name!r}")
    mod, attr = target.split(":")
    if name == "trace":  # NOTE [ Recompute timed in the step ]: the applier measures the step a trace prices
        importlib.import_module("scheduler.applying")
    value = getattr(importlib.import_module(mod), attr)
    globals()[name] = value
    return value


def solve(graph: Graph, budget: BudgetSpec, solver: str = "ilp", *, optimizer: str | None = None,
          mixed_precision: bool = False, reserve: ReserveSpec = 0, layout: Any = None,
          chunks: Sequence[int] | None = None, mlp_chunks: Sequence[int] | None = None, nested: bool = False,
          **options: Any) -> Plan:
    """Choose which activations to keep for ``graph`` under ``budget``.

    Args:
        graph: a cost graph (``scheduler.trace`` or ``graphs.load``).
        budget: ``"6GiB"``, ``"512MiB"``, bytes, or a fraction in (0, 1] of the
            store-all activation peak.
        solver: a registered solver name (``scheduler.available_solvers()``).
            The default, ``ilp``, is the one that answers: over regions and
            the nodes they keep (``selective=True``, NOTE [ One plan space ]
            in ``solvers.ilp``), exact where it can be proven within its work
            and time limits (``time_limit_s=60``, a promise about the wall
            clock), saying over which set in ``plan.findings["optimal_over"]``,
            and never without a plan where another registered solver finds
            one (it starts from the cheapest plan of store-all,
            ``per-module``, ``chen``, ``dp`` and ``uniform``). ``dp`` is faster on
            chains but plans only at the cuts of its chain, and says
            "infeasible" on some DAGs where ``ilp`` fits.
        optimizer, mixed_precision, reserve: the step's persistent state
            outside the graph, subtracted from a byte budget as ``fit`` does
            for a card (``scheduler.sizing.memory.step_budget_bytes``): the
            optimizer's state (``adam``, ``adamw``, ``sgd``, ...), the fp32
            master copy and fp32 state under mixed precision, and a reserve
            (a share such as ``"5%"`` or a size; default 0).
        layout: a :class:`scheduler.distributed.Layout` (FSDP, tensor and
            pipeline parallelism, micro-batches, schedule): ``budget`` is then
            the card of one rank, and the answer a
            :class:`scheduler.distributed.LayoutPlan`, one plan per pipeline
            stage (``scheduler.distributed.solve_layout``).
        chunks: chunk counts to try for the LM head and its loss (e.g.
            ``solvers.model.chunks.CHUNK_MENU``, ``(1, 2, 4, 8, 16)``): the solver
            runs once per count and the cheapest plan that fits wins (NOTE
            [ Chunked head ] in ``solvers.model.chunks``; transformers causal and
            masked LMs traced with their labels). None: the head as traced.
        mlp_chunks: chunk counts to try for every row-wise call (an MLP),
            the same count for all; combined with each of ``chunks``. A
            menu whose calls cannot run in chunks is skipped (and said, in
            ``plan.findings["chunks_skipped"]``), counts above the rows are
            dropped; refused only when nothing asked for can be chunked; the
            answer is ``optimal`` only when every count proved it (NOTE
            [ Chunk menus ] in ``solvers.menus.chunks``).
        nested: regions may nest one level: a region's child calls
            checkpointed again inside its recompute (NOTE [ Nested regions ]
            in ``solvers.model.nested``): the cheapest that fits of ``dp`` with
            nesting (exact on a chain), ``solver`` itself, and nestings of
            ``solver``'s least plan (NOTE [ Solving nested plans ]);
            combines with ``chunks``.
        **options: solver options (e.g. ``time_limit_s`` for ``ilp``).

    Raises:
        BudgetError: the budget cannot be read (NothingFits: the persistent
            state alone is over it).
        UnknownOption: an option the solver does not take.
        InfeasibleBudget: nothing fits; ``.min_feasible_bytes`` says what would
            and ``.floor`` which step sets the least peak (``scheduler.sizing.floor``).
    """
    if layout is not None:
        if chunks or mlp_chunks:
            raise SolverOptionError("chunks= and mlp_chunks= are for one process's graph, not with layout=: "
                                    "solve without a layout to chunk the head or MLPs")
        if nested:
            raise SolverOptionError("nested=True is for one process's graph, not with layout=: solve without a "
                                    "layout to nest regions")
        from .distributed import solve_layout

        return solve_layout(graph, budget, layout, solver=solver, optimizer=optimizer,  # type: ignore[return-value]
                            mixed_precision=mixed_precision, reserve=reserve, **options)
    started = _clock() - spent_before()  # where the limit started (NOTE [ One deadline ]: a command's start)
    budget_bytes = step_budget_bytes(budget, graph, optimizer=optimizer, mixed_precision=mixed_precision,
                                     reserve=reserve)
    # NOTE [ One deadline ] in solvers.deadline: the solves a chunked or nested solve makes share the limit
    limit = options.get("time_limit_s")
    deadline = Deadline(float(limit), clock=_clock) if limit is not None and (chunks or mlp_chunks or nested) else None

    def left(until: float | None) -> float:  # until: the end of a chunk menu pair's share (solve_chunked)
        assert deadline is not None
        return deadline.left() if until is None else max(0.0, min(until - deadline.clock(), deadline.left()))

    def one(g: Graph, b: int, until: float | None = None) -> Plan:
        opts = options if deadline is None else {**options, "time_limit_s": left(until)}
        return solvers.solve(g, b, solver=solver, **opts)

    selective = bool(options.get("selective", True))  # dp's too, where the solver asked for takes it

    def solve_graph(g: Graph, b: int, share: float | None = None) -> Plan:
        until = None if share is None or deadline is None else deadline.clock() + share
        if not nested:
            return one(g, b, until)
        return solve_nested(g, b, lambda g2, b2: one(g2, b2, until), selective=selective, solver=solver,
                            time_limit_s=limit if deadline is None else left(until))
    try:
        if chunks or mlp_chunks:
            return solve_chunked(graph, budget_bytes, solve_graph, chunks or (1,), mlp_chunks or (1,),
                                 deadline=deadline, fused_whole=any(k > 1 for k in chunks or ()))
        return solve_graph(graph, budget_bytes)
    except InfeasibleBudget as exc:
        if exc.floor:
            raise
        best = None if exc.best_regions is None else Plan(regions=exc.best_regions, inner=exc.best_inner,
                                                          saved=exc.best_saved)  # the plan itself: one floor

        def explain() -> str:
            floor = explain_floor(graph, best, levers=not (chunks or mlp_chunks), nested_lever=not nested)
            if best is not None and floor.best_peak_bytes != exc.min_feasible_bytes:  # not that plan: no other figure
                floor = explain_floor(graph, None, levers=not (chunks or mlp_chunks), nested_lever=not nested)
            return floor.text

        # a proven floor is explained within the caller's limit too: on Llama-2-7B's op graph the explanation
        # (the nested lever's simulations) took 2.5 s after a 1.7 s solve, and `--time-limit 5` answered after
        # 7.6 s at a load of 8
        ends = exc.time_limit_s if exc.time_limit_s is not None else limit
        if ends is None:
            raise exc.with_floor(explain()) from None
        raise exc.with_floor(_explained_within(explain, started + float(ends))) from None


class _Late(Exception):
    pass


def _explained_within(explain, ends: float) -> str:  # noqa: ANN001
    """``explain()``, its passes over the graph stopped at ``ends`` (on :data:`_clock`): a search the time limit
    stopped answers by that limit, and what sets its floor (several passes: 1.1 s on a 20,000-node chain at a
    load of 9, after ``dp`` had used its 9 s) is said only where it fits (NOTE [ Reading a graph under a
    deadline ] in ``graphs.reading``: ``simulate`` polls the check)."""
    def check(what: str) -> None:
        if _clock() >= ends - READ_OUT_S:
            raise _Late(what)

    try:
        with checking(check):
            check("explaining the floor")
            return explain()
    except _Late:
        return "(What sets the least peak was not worked out: the time limit had run out.)"


def simulate(graph: Graph, plan: Plan | None = None, *, check: bool = True, record: bool = True) -> Simulation:
    """Peak memory and recompute cost of ``plan`` on ``graph`` (``solvers.model.simulate``, the one cost model).

    Args:
        graph: the cost graph.
        plan: the plan; None is store-all.
        check: refuse a plan solved for another graph, or one with regions
            and no fingerprint (NOTE [ Plans carry their graph ] in
            ``solvers.model.plan``); False checks only that its regions fit.
        record: keep the live bytes of every step (``sim.live_bytes``).

    Raises:
        PlanMismatch: the plan was solved for another graph, or says for none.
        PlanError: a region does not fit ``graph``.
    """
    if plan is not None:
        plan.check_graph(graph, check=check)
    return solvers.simulate(graph, plan, record=record)


def solve_compiled(model: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *, budget: BudgetSpec,
                   **options: Any) -> Any:
    """A plan whose training step, compiled with ``torch.compile``, peaks at or under ``budget`` by the allocator,
    the fastest measured of those that do: :func:`scheduler.compiled.solve_compiled` (its arguments, and the
    ``Fit`` it returns), each eager budget solved by :func:`solve`."""
    from .compiled import solve_compiled as search

    return search(model, args, kwargs, budget=budget, solve=solve, **options)
