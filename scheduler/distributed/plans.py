"""Plans for a layout: one per pipeline stage, each solved for what its rank holds.

``solve_layout(graph, "80GiB", Layout(shard=8, pp=4, microbatches=8))``
cuts the graph into stages (``scheduler.distributed.stages``), builds the
graph one rank runs for each (``scheduler.distributed.ranks``), and solves
each stage for the micro-batches it holds in flight under the schedule
(``scheduler.distributed.inflight``): exactly, where each pipeline rank runs
one stage. Each plan names module paths and applies in place onto that
stage's module (``scheduler.apply(stage_module, plan)``).

NOTE [ Interleaved stages share a rank ]
    Under ``interleaved-1f1b`` a rank runs ``virtual_stages`` stages, and its
    peak mixes their micro-batches (``schedule.rank_peak``). Each stage is
    solved as if every micro-batch the rank holds at once were its own
    (the count over the rank's order), against the rank's budget less the
    other stages' persistent bytes; the rank's peak is then walked over its
    order with the plans found, and while it is over the budget every
    stage of the rank is solved again for as much less. The plans fit;
    they are not proven the cheapest (``status`` feasible).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

from graphs import Graph
from solvers import InfeasibleBudget, Plan, Status, format_bytes

from ..sizing.budget import read_budget
from ..sizing.memory import ReserveSpec, parse_reserve
from .inflight import (STOPPED, InflightSolve, StoppedSearch, chunk_memory, persistent_graph, solve_inflight,
                       stopped_search)
from .layout import Layout, LayoutError
from .ranks import RankState, rank_graph, rank_state
from .schedule import ChunkMemory, in_flight, rank_peak, stages_of_rank
from .stages import pipeline_buffer_bytes, stage_bounds, stage_graph

__all__ = ["StagePlan", "LayoutPlan", "solve_layout", "stage_graphs", "rank_graphs", "plan_files"]

log = logging.getLogger(__name__)

#: Re-solves of an interleaved rank's stages before its answer is "no plan fits".
MAX_ROUNDS = 6


@dataclass(frozen=True)
class StagePlan:
    """One stage's plan and what its rank holds (NOTE [ What a rank holds ] in ``scheduler.distributed.ranks``).

    Attributes:
        index: the stage.
        rank: the pipeline rank that runs it.
        modules: its first and last module calls (``("transformer.h.0", "transformer.h.5")``).
        graph: the graph one rank runs for it, per micro-batch (what ``plan`` was solved on).
        plan: the plan (None when none fits).
        inflight: micro-batches it holds at its peak.
        inflight_reason: where that count comes from (the schedule's rule).
        memory: per micro-batch, what it retains and its forward and backward peaks above ``base_bytes``.
        base_bytes: what the rank holds for the whole step before any gradient: its parameters, its inputs
            and the pipeline's buffers (``simulate``'s categories).
        state: the optimizer state and master copy of the rank (outside ``simulate``).
        peak_bytes: the rank's predicted peak: ``base_bytes``, the micro-batches in flight and the running one
            over the schedule's order (``schedule.rank_peak``), and ``state``; for an interleaved rank, its
            stages' together.
        needs_bytes: without a plan, the least card that was seen to fit (not proven least), else None.
        solves: inner solver calls made.
        stopped: without a plan because a limit stopped its search (not because none fits): what
            :attr:`no_plan_text` says, ``stopped at the time limit (no plan found in 60 s)``; else "".
    """

    index: int
    rank: int
    modules: tuple[str, str]
    graph: Graph
    plan: Plan | None
    inflight: int
    inflight_reason: str
    memory: ChunkMemory | None
    base_bytes: int
    state: RankState | None
    peak_bytes: int | None
    needs_bytes: int | None = None
    solves: int = 0
    stopped: str = ""

    @property
    def fits(self) -> bool:
        return self.plan is not None

    @property
    def no_plan_text(self) -> str:
        """What a table says in place of the plan of a stage without one: ``stopped at the time limit (no plan
        found in 60 s)`` when its search was stopped, else ``no plan``; with the card seen to fit, if any."""
        seen = f"one at {format_bytes(self.needs_bytes)} seen" if self.needs_bytes else ""
        if self.stopped:
            return self.stopped[:-1] + f"; {seen})" if seen else self.stopped
        return f"no plan ({seen})" if seen else "no plan"


@dataclass(frozen=True)
class LayoutPlan:
    """The plans of a layout, one per stage (:func:`solve_layout`).

    Attributes:
        layout: the layout.
        budget_bytes: the card per rank, as asked.
        stages: one :class:`StagePlan` per stage, in order.
        reserve_bytes: held back from each card (NOTE [ Reserve ]).
    """

    layout: Layout
    budget_bytes: int
    stages: tuple[StagePlan, ...]
    reserve_bytes: int = 0

    @property
    def fits(self) -> bool:
        """Every stage has a plan within the budget."""
        return all(s.fits for s in self.stages)

    @property
    def plans(self) -> tuple[Plan | None, ...]:
        return tuple(s.plan for s in self.stages)

    @property
    def peak_bytes(self) -> int | None:
        """The largest rank's predicted peak (None when a stage has no plan)."""
        return None if not self.fits else max(s.peak_bytes or 0 for s in self.stages)

    def files(self, path: str | os.PathLike) -> list[str]:
        """The files :meth:`save` writes for ``path`` (:func:`plan_files`)."""
        return plan_files(path, len(self.stages))

    def save(self, path: str | os.PathLike) -> list[str]:
        """Write each stage's plan and rank graph (:meth:`files`), atomically; returns the paths written.

        Raises:
            LayoutError: a stage has no plan.
        """
        import graphs

        missing = [s.index for s in self.stages if s.plan is None]
        if missing:
            raise LayoutError(f"stage(s) {missing} have no plan within the budget; nothing to write")
        names = self.files(path)
        for k, s in enumerate(self.stages):
            s.plan.save(names[2 * k])  # type: ignore[union-attr]
            graphs.save(s.graph, names[2 * k + 1])
        return names


