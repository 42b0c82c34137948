"""What a recompute costs in the step, measured: the model's blocks checkpointed as a plan runs them.

NOTE [ Recompute timed in the step ]
    The roofline prices a node's recompute as its forward (NOTE [ Roofline
    costs ] in ``scheduler.tracing.roofline``), plus ``recompute_op_s`` per
    kernel (NOTE [ Plan overheads ] in ``solvers.model.overheads``). A
    recompute in a real step costs more than that, and by how much depends on
    the model: on this project's CPU, per block checkpointed, beyond its
    forward, GPT-2 +0.8 ms, BERT +1.1, ConvNeXt +0.5, ResNet +0.8, Llama 0,
    ViT -0.7 (``time.md`` at ``e218833``: the median plan's extra time
    predicted 16-27 % under on the LMs and 46 % under on ConvNeXt). Part is
    Python (the block's forward run again, the checkpoint's hooks: a
    ConvNeXt block spends 0.3-0.5 ms so), part is kernels that run slower
    after a recompute (a depthwise convolution's backward by about 20 %).
    No per-call figure fits all six.

    So a CPU trace with roofline costs measures it on the user's own model,
    at the traced inputs, once its graph is built: the training step (loss
    and backward, the trace's loop) plain, and with the plan that
    checkpoints each repeated block (what ``gradient_checkpointing_enable()``
    checkpoints: ``solvers.baselines.block_spans``) applied by the applier
    (``scheduler.applying.planned``: its wrappers, RNG replay and caches as
    any plan's), in alternating rounds (:data:`ROUNDS`, :data:`BUDGET_S`),
    by ``run_clock`` (CPU time on one thread, NOTE [ Chunk loops timed at
    their shapes ]). What the plan adds (the median of the rounds'
    differences), less its overheads (``overhead_seconds``: the
    region calls, RNG), over the recompute the graph predicts for it, is the
    graph's recompute scale: every node's ``fwd_cost`` is multiplied by it,
    so every solver weighs the recompute as measured. The blocks stand for
    the model: they are most of it, and the nodes outside them (embeddings,
    a head) are rarely recomputed. The scale is kept within
    ``[MIN_SCALE, MAX_SCALE]`` and stored in
    ``graph.meta["costs"]["recompute_scale"]`` with what gave it
    (``scale``, ``measured_s``, ``predicted_s``, ``overheads_s``,
    ``blocks``).

    Not measured (the roofline as it is): a graph without repeated blocks
    (DenseNet's ``denselayer1``), a step estimated (FLOPs at the graph's
    rate) over :data:`MAX_STEP_S`, or whose pass (plain and planned) takes
    over :data:`MAX_PASS_S`, a model with a plan applied, a step that fails
    (logged), a trace for a GPU or of a meta model. The step's buffers
    (BatchNorm statistics), gradients and RNG are as they were after it.
    Which traces measure it is read from ``op_classes.json``
    (``"recompute_scale": false``: none; absent: on), so the test suite,
    which reads no clock, measures none; tests of this module inject a
    clock and the step.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

from graphs import COSTS_META, CkptError, Graph
from solvers.model.overheads import overhead_seconds

from .chunk_times import run_clock

__all__ = ["SCALE_KEY", "MIN_SCALE", "MAX_SCALE", "MAX_STEP_S", "MAX_PASS_S", "BUDGET_S", "ROUNDS", "MIN_ROUNDS", "block_plan", "measure_scale",
           "with_recompute_scale", "recompute_scale"]

log = logging.getLogger(__name__)

#: Where a graph carries its measured recompute scale: ``graph.meta["costs"][SCALE_KEY]``.
SCALE_KEY = "recompute_scale"
#: The least and the most a measured scale may be (a measurement beyond them is noise or another effect).
MIN_SCALE, MAX_SCALE = 0.5, 3.0
#: A step estimated to take longer than this (FLOPs at the graph's rate, forward and backward) is not timed.
MAX_STEP_S = 1.5
#: The seconds the timed rounds may take, at the warm-up's pace; the most rounds and the fewest.
BUDGET_S, ROUNDS, MIN_ROUNDS = 6.0, 9, 5
#: The most seconds a pass (the plain step and the planned one) may take to be timed.
MAX_PASS_S = 3.0


def block_plan(graph: Graph) -> Any:
    """The plan checkpointing each repeated block of ``graph`` (``per-module``'s), or None without blocks."""
    from solvers import Plan
    from solvers.baselines import NoModulePaths, block_spans

    try:
        regions = block_spans(graph)
        return Plan.from_regions(graph, regions) if regions else None
    except (NoModulePaths, CkptError):
        return None


def measure_scale(graph: Graph, plain: Callable[[], Any], planned: Callable[[], Any], plan: Any, *,
                  clock: Callable[[], float] | None = None, rounds: int = ROUNDS, budget_s: float = BUDGET_S
                  ) -> dict[str, float] | None:
    """The recompute scale (NOTE [ Recompute timed in the step ]) from ``plain()`` and ``planned()`` (one step
    each), ``plan`` the planned step's plan on ``graph``; None where the steps are too slow to time or ``plan``
    recomputes nothing by the graph. ``clock`` times the runs and the budgets (default: :func:`run_clock` for the
    runs, the wall clock for the budgets)."""
    from solvers import simulate

    wall = clock or time.perf_counter
    clock = clock or run_clock()
    sim = simulate(graph, plan, record=False)
    predicted = sim.recompute_time_s
    if not predicted or predicted <= 0:
        return None
    measured = _paired(plain, planned, clock, wall, rounds, budget_s)
    if measured is None:
        return None
    overheads = sum(overhead_seconds(graph, plan.regions).values())
    raw = (measured - overheads) / predicted
    return {"scale": min(MAX_SCALE, max(MIN_SCALE, raw)), "measured_s": measured, "predicted_s": predicted,
            "overheads_s": overheads, "blocks": float(len(plan.regions))}


def _paired(plain: Callable[[], Any], planned: Callable[[], Any], clock: Callable[[], float],
            wall: Callable[[], float], rounds: int, budget_s: float) -> float | None:
    """The median over rounds of ``planned()``'s time less ``plain()``'s, the two run in turn (ABBA) by ``clock``:
    after two warm-up passes, as many rounds as ``budget_s`` holds at the second pass's pace by ``wall``
    (:data:`MIN_ROUNDS` to ``rounds``), none started once three budgets are spent (two at least). A round's two
    steps share its stretch of the machine's load (a GPT-2 step of 200 ms, 2 blocks, beside a busy core: 26-28 ms
    in three measurements; the least times' difference 25-30). None where a pass takes over :data:`MAX_PASS_S`
    by ``clock``."""
    started = wall()
    pace = 0.0
    for p in range(2):
        t0, c0 = wall(), clock()
        plain()
        planned()
        pace = wall() - t0
        if clock() - c0 > MAX_PASS_S * (2 - p):
            return None
    rounds = max(min(MIN_ROUNDS, rounds), min(rounds, int(budget_s / pace) if pace > 0 else rounds))
    diffs = []
    for r in range(rounds):
        if r >= 2 and wall() - started > 3 * budget_s:
            break
        took = {}
        for side, run in ((0, plain), (1, planned)) if r % 2 == 0 else ((1, planned), (0, plain)):
            c0 = clock()
            run()
            took[side] = clock() - c0
        diffs.append(took[1] - took[0])
    return statistics.median(diffs)


def with_recompute_scale(graph: Graph, found: Mapping[str, float]) -> Graph:
    """``graph`` with every node's ``fwd_cost`` times ``found["scale"]``, and ``found`` in its costs' meta."""
    import dataclasses

    scale = float(found["scale"])
    costs = dict(graph.meta.get(COSTS_META) or {})
    costs[SCALE_KEY] = {k: float(v) for k, v in found.items()}
    nodes = [dataclasses.replace(nd, fwd_cost=int(round(nd.fwd_cost * scale))) for nd in graph.nodes]
    return graph.with_nodes(nodes, meta={**graph.meta, COSTS_META: costs})


def recompute_scale(model: Any, graph: Graph, args: Sequence[Any], kwargs: Mapping[str, Any],
                    loss: Callable[[Any], Any] | None, *, clock: Callable[[], float] | None = None,
                    rounds: int = ROUNDS, budget_s: float = BUDGET_S) -> Graph:
    """``graph`` with its recompute scale measured on ``model`` (NOTE [ Recompute timed in the step ]), or
    ``graph`` as it is where it is not measured."""
    import torch

    from ..applying import applied_plan, planned
    from ..measuring.training import clear_grads, training_step

    rate = (graph.meta.get(COSTS_META) or {}).get("flops_per_s")
    plan = block_plan(graph)
    if plan is None or applied_plan(model) is not None or not isinstance(rate, (int, float)) or rate <= 0:
        return graph
    step_s = sum(nd.fwd_flops + nd.bwd_flops for nd in graph.nodes) / rate
    if step_s > MAX_STEP_S:
        log.info("recompute scale: a step of %s is estimated at %.1f s; the roofline prices its recompute", graph.name,
                 step_s)
        return graph
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers]
    args, kwargs, loop = tuple(args), dict(kwargs), graph.loop
    run = planned(model, plan)

    def step(module: Any) -> Callable[[], None]:
        def go() -> None:
            clear_grads(model)
            training_step(module, args, kwargs, loss, loop=loop)
        return go

    try:
        with torch.random.fork_rng(devices=[]):
            found = measure_scale(graph, step(model), step(run), plan, clock=clock, rounds=rounds, budget_s=budget_s)
    except Exception as exc:  # noqa: BLE001  (a step that does not run so: the roofline as it is)
        log.info("could not time the recompute of %s's blocks (%s: %s); the roofline prices it", graph.name,
                 type(exc).__name__, exc)
        return graph
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)
    if found is None:
        log.info("recompute scale: %s's step is too slow to time or its blocks recompute nothing", graph.name)
        return graph
    log.info("timed the recompute of %d blocks in the step: +%.1f ms measured, %.1f ms predicted, %.1f ms "
             "overheads: recompute scale %.2f", len(plan.regions), 1e3 * found["measured_s"],
             1e3 * found["predicted_s"], 1e3 * found["overheads_s"], found["scale"])
    return with_recompute_scale(graph, found)
