"""Issue 35: our plans compiled with inductor against torch.compile's own activation memory budget.

For transformers GPT-2 and Llama (small configs), a torchvision ViT and a
torchvision ResNet-18 at a small input, each wrapped so that a call returns
the loss, on one torch thread, in one process:

* the compiled unplanned step (``torch.compile``, inductor, budget 1.0): its
  peak, its step time, and its gradients, the reference of every row;
* compile's own knob, ``torch._functorch.config.activation_memory_budget``
  at 0.1, 0.3, 0.5, 0.7 and 0.9 (every call of that model runs inside the
  config patch);
* our plan (``ilp`` over regions and kept calls: NOTE [ Kept calls under torch.compile ]; LM heads in
  ``CHUNKS``) for each of their measured peaks, applied onto a copy of the model and compiled with
  inductor at budget 1.0, its eager budget searched by what the plans measure (NOTE [ Compile-aware
  budget ] in ``scheduler/sizing/compiled.py``: at most ``SOLVES`` solves and ``COMPILES`` compiles a row);
* our plan below compile's least peak (``BELOW`` of it), where ours reaches; under our least feasible
  eager budget, the floor's plan measured;
* the model's ``FAMILIES`` largest families of module calls (its blocks, their MLPs...), each call a region,
  measured as plans too, and so are plans solved with the recompute priced as inductor runs it
  (``inductor_costs``: fused calls almost free) at ``SWEEP`` eager budgets from the floor up, and plans that
  keep what compile's partitioner keeps (``kernel_plans``: the outermost calls as regions, their GEMMs,
  convolutions, attention and lookups kept, less the cheapest per byte); of the plans measured at or under a target, the fastest
  (each timed once compiled, ``SEARCH_REPEATS`` rounds alternated with the unplanned step) is kept;
* where ours at its floor measures over a target, dp's least-peak plan, on a language model ours at
  each head chunk count alone, and a coarse plan of no solver's (every child of the model a region)
  are measured too;
* where inductor's unplanned step measures over our prediction (ResNet-18), that step again with
  inductor's layout optimization off: what the channels-last copies cost.

Peaks are the allocator's (the profiler's memory events, whole step:
``scheduler.measuring.steps.allocator_step_peak``); the step time of a pair is
the median of ``REPEATS`` alternated rounds (plain, compile's, ours; the
order rotates); gradients are the largest difference from the compiled
unplanned step's over the largest reference gradient. Our prediction
(``simulate``, an eager prediction) is beside each measured peak of ours: the
bound that issue 35 asks for under inductor. Dropout is off (inductor draws
its own random numbers; gradients are compared without them). Runs in the venv of ``thirdparty`` (torchvision); writes
``benchmarks/results/compile.json`` and ``compile.md``. ``main(quick=True)``
runs two tiny models with fewer budgets (tests).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from scheduler.sizing.compiled import (Fit, Search, best_fit, family_plans, graph_of, inductor_costs, kernel_plans,
                                       plan_key, sweep_plans, unfused_twin)
from benchmarks.pages import out_dir, write_page
from benchmarks.steady import steady_allocator

log = logging.getLogger("benchmarks.compile")

#: torch intra-op threads while measuring (the machine is shared: one thread is steadier).
THREADS = 1
#: Alternated rounds per pair (median of each side's steps).
REPEATS = 9
#: Timed calls per side and round (its least is the round's: interference on a shared machine only adds time).
TIMED = 2
#: torch.compile's activation_memory_budget fractions.
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
#: Solves and new compiles of ours per row at most (NOTE [ Compile-aware budget ]).
SOLVES = 6
COMPILES = 3
#: The model's largest families of module calls measured as plans (``scheduler.sizing.compiled.family_plans``).
FAMILIES = 3
#: Plans solved with the recompute priced as inductor runs it, at this many eager budgets from the floor up.
SWEEP = 8
#: Rounds that time each plan the search compiles, alternated with the unplanned step (the fastest that fits a
#: target is kept; its time relative to the unplanned step's in the same rounds).
SEARCH_REPEATS = 5
#: Ours below compile's least peak: at this fraction of it.
BELOW = 0.9
SOLVER = "ilp"
#: ilp plans over regions and the nodes they keep; these graphs solve in under a second.
SOLVER_OPTIONS: dict[str, Any] = {"time_limit_s": 20}
#: Solvers whose least-peak plan is measured too when ours at its floor measures over a target; on a language
#: model, so is ours at each head chunk count alone: inductor does not keep the eager order of peaks.
OTHER_SOLVERS: tuple[tuple[str, dict[str, Any]], ...] = (("dp", {"selective": True}),)
#: Chunk counts the solver may run a language model's head and loss in (NOTE [ Chunked head ]).
CHUNKS = (1, 2, 4, 8)

#: name -> sizes: compile in a minute or two each on a 2-core CPU.
MODELS: dict[str, dict[str, int]] = {
    "gpt2": dict(layers=2, width=128, heads=4, vocab=2048, batch=4, seq=128),
    "resnet18": dict(batch=8, image=64),
    "llama": dict(layers=2, width=128, heads=4, vocab=2048, batch=4, seq=128),
    "vit": dict(layers=2, width=128, heads=4, image=64, patch=8, batch=8),
}
QUICK_MODELS: dict[str, dict[str, int]] = {
    "gpt2": dict(layers=1, width=32, heads=2, vocab=256, batch=2, seq=32),
    "resnet18": dict(batch=2, image=32),
}
QUICK_FRACTIONS = (0.3, 0.7)


# --------------------------------------------------------------------------- the models
class LmStep(nn.Module):
    """A transformers causal LM whose call returns its loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, labels=ids).loss