def plan_files(path: str | os.PathLike, stages: int) -> list[str]:
    """Where the plans of ``stages`` stages go for ``-o path``: ``path`` itself for one stage, else
    ``NAME.stage{i}.json`` beside it; each followed by its stage's rank graph (``NAME[.stage{i}].graph.json``)."""
    path = os.fspath(path)
    root, ext = os.path.splitext(path)
    ext = ext or ".json"
    if stages == 1:
        return [path, f"{root}.graph{ext}"]
    return [f for k in range(stages) for f in (f"{root}.stage{k}{ext}", f"{root}.stage{k}.graph{ext}")]


def stage_graphs(graph: Graph, layout: Layout) -> list[Graph]:
    """Each stage's graph, before tensor parallelism and FSDP (NOTE [ A stage's graph ])."""
    bounds = stage_bounds(graph, layout)
    return [stage_graph(graph, a, b, index=k, stages=len(bounds)) for k, (a, b) in enumerate(bounds)]


def rank_graphs(graph: Graph, layout: Layout, stages: Sequence[Graph] | None = None) -> list[Graph]:
    """The graph one rank runs per micro-batch for each stage (``ranks.rank_graph``), holding the
    pipeline's buffers too (``stages.pipeline_buffer_bytes``, as inputs)."""
    out = []
    for k, sg in enumerate(stage_graphs(graph, layout) if stages is None else stages):
        rg = rank_graph(sg, layout)
        extra = pipeline_buffer_bytes(rg, layout.microbatches, in_flight(layout, k)[0])
        out.append(rg.with_nodes(rg.nodes, input_bytes=rg.input_bytes + extra) if extra else rg)
    return out


