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
    checkpoints: ``solvers.baselines.block_spans``; in a model without
    indexed blocks, the most frequent family of numbered submodules, such as
    torchvision DenseNet's ``denselayer1`` to ``denselayer24``) applied by the applier
    (``scheduler.applying.planned``: its wrappers, RNG replay and caches as
    any plan's; the applier registers it when imported, which every verb
    that traces does, and a trace without it keeps the roofline as it is), in alternating rounds (:data:`ROUNDS`, :data:`BUDGET_S`),
    by ``run_clock`` (CPU time on one thread, NOTE [ Chunk loops timed at
    their shapes ]), Python's collector held off (``no_collection``: with
    it, a Llama's blocks measured 7.8-16.9 ms over four traces; without,
    15.5-16.1 in four of five). What the plan adds (the difference of
    the two steps' least times over the rounds, below), less its
    overheads (``overhead_seconds``: the
    region calls, RNG), over the recompute the graph predicts for it, is the
    graph's recompute scale: every node's ``fwd_cost`` is multiplied by it,
    so every solver weighs the recompute as measured. The blocks stand for
    the model: they are most of it, and the nodes outside them (embeddings,
    a head) are rarely recomputed. The scale is kept within
    ``[MIN_SCALE, MAX_SCALE]`` and stored in
    ``graph.meta["costs"]["recompute_scale"]`` with what gave it
    (``scale``, ``measured_s``, ``predicted_s``, ``overheads_s``,
    ``blocks``).

    Kept nodes are measured in the same rounds, where the graph has overhead
    figures: a third step runs the blocks' plan keeping in each block the
    node its menu ranks first (``solvers.model.selective.variants``). What
    it adds beyond the blocks' plan, plus the recompute it saves (at the
    scale) less its store entries (``kept_call_s``), over the ATen calls its
    regions run twice through the policy's dispatch modes, is the step's
    ``selective_op_s``, which replaces the calibrated one in the graph's
    figures (``[0, MAX_SELECTIVE_S]``; stored as ``selective_op_s`` beside
    ``calibrated_selective_op_s``). The calibration's small ops measured 11
    us a call; in the step, keeping one node per block added 6.7 ms to
    ResNet's 8 blocks and 7.1 to ConvNeXt's 4, 33-39 us a call, where it
    was to save time: the time page's plans with kept ops had measured 2-3
    ms slower than those without, predicted 0.2-1 ms faster. ViT's came out
    at 5.5 us, Llama's at 0-2.5.

    A region's call is measured in the same rounds too: a step with one
    region over the shortest span around the blocks (``cover_plan`` in
    ``scheduler.tracing.step_plans``: torchvision DenseNet's
    ``features.denseblock3`` around its 24 layers, a ResNet's stages around
    its blocks) recomputes what the blocks' plan does, or a little more, in
    one call. With ``y`` what a plan adds less its overheads other than the
    regions' calls, the blocks' ``y = s P + n r`` and the cover's
    ``y = s P' + r`` give the scale ``s`` and a region's call ``r``, which
    replaces the calibrated ``region_s`` in the graph's figures (stored as
    ``region_s`` beside ``calibrated_region_s``). Where ``s`` falls outside
    its bounds, ``r`` outside ``[0, MAX_REGION_S]``, or the cover recomputes
    over ``MAX_COVER`` times what the blocks do, the scale is the blocks'
    alone, as before, and where there are fewer than ``MIN_COVERED`` blocks
    (the call is read off the difference of ``n`` calls and one, so a
    step's noise reaches it over ``n - 1``: ConvNeXt's 4 blocks read 0.7
    and 2.6 ms a call in two traces). The calibration times a region over one small op: 0.15
    ms a call. In DenseNet-121's step (torch 2.14, one thread, batch 4 at 64
    px) its 24 ``denseblock3`` layers as 24 regions added 66-67 ms, as one
    region 37-45, for the same 36-38 ms of roofline recompute: 1.0-1.3 ms a
    region (each layer's list of inputs through the checkpoint's pytree, its
    hooks, kernels that run slower when each recompute is interleaved with
    the backward); a ResNet's 8 blocks 1.7 ms a region. A
    scale alone put all of it on the FLOPs: DenseNet's came out 1.4-2.4
    over traces, and plans over ``denseblock1``, whose layers cost 3-5 times
    more each, were priced 74 % over their measured time (``time.md`` at
    ``4fbb4c0``).

    Where the trace timed the head's chunk loop at its shape (NOTE [ Chunk
    loops timed at their shapes ]), the rounds also run, for each count it
    timed (the fused head whole, 2 and 4 chunks), a step with the head and
    loss in that many chunks and nothing else. The loop, timed alone,
    priced a GPT-2 head's 2 chunks at 5.7-6.5 ms where the step measured
    8.4-9.0 (its fused head -3.6 to -5.9 ms where the step measured -1.1 to
    -2.3): the step runs the model's own head and loss, not the traced
    graph's, and the isolated loop starts with cold caches. And the gap is
    not one figure for all counts: with it measured at 2 chunks only and
    added to every count, a Llama head in 4 chunks was priced at 5.1 ms and
    measured 18.9-21.5 in the step (``time.md`` at ``f42bc8e``; another
    trace's isolated loop gave 9.3 for the same count). What each count adds
    in the step beyond its figure (``head_offset_s@k``, within
    :data:`MAX_HEAD_OFFSET` of the plain step either way) is added to that
    count's figure (``chunk_times``); a count between or beyond them is read
    off the line through the counts so corrected.

    Each figure is a difference of least times: every side's least time over
    the clean rounds, less the plain step's. It was the median of the rounds'
    differences, which moves with every round where the plain step alone
    was slowed (each difference uses that round's plain run): on an
    untied GPT-2 at hidden 256 (a 32,000-word head, 256 tokens, one thread)
    four traces priced its fused head whole at -25.7 to -1.6 ms, 4 chunks
    at -4.6 to 41.8, with recompute scales 0.60-1.75, where 21 alternated
    rounds of the step measured -3.1, 27.1 and the head's neighbours alike.
    From the same rounds, the least times gave, over four traces idle, the
    fused head -4.4 to -3.6 ms (the median -6.1 to -1.8), 2 chunks -0.6 to
    0.7 (-1.1 to 5.4), 4 chunks 21.7-24.0 (20.7-26.9); beside a busy core
    -6.9 to -4.5 (-11.5 to -4.5), -4.7 to -0.3 (-5.7 to 3.0). On a shared
    machine interference only adds time, so a side's least run is its own
    time; ``benchmarks/time_truth.py`` measures a plan's extra time so.

    Not measured (the roofline as it is): a graph without repeated or
    numbered blocks, a step estimated (FLOPs at the graph's
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
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

from graphs import COSTS_META, Graph
from solvers.model.overheads import CHUNK_TIMES_KEY, graph_overheads, overhead_seconds, with_overheads

from .chunk_times import FAULTS, _page_faults
from .opclasses import no_collection, run_clock
from .step_plans import MAX_COVER, MIN_COVERED, block_plan, cover_plan, head_plans

__all__ = ["SCALE_KEY", "MIN_SCALE", "MAX_SCALE", "MAX_STEP_S", "MAX_PASS_S", "BUDGET_S", "ROUNDS", "MIN_ROUNDS",
           "MAX_HEAD_OFFSET", "MAX_REGION_S", "MAX_COVER", "MIN_COVERED", "block_plan", "cover_plan", "head_plans",
           "measure_scale", "with_recompute_scale", "recompute_scale", "register_applier"]

log = logging.getLogger(__name__)

#: Where a graph carries its measured recompute scale: ``graph.meta["costs"][SCALE_KEY]``.
SCALE_KEY = "recompute_scale"
#: The least and the most a measured scale may be (a measurement beyond them is noise or another effect).
MIN_SCALE, MAX_SCALE = 0.5, 3.0
#: A step estimated to take longer than this (FLOPs at the graph's rate, forward and backward) is not timed.
MAX_STEP_S = 1.5
#: The seconds the timed rounds may take, at the warm-up's pace; the most rounds and the fewest.
BUDGET_S, ROUNDS, MIN_ROUNDS = 6.0, 9, 5
#: The most seconds a pass (the plain step and the planned ones) may take to be timed.
MAX_PASS_S = 4.0
#: The most a measured ``selective_op_s`` may be (seconds per call; the calibration measured 11 us).
MAX_SELECTIVE_S = 1e-4
#: The most the head's loop may add in the step beyond its figure, either way, as a fraction of the plain step.
MAX_HEAD_OFFSET = 0.15
#: The most a region's call may cost as measured in the step (seconds; the calibration's is about 0.15 ms,
#: DenseNet's and ResNet's blocks read 1.0-1.7 ms; an 8-layer GPT-2 read 8.8 in a step whose cover ran 56 ms under
#: its blocks with glibc's allocator and 26 ms over them with the steady one: another effect than the call).
MAX_REGION_S = 2.5e-3


#: ``(planned, applied_plan)`` of ``scheduler.applying``, which registers them when it is imported
#: (:func:`register_applier`): the step is measured as the applier runs a plan, and tracing, a layer below the
#: applier, imports nothing of it.
_APPLIER: tuple[Callable[[Any, Any], Any], Callable[[Any], Any]] | None = None


def register_applier(planned: Callable[[Any, Any], Any], applied_plan: Callable[[Any], Any]) -> None:
    """Called by ``scheduler.applying`` on import: how a plan runs for one step, and the plan a model carries."""
    global _APPLIER
    _APPLIER = (planned, applied_plan)


def measure_scale(graph: Graph, plain: Callable[[], Any], planned: Callable[[], Any], plan: Any, *,
                  kept: Callable[[], Any] | None = None, kept_plan: Any = None,
                  whole: Callable[[], Any] | None = None, whole_plan: Any = None,
                  heads: Mapping[str, tuple[Callable[[], Any], Any]] | None = None,
                  clock: Callable[[], float] | None = None, rounds: int = ROUNDS, budget_s: float = BUDGET_S
                  ) -> dict[str, float] | None:
    """The recompute scale (NOTE [ Recompute timed in the step ]) from ``plain()`` and ``planned()`` (one step
    each), ``plan`` the planned step's plan on ``graph``; with ``whole()``, the step of ``whole_plan``
    (:func:`cover_plan`), a region's call too (``region_s``, where ``graph`` has overhead figures); with
    ``kept()``, the step of ``kept_plan`` (``plan`` keeping nodes), the per-call cost of the
    selective policy (``selective_op_s``, where ``graph`` has overhead figures); with ``heads``,
    ``{k: (step, plan)}`` for counts of the head's loop alone (:func:`head_plans`), what each adds in the step
    beyond its prediction (``head_offset_s@k``, its prediction ``head_expected_s@k``). None where the steps are
    too slow to time or ``plan`` recomputes nothing by the graph.
    ``clock`` times the runs and the budgets (default: :func:`run_clock` for the runs, the wall clock for the
    budgets)."""
    from solvers import simulate

    wall = clock or time.perf_counter
    clock = clock or run_clock()
    predicted = simulate(graph, plan, record=False).recompute_time_s
    if not predicted or predicted <= 0:
        return None
    figures = graph_overheads(graph)
    sides, at = [plain, planned], {}
    for name, run, p in (("whole", whole, whole_plan), ("kept", kept, kept_plan)):
        if run is not None and p is not None and figures is not None:
            at[name] = len(sides)
            sides.append(run)
    at_head = len(sides)
    heads = dict(heads or {})
    sides += [run for run, _ in heads.values()]
    with no_collection():
        times = _rounds(sides, clock, wall, rounds, budget_s)
    if times is None:
        return None
    least = [min(t[i] for t in times) for i in range(len(sides))]  # least times (NOTE [ Recompute timed in the step ])
    measured = least[1] - least[0]
    overheads = sum(overhead_seconds(graph, plan.regions).values())
    scale = min(MAX_SCALE, max(MIN_SCALE, (measured - overheads) / predicted))
    out = {"scale": scale, "measured_s": measured, "predicted_s": predicted, "overheads_s": overheads,
           "blocks": float(len(plan.regions))}
    if "whole" in at:
        fit = _region_call(graph, plan, measured, predicted, whole_plan, least[at["whole"]] - least[0])
        out.update(fit)
        scale = out["scale"]
    bound = MAX_HEAD_OFFSET * least[0]
    for i, (k, (_, hp)) in enumerate(heads.items(), at_head):  # each count in the step against its figure
        sim = simulate(_priced(graph, out), hp, record=False)  # at the scale, with its overheads (the loop's among them)
        expected = scale * (sim.recompute_time_s or 0.0) + sum((sim.overhead_s or {}).values())
        offset = least[i] - least[0] - expected
        out.update({f"head_offset_s@{k}": min(bound, max(-bound, offset)), f"head_expected_s@{k}": expected})
    if "kept" in at:
        # what keeping adds beyond the blocks' plan, less its recompute saved (at the scale) and its store entries,
        # per call its selective regions run twice (NOTE [ Plan overheads ])
        added = least[at["kept"]] - least[1]
        saved = scale * (predicted - simulate(graph, kept_plan, record=False).recompute_time_s)
        calls = _selective_calls(graph, kept_plan)
        if calls > 0:
            per_call = (added + saved - figures.kept_call_s * len(kept_plan.saved)) / (2 * calls)
            out.update(selective_op_s=min(MAX_SELECTIVE_S, max(0.0, per_call)), kept=float(len(kept_plan.saved)),
                       kept_added_s=added, calibrated_selective_op_s=figures.selective_op_s)
    return out


def _region_call(graph: Graph, plan: Any, measured: float, predicted: float, whole_plan: Any, whole_measured: float
                 ) -> dict[str, float]:
    """The scale and a region's call fitted to the blocks' plan (``measured`` beyond the plain step, ``predicted``
    recompute) and the cover's (NOTE [ Recompute timed in the step ]); the cover's figures alone where the fit
    falls outside the bounds (the scale from the blocks stands)."""
    from solvers import simulate

    def rest(p: Any) -> float:  # the plan's overheads but its regions' calls
        terms = overhead_seconds(graph, p.regions)
        return sum(terms.values()) - terms["regions"]

    n, wp = len(plan.regions), simulate(graph, whole_plan, record=False).recompute_time_s or 0.0
    yb, yw = measured - rest(plan), whole_measured - rest(whole_plan)
    out = {"whole_measured_s": whole_measured, "whole_predicted_s": wp}
    if n < 2 or wp <= 0 or predicted - n * wp >= 0:
        return out
    s = (yb - n * yw) / (predicted - n * wp)  # yb = s P + n r, yw = s P' + r
    r = yw - s * wp
    r = 0.0 if -1e-6 < r < 0.0 else r  # a microsecond under 0 is 0: no clock here reads finer
    if MIN_SCALE <= s <= MAX_SCALE and 0.0 <= r <= MAX_REGION_S:
        figures = graph_overheads(graph)
        out.update(scale=s, region_s=r, calibrated_region_s=figures.region_s if figures else 0.0,
                   overheads_s=rest(plan) + n * r)
    return out


def _priced(graph: Graph, found: Mapping[str, float]) -> Graph:
    """``graph`` with its ``region_s`` figure ``found["region_s"]`` where measured."""
    import dataclasses

    figures = graph_overheads(graph)
    if figures is None or "region_s" not in found:
        return graph
    return with_overheads(graph, dataclasses.replace(figures, region_s=float(found["region_s"])))


def _selective_calls(graph: Graph, plan: Any) -> int:
    """The ATen calls of ``plan``'s regions that keep a node, those the policy's dispatch modes see in the forward
    and again in the recompute (the count ``overhead_seconds`` prices; NOTE [ Plan overheads ])."""
    return sum(max(1, len(graph.nodes[i].dispatch)) for a, b in plan.regions
               if any(a <= k <= b for k in plan.saved) for i in range(a, b + 1))


def _rounds(sides: Sequence[Callable[[], Any]], clock: Callable[[], float], wall: Callable[[], float], rounds: int,
            budget_s: float, faults: Callable[[], int] = _page_faults) -> list[tuple[float, ...]] | None:
    """Each round's times of ``sides`` (one step each), run in turn (ABC CBA...) by ``clock``: after two warm-up
    passes, as many rounds as ``budget_s`` holds at the second pass's pace by ``wall`` (:data:`MIN_ROUNDS` to
    ``rounds``), none started once three budgets are spent (two at least). A round's steps share its stretch of
    the machine's load; each side's least time over the rounds is its figure (NOTE [ Recompute timed in the
    step ]: the median of the rounds' differences moved with every slow plain run). A round with a step
    that faulted pages in (more than ``FAULTS``, as NOTE [ Chunk loops timed at their shapes ] says) counts only
    where every round had one: with glibc's defaults a GPT-2 step's plain run once measured 29 ms more than its
    planned one. None where a pass takes over :data:`MAX_PASS_S` by ``clock``."""
    started = wall()
    pace = 0.0
    for p in range(2):
        t0, c0 = wall(), clock()
        for run in sides:
            run()
        pace = wall() - t0
        if clock() - c0 > MAX_PASS_S * (2 - p):
            return None
    rounds = max(min(MIN_ROUNDS, rounds), min(rounds, int(budget_s / pace) if pace > 0 else rounds))
    clean, faulted = [], []
    for r in range(rounds):
        if r >= 2 and wall() - started > 3 * budget_s:
            break
        took = [0.0] * len(sides)
        pages = 0
        for i in (range(len(sides)) if r % 2 == 0 else reversed(range(len(sides)))):
            f0, c0 = faults(), clock()
            sides[i]()
            took[i] = clock() - c0
            pages = max(pages, faults() - f0)
        (faulted if pages > FAULTS else clean).append(tuple(took))
    return clean or faulted


def with_recompute_scale(graph: Graph, found: Mapping[str, float], head_call: str | None = None) -> Graph:
    """``graph`` with every node's ``fwd_cost`` times ``found["scale"]``, its ``selective_op_s`` and
    ``region_s`` figures ``found``'s where measured, each timed count ``k`` of ``head_call``'s loop plus
    ``found["head_offset_s@k"]`` where measured, and ``found`` in its costs' meta."""
    import dataclasses

    scale = float(found["scale"])
    costs = dict(graph.meta.get(COSTS_META) or {})
    costs[SCALE_KEY] = {k: float(v) for k, v in found.items()}
    loops = costs.get(CHUNK_TIMES_KEY)
    if head_call is not None and isinstance(loops, Mapping) and isinstance(loops.get(head_call), Mapping):
        table = {str(k): float(v) + float(found.get(f"head_offset_s@{k}", 0.0)) for k, v in loops[head_call].items()}
        costs[CHUNK_TIMES_KEY] = {**loops, head_call: table}
    nodes = [dataclasses.replace(nd, fwd_cost=int(round(nd.fwd_cost * scale))) for nd in graph.nodes]
    out = graph.with_nodes(nodes, meta={**graph.meta, COSTS_META: costs})
    figures = graph_overheads(graph)
    measured = {k: float(found[k]) for k in ("selective_op_s", "region_s") if k in found}
    if figures is not None and measured:  # the policy's per-call cost and a region's call as measured in the step
        out = with_overheads(out, dataclasses.replace(figures, **measured))
    return out


def recompute_scale(model: Any, graph: Graph, args: Sequence[Any], kwargs: Mapping[str, Any],
                    loss: Callable[[Any], Any] | None, *, clock: Callable[[], float] | None = None,
                    rounds: int = ROUNDS, budget_s: float = BUDGET_S) -> Graph:
    """``graph`` with its recompute scale measured on ``model`` (NOTE [ Recompute timed in the step ]), or
    ``graph`` as it is where it is not measured."""
    import torch

    from ..measuring.training import clear_grads, training_step

    rate = (graph.meta.get(COSTS_META) or {}).get("flops_per_s")
    plan = block_plan(graph)
    if _APPLIER is None:
        log.info("recompute scale: the applier is not loaded (import scheduler.applying); the roofline as it is")
        return graph
    planned, applied_plan = _APPLIER
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
    priced = graph_overheads(graph) is not None  # figures a measurement can replace
    whole_plan = cover_plan(graph, plan) if priced else None
    kept_plan = block_plan(graph, kept=True) if priced else None

    def step(module: Any) -> Callable[[], None]:
        def go() -> None:
            clear_grads(model)
            training_step(module, args, kwargs, loss, loop=loop)
        return go

    applier = logging.getLogger("scheduler.applying")
    level = applier.level
    applier.setLevel(max(logging.WARNING, applier.getEffectiveLevel()))  # a line per step applied: not the user's
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the applier's, about plans of this measurement only
            whole = step(planned(model, whole_plan)) if whole_plan is not None else None
            try:
                whole and whole()
            except Exception as exc:  # noqa: BLE001  (a cover that does not run so: the calibrated region figure)
                log.info("could not time %s's blocks as one region (%s: %s)", graph.name, type(exc).__name__, exc)
                whole = None
            kept = step(planned(model, kept_plan)) if kept_plan is not None else None
            try:
                kept and kept()
            except Exception as exc:  # noqa: BLE001  (a policy that does not run so: the calibrated figure)
                log.info("could not time %s's blocks with kept nodes (%s: %s)", graph.name, type(exc).__name__, exc)
                kept = None
            head_call, counts = head_plans(graph) or (None, {})
            heads = {}
            for k, hp in counts.items():
                try:
                    heads[k] = (step(planned(model, hp)), hp)
                    heads[k][0]()
                except Exception as exc:  # noqa: BLE001  (a loop that does not run so: its figure as timed)
                    log.info("could not time %s's head in %s chunks in the step (%s: %s)", graph.name, k,
                             type(exc).__name__, exc)
                    heads.pop(k, None)
            found = measure_scale(graph, step(model), step(planned(model, plan)), plan, clock=clock, rounds=rounds,
                                  budget_s=budget_s, kept_plan=kept_plan, kept=kept, whole=whole,
                                  whole_plan=whole_plan, heads=heads)
    except Exception as exc:  # noqa: BLE001  (a step that does not run so: the roofline as it is)
        log.info("could not time the recompute of %s's blocks (%s: %s); the roofline prices it", graph.name,
                 type(exc).__name__, exc)
        return graph
    finally:
        applier.setLevel(level)
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
    if "region_s" in found:
        log.info("as one region they added %.1f ms: %.2f ms per region's call (calibrated %.2f), recompute scale %.2f",
                 1e3 * found["whole_measured_s"], 1e3 * found["region_s"], 1e3 * found["calibrated_region_s"],
                 found["scale"])
    if "selective_op_s" in found:
        log.info("keeping %d nodes in them added %.1f ms: %.1f us per call of a selective region (calibrated %.1f)",
                 found["kept"], 1e3 * found["kept_added_s"], 1e6 * found["selective_op_s"],
                 1e6 * found["calibrated_selective_op_s"])
    for key in sorted(k for k in found if k.startswith("head_offset_s@")):
        k = key.split("@", 1)[1]
        log.info("its head in %s chunk(s) added %+.1f ms in the step beyond its loop's figure (%.1f ms)", k,
                 1e3 * found[key], 1e3 * found[f"head_expected_s@{k}"])
    return with_recompute_scale(graph, found, head_call)
