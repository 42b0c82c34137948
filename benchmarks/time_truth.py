"""Time, validated as memory is: predicted against measured extra time, the candidates' ranks, our pick's regret.

For each model (causal and masked LMs from transformers at hidden 256 with a
32,000 vocabulary at sequence 256, 2 layers, and GPT-2 and Llama at hidden
512 with 4 layers, where the blocks weigh as much as the head; a ViT, a ConvNeXt and this
project's ResNet, small; DenseNet-121 where torchvision imports), one thread:

* theirs: the library's own checkpointing (``gradient_checkpointing_enable``
  for the LMs; every block under ``torch.utils.checkpoint`` for the vision
  models), its allocator peak;
* ours at their peak: the plan the default pipeline picks (``ilp`` over the
  chunk menus on the LMs, least total cost: NOTE [ Plan overheads ] in
  ``solvers.model.overheads``), its allocator peak, and its step against
  theirs over alternated pairs (ABBA; a warm-up step after each switch, the
  best of two timed steps), wall and CPU time, median with min-max;
* candidates: several plans at their peak and at a lower budget (the pick,
  ``ilp`` without chunks or kept ops, ``dp``, ``chen-greedy``, forced chunk
  counts), timed with the plain step in rounds over every distinct plan of
  both budgets (ABC CBA...; a plan both budgets list is one side, timed
  once: two budgets' rounds had measured the same plan 8 ms apart):
  measured extra time (the least planned step less the least
  plain step over the rounds, each turn the best of two timed steps) beside
  the predicted one
  (``findings["extra_time_s"]``: recompute plus overheads), Kendall's tau of
  the two orders, and at each budget the regret of the pick against the
  fastest candidate measured there.

The load average is recorded at the start and end of each model: the
machine may be shared, and the page says so. glibc's malloc keeps what it
frees, as a GPU's caching allocator does (``benchmarks.steady``: with its
defaults page faults moved a step by more than most plans cost). Writes
``benchmarks/results/time.md``. Run: ``python -m benchmarks.run --only time_truth``
(``--quick``: fewer pairs, two models).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import statistics
import time
from typing import Any, Callable, Iterable, Sequence

import torch

import scheduler
import solvers
from scheduler.comparing.choosing import plan_key
from scheduler.measuring.steps import allocator_step_peak
from scheduler.sizing.budget import format_bytes
from scheduler.tracing.opclasses import no_collection
from solvers.model.chunks import find_calls

from benchmarks.chunked import Side
from benchmarks.steady import steady_allocator
from benchmarks.pages import write_page

log = logging.getLogger(__name__)

VOCAB, HIDDEN, LAYERS, SEQ = 32000, 256, 2, 256
TIME_LIMIT_S = 20.0
HEAD_PAIRS, CANDIDATE_PAIRS = 9, 11
#: Timed steps per turn of a candidate (the best is the turn's), after its warm-up step.
TIMED = 2


# ---------------------------------------------------------------------------------------------- models
def _lm(kind: str, hidden: int = HIDDEN, layers: int = LAYERS) -> tuple[Any, tuple, dict, Callable[[Any], Side]]:
    import transformers

    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, SEQ))
    common = dict(vocab_size=VOCAB, use_cache=False)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4,
                                                                     n_positions=SEQ, **common))
        kwargs = {"input_ids": ids, "labels": ids}
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=SEQ, **common))
        kwargs = {"input_ids": ids, "labels": ids}
    else:
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=4,
            max_position_embeddings=SEQ, **common))
        labels = ids.clone()
        labels[:, ::7] = -100
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    def theirs(m: Any) -> Side:
        return Side(lambda: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}),
                    m.gradient_checkpointing_disable)

    return model.train(), (), kwargs, theirs


class _Loss(torch.nn.Module):
    """A classifier returning its cross-entropy loss (``forward(images, labels)``)."""

    def __init__(self, net: torch.nn.Module, logits: Callable[[Any], torch.Tensor] = lambda out: out) -> None:
        super().__init__()
        self.net, self._logits = net, logits

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self._logits(self.net(images)), labels)


def _per_block(blocks: Callable[[Any], Sequence[torch.nn.Module]]) -> Callable[[Any], Side]:
    """Theirs for a vision model: every block's call under non-reentrant checkpoint."""
    from torch.utils.checkpoint import checkpoint

    def side(model: Any) -> Side:
        mods = list(blocks(model))

        def on() -> None:
            for m in mods:
                orig = type(m).forward.__get__(m)
                m.forward = lambda *a, _f=orig, **k: checkpoint(_f, *a, use_reentrant=False, **k)

        def off() -> None:
            for m in mods:
                m.__dict__.pop("forward", None)
        return Side(on, off)
    return side