class VisionStep(nn.Module):
    """A classifier whose call returns its cross-entropy."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.m(x), y)


def build(name: str, o: dict[str, int]) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (random weights, seed 0, training mode, dropout off) and its inputs."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    if name in ("gpt2", "llama"):
        import transformers

        if name == "gpt2":
            cfg = transformers.GPT2Config(n_layer=o["layers"], n_embd=o["width"], n_head=o["heads"],
                                          vocab_size=o["vocab"], n_positions=o["seq"], use_cache=False,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                          bos_token_id=0, eos_token_id=0)
            model = transformers.GPT2LMHeadModel(cfg)
        else:
            cfg = transformers.LlamaConfig(hidden_size=o["width"], intermediate_size=o["width"] * 8 // 3,
                                           num_hidden_layers=o["layers"], num_attention_heads=o["heads"],
                                           num_key_value_heads=max(1, o["heads"] // 2), vocab_size=o["vocab"],
                                           max_position_embeddings=o["seq"], use_cache=False,
                                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
            model = transformers.LlamaForCausalLM(cfg)
        ids = torch.randint(0, o["vocab"], (o["batch"], o["seq"]), generator=gen)
        return LmStep(model).train(), (ids,)
    import torchvision

    if name == "vit":
        model = torchvision.models.VisionTransformer(image_size=o["image"], patch_size=o["patch"],
                                                     num_layers=o["layers"], num_heads=o["heads"],
                                                     hidden_dim=o["width"], mlp_dim=4 * o["width"], num_classes=10)
    elif name == "resnet18":
        model = torchvision.models.resnet18(num_classes=10)
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    x = torch.randn(o["batch"], 3, o["image"], o["image"], generator=gen)
    y = torch.randint(0, 10, (o["batch"],), generator=gen)
    return VisionStep(model).train(), (x, y)


# --------------------------------------------------------------------------- one compiled side
@dataclass
class Side:
    """One compiled step: a copy of the model, its compiled call, the budget every call runs under."""

    label: str
    model: nn.Module
    fn: Callable[..., Any]
    fraction: float
    compile_s: float = 0.0

    def call(self, args: tuple) -> torch.Tensor:
        with torch._functorch.config.patch(activation_memory_budget=self.fraction):
            for p in self.model.parameters():
                p.grad = None
            loss = self.fn(*args)
            loss.backward()
            return loss.detach()

    def peak(self, args: tuple) -> int:
        from scheduler.measuring.steps import allocator_step_peak

        with torch._functorch.config.patch(activation_memory_budget=self.fraction):
            return allocator_step_peak(self.fn, self.model, args, {}, None)

    def grads(self) -> dict[str, torch.Tensor]:
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}


def own_backend() -> Callable[..., Any]:
    """Inductor behind a function of its own. Dynamo's cache is per code object and a copy of a model passes
    the guards of the copy compiled before it (its graph, partitioned at another budget or without a plan,
    would run); its entries are also per backend, so each side gets its own backend and its own compile."""
    from torch._dynamo.backends.registry import lookup_backend

    inductor = lookup_backend("inductor")

    def backend(gm: Any, example_inputs: Any) -> Any:
        return inductor(gm, example_inputs)

    return backend


def compiled(label: str, model: nn.Module, args: tuple, fraction: float = 1.0) -> Side:
    """``model`` compiled with inductor under ``fraction``, compiled by two warm-up steps."""
    side = Side(label, model, torch.compile(model, backend=own_backend()), fraction)
    t0 = time.perf_counter()
    side.call(args)
    side.compile_s = time.perf_counter() - t0
    side.call(args)
    return side


def bound_of(model: nn.Module, plan: Any, args: tuple, graph: Any, fraction: float = 1.0) -> dict[str, Any]:
    """The compiled peak bound of ``model`` with ``plan`` under compile's ``fraction`` (NOTE [ Compiled peak
    bound ]), read on fake tensors."""
    from scheduler.measuring.inductor import compiled_bound

    t0 = time.perf_counter()
    try:
        with torch._functorch.config.patch(activation_memory_budget=fraction):
            b = compiled_bound(model, plan, args, graph=graph)
    except Exception as exc:  # a finding for the page, not the end of the run
        log.warning("compile: the bound failed", exc_info=True)
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return {"bound_bytes": b.bound_bytes, "fused_bytes": b.fused_bytes, "layout_bytes": b.layout_bytes,
            "graphs": b.graphs, "eager_nodes": b.eager_nodes, "guaranteed": b.guaranteed,
            "read_s": time.perf_counter() - t0}


def grad_diff(side: Side, reference: dict[str, torch.Tensor]) -> float:
    """Largest |g - ref| over the largest |ref| (0: bitwise)."""
    got = side.grads()
    scale = max(float(g.abs().max()) for g in reference.values())
    worst = max(float((got[n].double() - g.double()).abs().max()) if n in got else float("inf")
                for n, g in reference.items())
    return worst / scale


def rounds(sides: list[Side], args: tuple, repeats: int) -> list[float]:
    """Median step time of each side over ``repeats`` alternated rounds (:func:`round_times`)."""
    return [statistics.median(t) for t in round_times(sides, args, repeats)]


def quartiles(values: list[float]) -> list[float]:
    """The first quartile, median and third quartile of ``values``."""
    if len(values) < 2:
        return [values[0]] * 3
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, statistics.median(values), q3]


def round_times(sides: list[Side], args: tuple, repeats: int) -> list[list[float]]:
    """Each side's step time in each of ``repeats`` alternated rounds (the order rotates each round), a round's
    time the least of :data:`TIMED` calls."""
    times: list[list[float]] = [[] for _ in sides]
    for r in range(repeats):
        order = list(range(len(sides)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            best = float("inf")
            for _ in range(TIMED):
                t0 = time.perf_counter()
                sides[i].call(args)
                best = min(best, time.perf_counter() - t0)
            times[i].append(best)
    return times


# --------------------------------------------------------------------------- one model
def searchers(graph: Any, model: nn.Module, args: tuple, plain: tuple[int, int], made: dict[tuple, Side],
              chunks: tuple[int, ...] | None, reference: Side, bounds: dict[tuple, dict[str, Any]]) -> list[Search]:
    """The compile-aware searches of one model (NOTE [ Compile-aware budget ]): our solver at an eager budget,
    each new plan applied onto a copy of the model, compiled with inductor and measured; ``made`` keeps the
    compiled copies (by plan) for the rounds that time them. With a ``chunks`` menu, a second search without it
    (sharing what was compiled): inductor measured a small Llama's plan of 4 regions at 12.61 MiB, its least-peak
    plan with the head in 8 chunks at 15.98."""
    import scheduler
    from solvers.errors import InfeasibleBudget

    def solve(budget: int) -> Any:
        return scheduler.solve(graph, budget=budget, solver=SOLVER, chunks=chunks, **SOLVER_OPTIONS)

    def least(solver: str, menu: tuple[int, ...] | None = chunks, **options: Any) -> Callable[[], Any]:
        def plan() -> Any:
            try:
                return scheduler.solve(graph, budget=1, solver=solver, chunks=menu, **options)
            except InfeasibleBudget as exc:
                return scheduler.solve(graph, budget=exc.min_feasible_bytes, solver=solver, chunks=menu, **options)
        return plan

    base = rounds([reference], args, SEARCH_REPEATS)[0]

    def measure(plan: Any) -> tuple[int, float]:  # its peak, and its step timed (the plan kept is the fastest)
        planned = copy.deepcopy(model)
        scheduler.apply(planned, plan)
        side = made[plan_key(plan)] = compiled("ours", planned, args)
        bounds[plan_key(plan)] = bound_of(model, plan, args, graph_of(plan, graph, twin))  # its bound beside
        ref, took = rounds([reference, side], args, SEARCH_REPEATS)  # beside the unplanned step: the machine's
        return side.peak(args), base * took / ref  # pace at the time cancels

    twin = unfused_twin(graph, chunks)  # the head unfused, where the menu fuses it (NOTE [ Compile-aware budget ])

    def cost(plan: Any) -> float:  # simulated: a plan of no solver (the coarse one) carries no solver's figure
        sim = scheduler.simulate(graph_of(plan, graph, twin), plan)
        return (sim.recompute_time_s or 0.0) + sum((sim.overhead_s or {}).values())

    def unfused(k: int) -> Callable[[], Any]:  # the floor with the head unfused, at one chunk count
        def plan() -> Any:
            try:
                return scheduler.solve(twin, budget=1, solver=SOLVER, chunks=(k,), **SOLVER_OPTIONS)
            except InfeasibleBudget as exc:
                return scheduler.solve(twin, budget=exc.min_feasible_bytes, solver=SOLVER, chunks=(k,),
                                       **SOLVER_OPTIONS)
        return plan

    def predict(plan: Any) -> int:
        return scheduler.simulate(graph_of(plan, graph, twin), plan).peak_bytes

    search = Search(solve, measure, predict, key=plan_key, cost=cost, plain=plain,
                    others=[("floor plan", least(s, **o)) for s, o in OTHER_SOLVERS]
                    + [("floor plan", least(SOLVER, (k,), **SOLVER_OPTIONS)) for k in chunks or ()]
                    + [("floor plan, head unfused", unfused(k)) for k in (chunks or ()) if twin is not None and k > 1]
                    + [("coarse plan", lambda: coarse_plan(graph))],
                    candidates=family_plans(graph, FAMILIES) + kernel_plans(graph)
                    + sweep_plans(lambda g, b: scheduler.solve(g, budget=b, solver=SOLVER, **SOLVER_OPTIONS),
                                  inductor_costs(graph), plain[0], SWEEP))  # the head whole (chunked: over, above)
    if not any(k > 1 for k in chunks or ()):
        return [search]
    whole = Search(lambda budget: scheduler.solve(graph, budget=budget, solver=SOLVER, **SOLVER_OPTIONS), measure,
                   predict, key=plan_key, cost=cost, plain=plain, measured=search.measured)
    return [search, whole]


def ours_row(fit: Fit, made: dict[tuple, Side], bounds: dict[tuple, dict[str, Any]]
             ) -> tuple[Side | None, dict[str, Any]]:
    """Our plan for a measured peak of at most ``fit.target`` bytes, and its row (NOTE [ Compile-aware budget ])."""
    row: dict[str, Any] = {"target_bytes": fit.target, "solves": fit.solves, "compiles": fit.compiles,
                           "reached": fit.reached, "at_floor": fit.at_floor, "label": fit.label,
                           "tries": [[p.budget, p.predicted, p.measured, p.time_s,
                                      bounds.get(p.key, {}).get("bound_bytes")] for p in fit.tries]}
    if fit.floor is not None:
        row["floor_bytes"] = fit.floor
    if fit.point is None:
        return None, row
    plan, side = fit.point.plan, made[fit.point.key]
    row.update(budget_bytes=fit.point.budget, peak_bytes=fit.point.measured, predicted_bytes=fit.point.predicted,
               regions=len(plan.modules), kept=sum(len(r) for r in plan.save_ops),
               chunks=max((k for _, _, k in plan.chunks), default=1), compile_s=side.compile_s,
               search_time_s=fit.point.time_s, bound=bounds.get(fit.point.key))
    return side, row


def fits_for(searches: list[Search], targets: list[int], name: str) -> list[Fit | Exception]:
    """Every target searched by each search, lowest first (its points bracket the next ones), then each target's
    plan chosen again among every point measured, the fastest of the searches' (NOTE [ Compile-aware budget ])."""
    out: dict[int, list[Fit] | Exception] = {}
    for i in sorted(range(len(targets)), key=lambda i: targets[i]):
        try:
            out[i] = [search.fit(targets[i], compiles=COMPILES, solves=SOLVES) for search in searches]
        except Exception as exc:  # one failing row is a finding, not the end of the run
            log.warning("compile: %s ours at %d B failed", name, targets[i], exc_info=True)
            out[i] = exc
    return [best_fit([s.pick(f) for s, f in zip(searches, fits)]) if isinstance(fits, list) else fits
            for fits in (out[i] for i in range(len(targets)))]