def _modules(graph: Graph) -> tuple[str, str]:
    """The first and last outermost submodule calls of a stage's graph."""
    outer, end = [], -1
    for sp in graph.spans:  # sorted by (first, -last): an outer call comes before the calls inside it
        if sp.first > end and sp.module:
            outer.append(sp.module)
            end = sp.last
    return (outer[0], outer[-1]) if outer else ("", "")


def solve_layout(graph: Graph, budget: int | str, layout: Layout, *, solver: str = "ilp",
                 optimizer: str | None = None, mixed_precision: bool = False, reserve: ReserveSpec = 0,
                 strict: bool = True, **options: Any) -> LayoutPlan:
    """One plan per pipeline stage of ``graph`` under ``layout``, each within ``budget`` on its rank.

    Args:
        graph: the model's graph at the micro-batch one rank runs (``scheduler.trace``).
        budget: the card per rank: ``"80GiB"`` or bytes (what ``simulate`` counts, plus the optimizer
            state and master copy when ``optimizer`` is given).
        layout: the parallel layout.
        solver: the solver for each stage (``ilp``: exact where it proves it).
        optimizer: the optimizer whose sharded state is subtracted on each rank (None: nothing).
        mixed_precision: the fp32 master copy and state beside low-precision weights (``scheduler.sizing.memory``).
        reserve: held back from each card (NOTE [ Reserve ]; a share such as ``"5%"`` or a size; default 0).
        strict: raise when a stage has no plan (else that stage's plan is None).
        **options: the solver's options (and ``first_fit``: each stage answers with the first plan that fits).

    Raises:
        LayoutError: a fractional budget, or stage starts that do not fit the graph.
        InfeasibleBudget: (strict) a stage has no plan; the message names it.
    """
    kind, value = read_budget(budget)
    if kind == "fraction":
        raise LayoutError("a layout's budget is the memory of one rank's card (e.g. 80GiB); a fraction of the "
                          "store-all activations has no meaning per rank")
    if graph.frozen_param_bytes and layout.shard > 1:
        raise LayoutError(f"{graph.frozen_param_bytes:,} bytes of this model's parameters are frozen, and what FSDP "
                          "gathers of frozen weights is not modelled; plan it without --fsdp/--hsdp (pipeline and "
                          "tensor parallelism are), or with every parameter trained")
    card = int(value)
    budget_bytes = card - parse_reserve(reserve, card)
    stages = stage_graphs(graph, layout)
    ranks = rank_graphs(graph, layout, stages)
    states = [rank_state(sg, layout, optimizer=optimizer, mixed_precision=mixed_precision)
              if optimizer or mixed_precision else None for sg in stages]
    out: list[StagePlan | None] = [None] * len(stages)
    for r in range(layout.pp):
        mine = stages_of_rank(layout, r)
        for s, answer in zip(mine, _solve_rank(layout, r, mine, ranks, states, budget_bytes, solver, options)):
            out[s] = answer
    result = LayoutPlan(layout, card, tuple(out), card - budget_bytes)  # type: ignore[arg-type]
    if strict and not result.fits:
        bad = next(s for s in result.stages if not s.fits)
        need = f"; a card of {format_bytes(bad.needs_bytes)} was seen to fit" if bad.needs_bytes else ""
        what = f"was {bad.stopped}" if bad.stopped else "has no plan"
        raise InfeasibleBudget(budget_bytes, bad.needs_bytes or budget_bytes + 1, proven=False,
                               floor=f"Stage {bad.index} ({bad.modules[0]} .. {bad.modules[1]}, {bad.inflight} "
                                     f"micro-batch(es) in flight: {bad.inflight_reason}) {what}{need}.")
    return result