def _vision(kind: str) -> tuple[Any, tuple, dict, Callable[[Any], Side]]:
    torch.manual_seed(0)
    if kind == "vit":
        import transformers

        cfg = transformers.ViTConfig(hidden_size=192, num_hidden_layers=6, num_attention_heads=3,
                                     intermediate_size=768, image_size=96, patch_size=8, num_labels=100)
        model = _Loss(transformers.ViTForImageClassification(cfg), lambda out: out.logits)
        batch, side, theirs = 4, 96, _per_block(lambda m: m.net.vit.layers)
    elif kind == "convnext":
        import transformers

        cfg = transformers.ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[2, 2, 4, 2], num_labels=100,
                                          image_size=96)
        model = _Loss(transformers.ConvNextForImageClassification(cfg), lambda out: out.logits)
        batch, side = 8, 96
        theirs = _per_block(lambda m: [layer for stage in m.net.convnext.encoder.stages for layer in stage.layers])
    elif kind == "resnet":
        from scheduler.models.cnn import build_resnet

        net, args, kwargs = build_resnet(batch=8, depth=26, width=16, image_size=96, classes=100)
        return net.train(), args, kwargs, _per_block(lambda m: list(m.layers)[:-1])
    else:
        import torchvision

        model = _Loss(torchvision.models.densenet121(weights=None, num_classes=100))
        batch, side = 4, 64
        from torchvision.models.densenet import _DenseBlock

        theirs = _per_block(lambda m: [x for x in m.modules() if isinstance(x, _DenseBlock)])
    return model.train(), (torch.randn(batch, 3, side, side),), {"labels": torch.randint(0, 100, (batch,))}, theirs


MODELS: dict[str, Callable[[], tuple[Any, tuple, dict, Callable[[Any], Side]]]] = {
    "gpt2": lambda: _lm("gpt2"), "llama": lambda: _lm("llama"), "bert": lambda: _lm("bert"),
    "gpt2-512": lambda: _lm("gpt2", 512, 4), "llama-512": lambda: _lm("llama", 512, 4),
    "vit": lambda: _vision("vit"), "convnext": lambda: _vision("convnext"), "resnet": lambda: _vision("resnet"),
    "densenet": lambda: _vision("densenet"),
}
LMS = ("gpt2", "llama", "bert", "gpt2-512", "llama-512")


# ---------------------------------------------------------------------------------------------- timing
def _loss(out: Any) -> torch.Tensor:
    return out.loss if hasattr(out, "loss") else out


def _step(model: Any, args: tuple, kwargs: dict) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        _loss(model(*args, **kwargs)).backward()
    return step