def flat_layout(model: nn.Module, args: tuple, plain: Side, repeats: int) -> dict[str, Any]:
    """Where inductor measures over our prediction: the unplanned step compiled with inductor's layout
    optimization off (``torch._inductor.config.layout_optimization``: on, the convolutions run channels-last,
    on channels-last copies of their weights that the compiled forward hands to the backward)."""
    with torch._inductor.config.patch(layout_optimization=False):
        flat = compiled("plain, layout_optimization off", copy.deepcopy(model), args)
        times = rounds([plain, flat], args, repeats)
        return {"peak_bytes": flat.peak(args), "time_s": times[1], "plain_time_s": times[0],
                "compile_s": flat.compile_s}


def coarse_plan(graph: Any) -> Any:
    """A plan none of our solvers chooses: every child of the wrapped model (``m``) that is a call of the
    graph its own region (NOTE [ Compile-aware budget ]: inductor may measure it under the floor's plan)."""
    from solvers import Plan

    spans = sorted((sp.first, sp.last) for sp in graph.spans if sp.module.count(".") == 1 and sp.module.startswith("m."))
    regions: list[tuple[int, int]] = []
    for a, b in spans:
        if not regions or a > regions[-1][1]:
            regions.append((a, b))
    return Plan.from_regions(graph, regions)