def _solve_rank(layout: Layout, rank: int, mine: Sequence[int], ranks: Sequence[Graph],
                states: Sequence[RankState | None], budget_bytes: int, solver: str,
                options: dict[str, Any]) -> list[StagePlan]:
    """The plans of the stages pipeline rank ``rank`` runs (NOTE [ Interleaved stages share a rank ])."""
    outside = sum(states[s].outside_simulation_bytes for s in mine if states[s] is not None)  # type: ignore[union-attr]
    held = {s: persistent_graph(ranks[s]).input_bytes for s in mine}  # parameters, inputs, gradients
    base = sum(ranks[s].param_bytes + ranks[s].input_bytes for s in mine)
    counts = {s: in_flight(layout, s) for s in mine}
    grads = layout.microbatches > 1
    total = counts[mine[0]][0] if len(mine) == 1 else _rank_count(layout, rank)
    margin = 0
    answers: dict[int, InflightSolve | InfeasibleBudget] = {}
    for _ in range(MAX_ROUNDS if len(mine) > 1 else 1):
        for s in mine:
            others = sum(held[o] for o in mine if o != s)
            answers[s] = _try(ranks[s], budget_bytes - outside - others - margin, total, solver, options,
                              held_grads=grads)
        if any(not isinstance(a, InflightSolve) for a in answers.values()):
            break
        chunks = {s: a.memory for s, a in answers.items()}  # type: ignore[union-attr]
        peak = rank_peak(layout, rank, chunks).bytes + base + outside
        if peak <= budget_bytes:
            return [_stage(layout, s, ranks[s], states[s], counts[s], answers[s], peak, interleaved=len(mine) > 1)
                    for s in mine]
        margin += peak - budget_bytes
    return [_stage(layout, s, ranks[s], states[s], counts[s], answers[s], None) for s in mine]


def _rank_count(layout: Layout, rank: int) -> int:
    """The most micro-batches (of all its stages) pipeline rank ``rank`` holds at once."""
    from .schedule import rank_order

    held = most = 0
    for op in rank_order(layout, rank):
        held += 1 if op.kind == "F" else 0
        most = max(most, held)
        held -= 0 if op.kind == "F" else 1
    return most


def _try(graph: Graph, budget_bytes: int, count: int, solver: str, options: dict[str, Any], *, held_grads: bool
         ) -> InflightSolve | InfeasibleBudget:
    try:
        return solve_inflight(graph, budget_bytes, count, held_grads=held_grads, solver=solver, **options)
    except InfeasibleBudget as exc:
        return stopped_search(exc, budget_bytes, solver, options) or exc
    except STOPPED as exc:  # its time limit: no plan, none proven impossible; no card seen to fit
        log.warning("a stage's solve stopped without a plan: %s", exc)
        return stopped_search(exc, budget_bytes, solver, options)  # type: ignore[return-value]


def _stage(layout: Layout, s: int, graph: Graph, state: RankState | None, count: tuple[int, str],
           answer: InflightSolve | InfeasibleBudget, peak: int | None, *, interleaved: bool = False) -> StagePlan:
    base = graph.param_bytes + graph.input_bytes
    outside = state.outside_simulation_bytes if state is not None else 0
    if not isinstance(answer, InflightSolve) or peak is None:
        needs = None
        if isinstance(answer, InfeasibleBudget) and answer.min_feasible_bytes > answer.budget_bytes:
            needs = answer.min_feasible_bytes + outside
        stopped = answer.text if isinstance(answer, StoppedSearch) else ""
        return StagePlan(s, layout.rank_of_stage(s), _modules(graph), graph, None, count[0], count[1],
                         chunk_memory(graph, None), base, state, None, needs, stopped=stopped)
    plan = dataclasses.replace(answer.plan, findings={**answer.plan.findings, "stage": s, "layout": layout.describe(),
                                                      "rank_peak_bytes": peak})
    if interleaved:
        plan = dataclasses.replace(plan, status=Status.FEASIBLE)
    return StagePlan(s, layout.rank_of_stage(s), _modules(graph), graph, plan, count[0], count[1], answer.memory,
                     base, state, peak, None, answer.solves)