def alternate(step: Callable[[], None], a: Side, b: Side, pairs: int, timed: int = 2
              ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """``pairs`` alternated turns (ABBA...) of ``a`` and ``b``: per turn the best ``(wall, cpu)`` of ``timed``
    steps after one warm-up step."""
    first, second = round_robin(step, (a, b), pairs, timed)
    return first, second


def round_robin(step: Callable[[], None], sides: Sequence[Side], rounds: int, timed: int = 2
                ) -> list[list[tuple[float, float]]]:
    """``rounds`` rounds over every side in turn, the order reversed every other round (ABC CBA...): per side
    and round the best ``(wall, cpu)`` of ``timed`` steps after one warm-up step. Every candidate of a budget
    and the plain step share the same stretch of a shared machine's load, as a pair's two sides do."""
    out: list[list[tuple[float, float]]] = [[] for _ in sides]
    for r in range(rounds):
        order = range(len(sides)) if r % 2 == 0 else reversed(range(len(sides)))
        with no_collection():  # a collection inside a timed step walks the whole heap (the traced graphs)
            _round(step, sides, order, timed, out)
    return out


def _round(step: Callable[[], None], sides: Sequence[Side], order: Iterable[int], timed: int,
           out: list[list[tuple[float, float]]]) -> None:
    for i in order:
        sides[i].on()
        try:
            step()
            best = (float("inf"), float("inf"))
            for _ in range(timed):
                w0, c0 = time.perf_counter(), time.process_time()
                step()
                best = min(best, (time.perf_counter() - w0, time.process_time() - c0))
            out[i].append(best)
        finally:
            sides[i].off()


def least(turns: list[tuple[float, float]], i: int) -> float:
    """The least ``(wall, cpu)[i]`` over a side's turns: on a shared machine interference only adds time, so the
    least of several alternated turns is the step's own time (extra times are differences of these)."""
    return min(t[i] for t in turns)


def _ratio(ours: list[tuple[float, float]], theirs: list[tuple[float, float]], i: int) -> tuple[float, float, float]:
    r = [o[i] / t[i] for o, t in zip(ours, theirs)]
    return statistics.median(r), min(r), max(r)


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The first and third quartiles of ``values`` (inclusive method; both the value itself for one value): the
    spread of a candidate's round-by-round differences, how far one measurement of its extra time moves."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of two orders (None below two items or when one order is all ties)."""
    n, conc, disc, tx, ty = len(x), 0, 0, 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    denom = ((conc + disc + tx) * (conc + disc + ty)) ** 0.5
    return None if n < 2 or denom == 0 else (conc - disc) / denom


# ---------------------------------------------------------------------------------------------- plans
def _candidates(graph: Any, budget: int, lm: bool) -> list[tuple[str, Any]]:
    """``(label, plan)`` at ``budget``: the pick first, then the others that fit (duplicates dropped)."""
    menus = dict(chunks=(1, 2, 4), mlp_chunks=(1, 2, 4) if find_calls(graph) else None) if lm else {}
    tries: list[tuple[str, Callable[[], Any]]] = [
        ("pick: ilp" + (" + chunk menus" if lm else ""),
         lambda: scheduler.solve(graph, budget, "ilp", time_limit_s=TIME_LIMIT_S, **menus))]
    if lm:
        tries += [("ilp, head in 4 chunks", lambda: scheduler.solve(graph, budget, "ilp", time_limit_s=TIME_LIMIT_S,
                                                                    chunks=(4,))),
                  ("ilp, head in 2 chunks, no kept ops", lambda: scheduler.solve(
                      graph, budget, "ilp", time_limit_s=TIME_LIMIT_S, chunks=(2,), selective=False))]
    tries += [("ilp, no chunks", lambda: scheduler.solve(graph, budget, "ilp", time_limit_s=TIME_LIMIT_S)),
              ("ilp, no kept ops", lambda: scheduler.solve(graph, budget, "ilp", time_limit_s=TIME_LIMIT_S,
                                                           selective=False)),
              ("dp", lambda: scheduler.solve(graph, budget, "dp", time_limit_s=TIME_LIMIT_S)),
              ("chen-greedy", lambda: scheduler.solve(graph, budget, "chen-greedy"))]
    out, seen = [], set()
    for label, make in tries:
        try:
            plan = make()
        except solvers.InfeasibleBudget:
            continue
        except Exception as exc:  # a candidate that cannot be made is left out, said in the log
            log.warning("%s at %d: %s", label, budget, exc)
            continue
        key = plan_key(plan) + (tuple(plan.chunks),)
        if key not in seen:
            seen.add(key)
            out.append((label, plan))
    return out


def _ours(model: Any, plan: Any) -> Side:
    return Side(lambda: scheduler.apply(model, plan), lambda: scheduler.remove(model))


_PLAIN = Side(lambda: None, lambda: None)


def run_model(name: str, head_pairs: int, pairs: int) -> dict:
    load0 = os.getloadavg()[0]
    model, args, kwargs, theirs_of = MODELS[name]()
    lm = name in LMS
    step = _step(model, args, kwargs)
    theirs = theirs_of(model)
    theirs.on()
    their_peak = allocator_step_peak(model, model, args, kwargs, _loss)
    theirs.off()
    graph = scheduler.trace(model, args, kwargs, loss=_loss)
    floor = None
    try:
        scheduler.solve(graph, 1, "ilp", time_limit_s=TIME_LIMIT_S,
                        **(dict(chunks=(1, 2, 4)) if lm else {}))
    except solvers.InfeasibleBudget as exc:
        floor = exc.min_feasible_bytes
    except Exception as exc:
        log.warning("%s: least budget: %s", name, exc)
    low = their_peak if floor is None else floor + (their_peak - floor) // 2
    rows = []
    cands = [(budget, label, plan) for budget in dict.fromkeys((their_peak, low))
             for label, plan in _candidates(graph, budget, lm)]
    sides = {_key(plan): plan for _, _, plan in cands}  # a plan both budgets list is timed once
    turns = round_robin(step, [_PLAIN] + [_ours(model, plan) for plan in sides.values()], pairs, timed=TIMED)
    plain, timed = turns[0], dict(zip(sides, turns[1:]))
    for budget, label, plan in cands:
        planned = timed[_key(plan)]
        rows.append(dict(budget=budget, label=label, plan=plan, predicted=plan.findings.get("extra_time_s"),
                         recompute=plan.findings.get("extra_recompute_s"),
                         measured=least(planned, 1) - least(plain, 1), wall=least(planned, 0) - least(plain, 0),
                         median=statistics.median(p[1] - q[1] for p, q in zip(planned, plain)),
                         spread=quartiles([p[1] - q[1] for p, q in zip(planned, plain)]),
                         step=least(planned, 1), plain=least(plain, 1)))
    pick = next(r for r in rows if r["budget"] == their_peak and r["label"].startswith("pick"))
    ours = _ours(model, pick["plan"])
    our_peak = allocator_step_peak_with(model, args, kwargs, ours)
    t_ours, t_theirs = alternate(step, ours, theirs, head_pairs)
    plain, their = alternate(step, _PLAIN, theirs, pairs, timed=TIMED)
    their_extra = least(their, 1) - least(plain, 1)
    costs, found = graph.meta.get("costs") or {}, (graph.meta.get("costs") or {}).get("recompute_scale") or {}
    calibrated = {"selective_op_s": found["calibrated_selective_op_s"]} if "calibrated_selective_op_s" in found else {}
    return dict(overheads=costs.get("overheads") and {**costs["overheads"], **calibrated},
                scale=found.get("scale"), policy=found.get("selective_op_s"),
                plain_s=least(plain, 1), their_extra=their_extra,
                our_extra=pick["measured"], model=name, their_peak=their_peak, our_peak=our_peak, floor=floor,
                pick=pick, rows=rows,
                wall=_ratio(t_ours, t_theirs, 0), cpu=_ratio(t_ours, t_theirs, 1),
                their_s=statistics.median(t[0] for t in t_theirs), our_s=statistics.median(t[0] for t in t_ours),
                pairs=head_pairs, load=(load0, os.getloadavg()[0]))


def allocator_step_peak_with(model: Any, args: tuple, kwargs: dict, side: Side) -> int:
    side.on()
    try:
        return allocator_step_peak(model, model, args, kwargs, _loss)
    finally:
        side.off()


# ---------------------------------------------------------------------------------------------- page
def _ms(s: float | None) -> str:
    return "-" if s is None else f"{1e3 * s:.1f}"


def _spread(row: dict | None) -> str:
    lo, hi = (row or {}).get("spread", (math.nan, math.nan))
    return "-" if not (math.isfinite(lo) and math.isfinite(hi)) else f"{1e3 * lo:.1f}-{1e3 * hi:.1f}"


def _what(plan: Any) -> str:
    chunks = ", ".join(f"{m} x{k}" for m, (_, _, k) in zip(plan.chunk_modules, plan.chunks)) if plan.chunks else ""
    parts = [f"{len(plan.regions)} regions", f"{len(plan.saved)} kept" if plan.saved else "", chunks]
    return "; ".join(p for p in parts if p)


def _key(plan: Any) -> tuple:
    """What makes two candidates the same plan (the same step)."""
    return (tuple(plan.regions), tuple(plan.saved), tuple(plan.chunks or ()))


def summarise(res: dict) -> dict:
    """Tau over the distinct candidate plans, regret per budget, the median plan's prediction error."""
    rows = [r for r in res["rows"] if r["predicted"] is not None]
    distinct = list({_key(r["plan"]): r for r in reversed(rows)}.values())[::-1]  # a plan both budgets list: once
    tau = kendall_tau([r["predicted"] for r in distinct], [r["measured"] for r in distinct])
    regrets = []
    for budget in dict.fromkeys(r["budget"] for r in rows):
        at = [r for r in rows if r["budget"] == budget]
        pick = next((r for r in at if r["label"].startswith("pick")), None)
        if pick is not None:  # each candidate's step over the plain step of its rounds (one for the budget's plans)
            best = min(at, key=lambda r: r["step"] / r["plain"])
            regrets.append((pick["step"] / pick["plain"]) / (best["step"] / best["plain"]) - 1)
    ordered = sorted(distinct, key=lambda r: r["measured"])
    median = ordered[len(ordered) // 2] if ordered else None
    err = None
    if median is not None and abs(median["measured"]) > 1e-9:
        err = (median["predicted"] - median["measured"]) / abs(median["measured"])
    return dict(tau=tau, regret=max(regrets) if regrets else None, median=median, err=err, distinct=len(distinct))


def page(results: Sequence[dict], skipped: Sequence[str], wall_s: float, allocator: str = "") -> list[str]:
    out = ["Step time of the libraries' own checkpointing and of our plan at their peak, and how well the cost "
           "model (recompute plus what a plan adds: NOTE [ Plan overheads ] in `solvers/model/overheads.py`) "
           "predicts the extra time of candidate plans (`ilp`'s program prices each region's call; convolutions, "
           "BatchNorm and max pooling are timed at their shapes: NOTE [ Measured op classes ] in "
           "`scheduler/tracing/opclasses.py`). One thread; the load average (1 min) at the start and end "
           "of each model is in its row: the machine is shared, so times move with it. "
           + (f"Allocator: {allocator}, as a GPU's caching allocator keeps it (with glibc's defaults a step "
              "spent 0-92 ms of its 205 ms faulting 32 MB buffers in again, more than most plans cost). "
              if allocator else "")
           + f"Suite wall time {wall_s:.0f} s.",
           "", "## At their peak", "",
           "| model | theirs peak | ours peak (allocator) | our plan | theirs step ms | ours / theirs wall | "
           "ours / theirs CPU | pairs | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        w, c = r["wall"], r["cpu"]
        out.append(f"| {r['model']} | {format_bytes(r['their_peak'])} | {format_bytes(r['our_peak'])}"
                   f"{' (over)' if r['our_peak'] > r['their_peak'] else ''} | {_what(r['pick']['plan'])} | "
                   f"{_ms(r['their_s'])} | {w[0]:.2f} ({w[1]:.2f}-{w[2]:.2f}) | {c[0]:.2f} ({c[1]:.2f}-{c[2]:.2f}) | "
                   f"{r['pairs']} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
    out += ["", "## Predicted against measured extra time", "",
            "Extra time = the planned step less the plain step (no checkpointing), each the least over "
            f"{CANDIDATE_PAIRS} rounds over the plain step and every distinct candidate plan of both budgets in turn "
            "(ABC CBA...; a plan both budgets list is timed once and shown at both), "
            f"a turn the best of {TIMED} timed steps after a warm-up (interference on a shared machine only adds "
            "time; the median of the rounds' differences is beside it), in "
            "CPU time (the process's: on a shared machine it moves less with the load than wall time, which is "
            "shown beside it). "
            "Tau: Kendall's tau-b of the distinct candidates' predicted and measured orders. Regret: our pick's step over "
            "the plain step of its rounds, over the same for the fastest candidate measured at the same "
            "budget, less 1 (the worst of the two budgets). "
            "Error: (predicted - measured) / measured on the distinct candidate with the median measured extra time. "
            "Rounds: the first to third quartile of that candidate's round-by-round differences (its step less "
            "the plain step of the same round): how far one measurement moves on this machine, beside which an "
            "error is to be read. Scale: the trace's recompute scale, what its blocks' recompute measured in the "
            "step over the roofline's figure (NOTE [ Recompute timed in the step ] in "
            "`scheduler/tracing/recompute_scale.py`; - where not measured); policy: the selective policy's cost "
            "per ATen call its regions run, measured in the same step (the calibration's is below).", "",
            "| model | candidates (distinct plans) | tau | regret | median plan | predicted ms | measured ms | error | rounds ms | "
            "scale | policy us |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = summarise(r)
        m = s["median"]
        tau = "-" if s["tau"] is None else f"{s['tau']:.2f}"
        regret = "-" if s["regret"] is None else f"{100 * s['regret']:.1f} %"
        err = "-" if s["err"] is None else f"{100 * s['err']:+.0f} %"
        out.append(f"| {r['model']} | {len(r['rows'])} ({s['distinct']}) | {tau} | {regret} | {'-' if m is None else m['label']} | "
                   f"{_ms(m and m['predicted'])} | {_ms(m and m['measured'])} | {err} | {_spread(m)} | "
                f"{'-' if r.get('scale') is None else format(r['scale'], '.2f')} | "
                f"{'-' if r.get('policy') is None else format(1e6 * r['policy'], '.1f')} |")
    for r in results:
        out += ["", f"### {r['model']}", "",
                "| budget | candidate | plan | predicted ms (recompute) | measured ms CPU (wall; median of rounds) | "
                "step ms CPU | plain ms CPU |", "|---|---|---|---|---|---|---|"]
        for c in r["rows"]:
            out.append(f"| {format_bytes(c['budget'])} | {c['label']} | {_what(c['plan'])} | {_ms(c['predicted'])} "
                       f"({_ms(c['recompute'])}) | {_ms(c['measured'])} ({_ms(c['wall'])}; {_ms(c['median'])}) | "
                       f"{_ms(c['step'])} | "
                       f"{_ms(c['plain'])} |")
    figures = next((r["overheads"] for r in results if r.get("overheads")), None)
    if figures:
        out += ["", "Overhead figures as calibrated (each model's selective_op_s is the step's where measured: policy, above; "
                "NOTE [ Overhead calibration ] in "
                f"`scheduler/tracing/overheads.py`; {figures.get('source', '')}): "
                + ", ".join(f"{k} {1e6 * float(figures[k]):.1f} us" for k in
                            ("region_s", "random_region_s", "selective_op_s", "kept_call_s", "chunk_s", "op_s")
                            if k in figures)
                + "; float32 GEMM FLOP/s by rows: "
                + ", ".join(f"{m}: {r / 1e9:.0f} G" for m, r in figures.get("gemm_rows", [])) + "."]
    out += ["", "## Goals (issue 34)", ""]
    out += goals(results)
    if skipped:
        out += ["", "Skipped: " + "; ".join(skipped)]
    return out


def goals(results: Sequence[dict]) -> list[str]:
    """Each goal, held or not, in numbers."""
    lines = []
    for r in results:
        s = summarise(r)
        ratio = r["wall"][0]
        lm = r["model"] in LMS
        need = 0.95 * (r["plain_s"] + r["their_extra"]) - r["plain_s"]
        held = [f"ours/theirs {ratio:.2f}" + (" (goal <= 0.95 on LMs: " + ("held" if ratio <= 0.95 else "NOT held")
                                              + ")" if lm else " (goal < 1: " + ("held" if ratio < 1 else "NOT held")
                                              + ")"),
                f"(CPU time) plain step {_ms(r['plain_s'])} ms, their checkpointing adds {_ms(r['their_extra'])} "
                f"ms, our pick {_ms(r['our_extra'])} ms; 0.95x theirs needs ours to add at most {_ms(need)} ms"
                + (" (less than nothing: faster than the plain step)" if need < 0 else ""),
                f"peak {'at or under' if r['our_peak'] <= r['their_peak'] else 'OVER'} theirs by "
                f"{format_bytes(abs(r['their_peak'] - r['our_peak']))}"]
        if s["err"] is not None:
            verdict = "held" if abs(s["err"]) <= 0.15 else "NOT held"
            lo, hi = s["median"].get("spread", (math.nan, math.nan))
            inside = lo <= s["median"]["predicted"] <= hi
            held.append(f"median plan's prediction {100 * s['err']:+.0f} % ({verdict} within 15 %; "
                        f"its rounds' differences {_spread(s['median'])} ms, the prediction "
                        f"{_ms(s['median']['predicted'])} ms {'inside' if inside else 'outside'} them)")
        if s["regret"] is not None:
            held.append(f"regret {100 * s['regret']:.1f} % ({'held' if s['regret'] <= 0.05 else 'NOT held'} <= 5 %)")
        lines.append(f"- {r['model']}: " + "; ".join(held))
    return lines


def main(quick: bool = False, only: Sequence[str] | None = None) -> None:
    t0 = time.perf_counter()
    torch.set_num_threads(1)  # timed on one thread, priced at one thread (the calibration's key)
    allocator = steady_allocator()
    names = list(only or (["gpt2", "resnet"] if quick else MODELS))
    head, pairs = (3, 2) if quick else (HEAD_PAIRS, CANDIDATE_PAIRS)
    results, skipped = [], []
    for name in names:
        try:
            res = run_model(name, head, pairs)
        except ImportError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        except Exception as exc:  # a model that fails is on the page with its error, the others still run
            log.warning("%s failed", name, exc_info=True)
            skipped.append(f"{name} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        results.append(res)
        print(f"{name}: ours/theirs wall {res['wall'][0]:.2f}, peak {res['our_peak']} vs {res['their_peak']}, "
              f"{len(res['rows'])} candidates", flush=True)
    path = write_page("time.md", "The fastest plan, measured",
                      page(results, skipped, time.perf_counter() - t0, allocator), quick=quick)
    print(f"wrote {path}")


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    cli.add_argument("--quick", action="store_true")
    cli.add_argument("--only", nargs="*", default=None, help="models (default: all)")
    ns = cli.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(ns.quick, ns.only)