def run_model(name: str, opts: dict[str, int], fractions: tuple[float, ...], repeats: int) -> dict[str, Any]:
    import scheduler

    t0 = time.perf_counter()
    model, args = build(name, opts)
    graph = scheduler.trace(copy.deepcopy(model), args)
    torch._dynamo.reset()
    plain = compiled("plain", copy.deepcopy(model), args)
    torch.manual_seed(0)
    plain.call(args)
    reference = plain.grads()
    entry: dict[str, Any] = {"model": name, "options": opts, "graph_nodes": len(graph),
                             "plain": {"peak_bytes": plain.peak(args), "compile_s": plain.compile_s,
                                       "predicted_bytes": scheduler.simulate(graph).peak_bytes,
                                       "bound": bound_of(model, None, args, graph)},
                             "rows": []}
    log.info("compile: %s plain %.1f MiB, compiled in %.0f s", name, entry["plain"]["peak_bytes"] / 2**20,
             plain.compile_s)
    if entry["plain"]["peak_bytes"] > entry["plain"]["predicted_bytes"]:
        entry["plain"]["flat"] = flat_layout(model, args, plain, repeats)
    made: dict[tuple, Side] = {}
    bounds: dict[tuple, dict[str, Any]] = {}
    chunks = CHUNKS if isinstance(model, LmStep) else None  # the head and its loss in row chunks
    search = searchers(graph, model, args, (entry["plain"]["predicted_bytes"], entry["plain"]["peak_bytes"]), made,
                       chunks, plain, bounds)
    theirs: list[tuple[Side, dict[str, Any]]] = []
    for f in fractions:
        side = compiled(f"compile@{f:g}", copy.deepcopy(model), args, fraction=f)
        their = {"fraction": f, "peak_bytes": side.peak(args), "compile_s": side.compile_s,
                 "bound": bound_of(model, None, args, graph, fraction=f)}
        side.call(args)
        their["grad_diff"] = grad_diff(side, reference)
        theirs.append((side, their))
    least = min(t["peak_bytes"] for _, t in theirs)
    targets = [t["peak_bytes"] for _, t in theirs] + [int(least * BELOW)]
    rows = []
    for fit in fits_for(search, targets, name):
        if isinstance(fit, Exception):
            rows.append((None, {"solves": 0, "reached": False, "reason": f"{type(fit).__name__}: {fit}"[:200]}))
            continue
        side, ours = ours_row(fit, made, bounds)
        if side is not None:
            side.call(args)
            ours["grad_diff"] = grad_diff(side, reference)
        rows.append((side, ours))
    for (theirs_side, their), (side, ours) in zip(theirs, rows):
        each = round_times([plain, theirs_side] + ([side] if side is not None else []), args, repeats)
        times = [statistics.median(t) for t in each]
        their["time_s"] = times[1]
        if len(times) > 2:  # ours over compile's round by round: how far one round's ratio moves
            ours["time_s"] = times[2]
            ours["ratio_quartiles"] = quartiles([o / t for o, t in zip(each[2], each[1])])
        entry["rows"].append({"theirs": their, "ours": ours, "plain_time_s": times[0]})
        log.info("compile: %s @%g theirs %.1f MiB %.1f ms, ours %s", name, their["fraction"],
                 their["peak_bytes"] / 2**20, their["time_s"] * 1e3,
                 {k: v for k, v in ours.items() if k in ("peak_bytes", "time_s", "solves")})
    side, below = rows[-1]
    if side is not None:
        times = rounds([plain, side], args, repeats)
        below["time_s"], below["plain_time_s"] = times[1], times[0]
    entry["below"] = below
    entry["least_theirs_bytes"] = least
    made.clear()
    theirs.clear()
    torch._dynamo.reset()
    entry["wall_s"] = time.perf_counter() - t0
    return entry


