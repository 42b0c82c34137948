"""``dp``, the registered solver: the chain DP's table (``solvers.dp.chain``), filled at once or under a
wall-clock limit (``solvers.dp.limited``), and its answer for a budget."""

from __future__ import annotations

from graphs import Graph

from ..deadline import Deadline
from ..model.plan import Plan
from ..model.stages import chain_view
from ..options import Option
from ..registry import register
from .chain import DEFAULT_MAX_FRONT, DEFAULT_TIME_LIMIT_S, dp_answer, dp_table
from .limited import dp_within

__all__ = ["dp"]


@register("dp", options=(Option("max_front", int, "cap on each Pareto set (thinned past it: may lose optimality); "
                                 "None: exact", minimum=2, none_ok=True),
                          Option("selective", bool, "regions may keep op outputs from the forward (the menu of "
                                 "NOTE [ The menu of kept sets ]); False: every region recomputes all of it"),
                          Option("nested", bool, "regions may also run their child calls checkpointed inside "
                                 "their recompute (NOTE [ Nested regions ]); False: one level"),
                          Option("time_limit_s", float, "wall-clock limit (NOTE [ dp under a time limit ]); "
                                 "None: none", minimum=0, none_ok=True)))
def dp(graph: Graph, budget_bytes: int, *, max_front: int | None = DEFAULT_MAX_FRONT, selective: bool = True,
       nested: bool = False, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S) -> Plan:
    """Optimal plan over the chain of articulation points (see the module docstring).

    Args:
        max_front: cap on the size of each Pareto set; a set that grows past
            it is thinned to evenly spread entries, which keeps every answer
            feasible and the least feasible budget exact but may lose
            optimality (the plan is then ``feasible``). ``None``: exact.
        selective: regions may also keep nodes (selective recompute, NOTE
            [ The menu of kept sets ] in ``solvers.model.selective``): the plan's
            ``saved``, optimal over ``(region, menu entry)`` pairs. On a graph
            without saveable nodes this changes nothing. False: regions only.
        nested: regions may also be nested, with all of their child calls
            checkpointed inside their recompute (NOTE [ Nested regions ] and
            NOTE [ The menu of inner regions ] in ``solvers.model.nested``): the
            plan's ``inner``, optimal on a chain over plans whose regions are
            each one level or nested that way. On a graph without spans this
            changes nothing.
        time_limit_s: wall clock: the call returns within this + 1 s, its
            table filled with the regions its time allows, or raises
            :class:`~solvers.deadline.OutOfTime` (NOTE [ dp under a time
            limit ] in ``solvers.dp.limited``). None: no limit (the table is
            quadratic in a chain's length: hours at 50,000 nodes).

    Returns:
        A plan with status ``optimal`` on a chain, ``feasible`` on other
        graphs (optimal among plans cut at articulation points), ``bound``
        set to its cost when optimal. On a graph with spans its regions are
        spans, and optimal means among plans whose regions are spans.

    Raises:
        InfeasibleBudget: with the least budget any such plan needs.
    """
    view = chain_view(graph)  # NOTE [ Chains and forward holds ] in solvers.model.stages
    check = None if view is graph else graph
    if time_limit_s is not None:
        return dp_within(view, budget_bytes, Deadline(time_limit_s), max_front=max_front, selective=selective,
                         nested=nested, check=check)
    return dp_answer(view, dp_table(view, max_front=max_front, selective=selective, nested=nested), budget_bytes,
                     check=check)
