"""``fit`` under a layout: the largest micro-batch (or sequence) per rank, and the smallest card.

The graph of a layout is the one a rank runs per micro-batch, so the size
searched is the micro-batch one rank sees (NOTE [ What a rank holds ] in
``scheduler.distributed.ranks``): the global batch is that times the
data-parallel degree and the micro-batches. A size fits when every stage
has a plan within the card on its rank (``solve_layout``), which is
monotone in the size, so the search is ``scheduler.sizing.search``'s
(NOTE [ Size search ]).

NOTE [ The smallest card ]
    The least card on which a layout fits at a size is the least per-rank
    budget at which every stage has a plan, plus the optimizer state and
    master copy of the largest rank, plus the reserve. It is bisected on the
    card with ``solve_layout`` between a lower bound (the largest stage's
    least peak over all plans for one micro-batch, its gradients held when
    there are several micro-batches: no plan holding more needs less) and an upper one (store-all
    on every stage), to ``CARD_TOLERANCE`` of the upper bound: the answer is
    a card that fits, with the largest budget seen not to fit below it. A
    probe asks only whether each stage has a plan (``first_fit``: its
    search stops at the first plan that fits), and the plans answered are
    solved again on the card found.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import solvers
from graphs import Graph
from solvers import InfeasibleBudget, format_bytes

from ..sizing.budget import parse_size
from ..sizing.memory import ReserveSpec, parse_reserve
from ..sizing.search import search_largest
from ..sizing.sized import SizedModel
from .inflight import STOPPED, chunk_memory, persistent_graph, stage_value
from .layout import Layout, LayoutError
from .plans import LayoutPlan, rank_graphs, solve_layout, stage_graphs
from .ranks import rank_state
from .schedule import in_flight

__all__ = ["LayoutFit", "CardFit", "least_card", "fit_layout", "fit_with_layout", "CARD_TOLERANCE"]

log = logging.getLogger(__name__)

#: The smallest card is bisected to this share of its upper bound (NOTE [ The smallest card ]).
CARD_TOLERANCE = 0.002


@dataclass(frozen=True)
class CardFit:
    """The smallest card for a layout at one size (NOTE [ The smallest card ]).

    Attributes:
        card_bytes: a card on which every stage has a plan (None: not even at the upper bound).
        below_bytes: the largest card seen not to fit (a proven lower bound when no search stopped early).
        plans: the plans on ``card_bytes``.
    """

    card_bytes: int | None
    below_bytes: int
    plans: LayoutPlan | None


@dataclass(frozen=True)
class LayoutFit:
    """What :func:`fit_layout` found.

    Attributes:
        layout: the layout.
        dimension: ``batch`` (the micro-batch per rank) or ``seq``.
        fixed: the other sizes held fixed.
        size: the largest size that fits the card (None: not even the smallest; the size asked when
            nothing is searched).
        capped: the search stopped at its largest size (larger may fit).
        plans: the stage plans at ``size`` (at the smallest size tried when nothing fits).
        card: the smallest card at that size (None unless asked).
        probes: ``(size, fits)`` for every size tried.
        traces: sizes traced.
        elapsed_s: wall time.
    """

    layout: Layout
    dimension: str
    fixed: Mapping[str, int]
    size: int | None
    capped: bool
    plans: LayoutPlan | None
    card: CardFit | None
    probes: tuple[tuple[int, bool], ...]
    traces: int
    elapsed_s: float


def _card_for(budget: int, reserve: ReserveSpec) -> int:
    """The least card whose budget after the reserve is ``budget``."""
    if reserve is None or isinstance(reserve, float) or (isinstance(reserve, str) and reserve.strip().endswith("%")):
        share = parse_reserve(reserve, 1 << 40) / (1 << 40)
        return math.ceil(budget / (1 - share)) if share < 1 else budget
    return budget + parse_reserve(reserve, 1 << 62)


def least_card(graph: Graph, layout: Layout, *, optimizer: str | None = "adam", mixed_precision: bool = False,
               reserve: ReserveSpec = None, solver: str = "ilp", tolerance: float = CARD_TOLERANCE,
               **options: Any) -> CardFit:
    """The smallest card (per rank) on which ``layout`` fits ``graph`` (NOTE [ The smallest card ])."""
    lows, highs = [], []
    for k, (sg, rg) in enumerate(zip(stage_graphs(graph, layout), rank_graphs(graph, layout))):
        count = in_flight(layout, k)[0]
        state = rank_state(sg, layout, optimizer=optimizer, mixed_precision=mixed_precision) \
            if optimizer or mixed_precision else None
        outside = state.outside_simulation_bytes if state is not None else 0
        held = persistent_graph(rg) if layout.microbatches > 1 else rg  # the graph its plan is solved on
        try:
            solvers.solve(held, 1, solver=solver, **options)
            least = 1
        except InfeasibleBudget as exc:
            least = exc.lower_bound_bytes if not exc.proven and exc.lower_bound_bytes else exc.min_feasible_bytes
        except STOPPED:  # its time limit: no bound known beyond the persistent bytes
            least = 1
        lows.append(least + outside)
        highs.append(rg.param_bytes + rg.input_bytes + stage_value(chunk_memory(rg, None), count) + outside)
    lo = _card_for(max(lows), reserve) - 1
    hi = _card_for(max(highs) * layout.virtual_stages, reserve)
    best = solve_layout(graph, hi, layout, solver=solver, optimizer=optimizer, mixed_precision=mixed_precision,
                        reserve=reserve, strict=False, **options)
    if not best.fits:
        return CardFit(None, hi, best)
    step = max(1 << 12, int(tolerance * hi))
    while hi - lo > step:
        mid = (lo + hi) // 2
        found = solve_layout(graph, mid, layout, solver=solver, optimizer=optimizer, mixed_precision=mixed_precision,
                             reserve=reserve, strict=False, first_fit=True, **options)
        log.info("card %s: %s", format_bytes(mid), "fits" if found.fits else "does not fit")
        if found.fits:
            hi, best = mid, None
        else:
            lo = mid
    if best is None:  # the probes only asked whether a plan fits: the plans on the card found
        best = solve_layout(graph, hi, layout, solver=solver, optimizer=optimizer, mixed_precision=mixed_precision,
                            reserve=reserve, strict=False, **options)
    return CardFit(hi, lo, best)


def fit_layout(model: SizedModel, device_memory: int | str | None, layout: Layout, *,
               optimizer: str | None = "adam", mixed_precision: bool = False, reserve: ReserveSpec = None,
               solver: str = "ilp", min_size: int = 1, max_size: int | None = None, multiple_of: int = 1,
               card: bool = True, solver_options: Mapping[str, Any] | None = None,
               progress: Callable[[int, bool], None] | None = None) -> LayoutFit:
    """The largest micro-batch (or sequence) of ``model`` under ``layout`` on a card of ``device_memory``,
    the stage plans there, and the smallest card at that size.

    Args:
        model: the model as ``size -> graph`` (``scheduler.sizing.sized.sized_model``), at the micro-batch
            one rank runs.
        device_memory: the card per rank (None: only the smallest card at ``min_size``).
        layout: the layout.
        optimizer, mixed_precision, reserve: the persistent state (``scheduler.sizing.memory``).
        solver: the solver of each stage.
        min_size, max_size, multiple_of: the sizes searched (``min_size == max_size``: that size only).
        card: also find the smallest card at the size answered (NOTE [ The smallest card ]).
        solver_options: the solver's options.
        progress: called with ``(size, fits)`` as the search goes.
    """
    t0 = time.perf_counter()
    options = dict(solver_options or {})
    graphs: dict[int, Graph] = {}
    found: dict[int, LayoutPlan] = {}

    def graph_at(size: int) -> Graph:
        if size not in graphs:
            graphs[size] = model.graph_at(size)
        return graphs[size]

    def fits(size: int, phase: str = "") -> bool:
        if size not in found:
            found[size] = solve_layout(graph_at(size), device_memory, layout, solver=solver, optimizer=optimizer,
                                       mixed_precision=mixed_precision, reserve=reserve, strict=False, **options)
            if progress is not None:
                progress(size, found[size].fits)
        return found[size].fits

    hi = max_size or model.max_size or 4096
    if model.max_size:
        hi = min(hi, model.max_size)
    size, capped = None, False
    if device_memory is not None:
        device_memory = parse_size(device_memory) if isinstance(device_memory, str) else int(device_memory)
        size, capped = search_largest(fits, min_size, hi, multiple_of=multiple_of)
    at = size if size is not None else max(min_size, multiple_of)
    plans = found.get(at)
    least = None
    if card:
        least = least_card(graph_at(at), layout, optimizer=optimizer, mixed_precision=mixed_precision,
                           reserve=reserve, solver=solver, **options)
        if plans is None:
            plans = least.plans
    probes = tuple((s, p.fits) for s, p in sorted(found.items()))
    return LayoutFit(layout, model.dimension, dict(model.fixed), size if device_memory is not None else at, capped,
                     plans, least, probes, len(graphs), time.perf_counter() - t0)



def fit_with_layout(model: SizedModel, device_memory: int | str | None, layout: Layout, *,
                    solvers: Sequence[str] | None = None, dtype: str | None = None, min_size: int = 1,
                    solver_options: Mapping[str, Mapping[str, Any]] | None = None, **kwargs: Any) -> LayoutFit:
    """:func:`fit_layout` with ``scheduler.fit``'s arguments (``solvers``: one name at most; ``dtype``: the
    model's, already in the graphs; ``solver_options`` by solver name).

    Raises:
        LayoutError: more than one solver named.
    """
    names = [s for s in (solvers or ()) if s != "store-all"] or ["ilp"]
    if len(names) > 1:
        raise LayoutError(f"a layout is solved with one solver per stage; name one, not {', '.join(names)}")
    options = dict((solver_options or {}).get(names[0], {}))
    return fit_layout(model, device_memory, layout, solver=names[0], min_size=min_size, solver_options=options,
                      **kwargs)