def run(quick: bool = False, done: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every model's rows; ``done(doc)`` after each model (the page is written as the models finish)."""
    models = QUICK_MODELS if quick else MODELS
    fractions = QUICK_FRACTIONS if quick else FRACTIONS
    repeats = 2 if quick else REPEATS
    out: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
                           "torch": torch.__version__, "python": sys.executable, "threads": THREADS,
                           "repeats": repeats, "timed": TIMED, "solver": SOLVER, "fractions": list(fractions), "solves": SOLVES,
                           "compiles": COMPILES, "families": FAMILIES, "sweep": SWEEP, "search_repeats": SEARCH_REPEATS, "chunks": max(CHUNKS), "below": BELOW, "models": []}
    out["allocator"] = steady_allocator()
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    limits = torch._dynamo.config.patch(recompile_limit=64)  # every side compiled apart: own_backend
    limits.__enter__()
    try:
        for name, opts in models.items():
            try:
                out["models"].append(run_model(name, opts, fractions, repeats))
            except ImportError as exc:  # torchvision in the venv of thirdparty only
                log.warning("compile: %s skipped: %s", name, exc)
                out["models"].append({"model": name, "options": opts, "skipped": str(exc)})
            if done is not None:
                done(out)
    finally:
        limits.__exit__(None, None, None)
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    return out


def main(quick: bool = False) -> None:
    import importlib.util

    from benchmarks.compile_page import TITLE, report

    if not quick and importlib.util.find_spec("torchvision") is None:  # make bench in the project's venv
        log.warning("compile: no torchvision in this venv, so the committed page is kept (run it in the venv of "
                    "thirdparty: benchmarks.pages.SUITES says how)")
        return

    def write(doc: dict[str, Any]) -> None:
        with open(out_dir(quick) / "compile.json", "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        path = write_page("compile.md", TITLE, report(doc), quick=quick)
        log.info("compile: wrote %s and its .json (%d of %d models)", path, len(doc["models"]),
                 len(QUICK_MODELS if quick else MODELS))

    run(quick=quick, done=write)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for quiet in ("solvers", "scheduler"):  # a solve and an apply per try: their progress is not this page's
        logging.getLogger(quiet).setLevel(logging.WARNING)
    main(quick="--quick" in sys.argv[1:])
