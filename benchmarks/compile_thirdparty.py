"""The compiled peak bound on third-party models as their libraries ship them (issue 35).

``scheduler.compiled_bound`` (NOTE [ Compiled peak bound ] in
``scheduler/measuring/inductor.py``) reads, on fake tensors, a bound on the
allocator's peak of a training step under ``torch.compile`` with inductor.
``benchmarks/compile.py`` checks it on the models this project builds; this
suite checks it on the models of ``benchmarks/thirdparty_models.py`` (each
built by its library, dropout or stochastic depth on where the model has it)
and two more (:data:`COMPILE_CASES`), in the user's loop as ``Trainer`` runs it (``loss = model(**batch).loss;
loss.backward()``: :func:`benchmarks.thirdparty.dropped`):

* unplanned: the model compiled as it is;
* planned: ``ilp``'s plan at half the store-all activations (or at the least
  feasible budget), applied onto a copy of the model, then compiled.

Each side: the bound (and ``fused_bytes``, the estimate that leaves out what
inductor fuses), the peak the allocator measures (the profiler's memory
events, parameters, buffers and inputs included) after two compiling steps,
their ratio, the graphs Dynamo made and whether the bound is proven for the
model (``guaranteed``: False where inductor's layout pass rewrites
convolutions; their channels-last copies are then counted, not proven).
Runs in the venv of ``thirdparty``; a library that is missing is skipped
and the committed page kept::

    PYTHONPATH=. VENV/bin/python -m benchmarks.compile_thirdparty [MODEL ...]
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from typing import Any

import torch

import scheduler
import solvers
from scheduler.measuring.compiled import compiled_step_peak
from scheduler.measuring.inductor import compiled_bound
from scheduler.tracing.tracer import EvalModeWarning

from .thirdparty import FRACTION, SEED, _solve, command_line, run_suite
from .thirdparty_models import _GPT2, CASES, Case, _causal, _hf, _image_case

log = logging.getLogger(__name__)
TITLE = "The compiled peak bound on third-party models"
LOOP = "dropped"


def _mobilenet() -> Case:
    def build() -> torch.nn.Module:
        import torchvision
        return torchvision.models.mobilenet_v3_small(weights=None, num_classes=10)
    return _image_case("torchvision", build)


#: ``thirdparty``'s models, and two more: GPT-2 as ``GPT2Config`` ships it (``use_cache`` on), and a torchvision
#: MobileNetV3-small, whose regions put convolutions into the backward (inductor's layout pass then copies there).
COMPILE_CASES = {**CASES, "gpt2-use-cache": lambda: _hf("GPT2Config", "GPT2LMHeadModel", _causal,
                                                        **{**_GPT2, "use_cache": True}),
                 "tv-mobilenetv3": _mobilenet}


def _side(model: torch.nn.Module, plan: Any, graph: Any, args: tuple, kwargs: dict, loss: Any) -> dict:
    """One side: the bound read on fake tensors, then the compiled step measured."""
    t0 = time.perf_counter()
    b = compiled_bound(model, plan, args, kwargs, loss, loop=LOOP, graph=graph)
    read_s = time.perf_counter() - t0
    torch.manual_seed(SEED)
    t0 = time.perf_counter()
    measured = compiled_step_peak(model, plan, args, kwargs, loss, loop=LOOP)
    return {"bound": b.bound_bytes, "fused": b.fused_bytes, "layout": b.layout_bytes, "graphs": b.graphs,
            "eager_nodes": b.eager_nodes, "guaranteed": b.guaranteed, "measured": measured,
            "read_s": round(read_s, 1), "measure_s": round(time.perf_counter() - t0, 1)}


def run_case(name: str, case: Case) -> dict:
    """``name``'s unplanned and planned compiled steps, each against its bound."""
    torch.manual_seed(SEED)
    model = case.build()
    model.train()
    args, kwargs, target = case.inputs()

    def loss(out: Any) -> torch.Tensor:
        return case.loss(out, target)

    graph = scheduler.trace(model, args, kwargs, loss=loss, loop=LOOP)
    store_all = solvers.simulate(graph, record=False).peak_bytes
    plan, budget = _solve(graph, int(FRACTION * store_all))
    row: dict[str, Any] = {"model": name, "library": case.library, "budget": budget,
                           "regions": len(plan.regions)}
    for label, p in (("unplanned", None), ("planned", plan)):
        try:
            row[label] = _side(model, p, graph, args, kwargs, loss)
        except Exception as exc:  # a finding for the page, not the end of the run
            log.exception("compile_thirdparty: %s %s failed", name, label)
            row[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        torch._dynamo.reset()
    return row


def _mib(v: int) -> str:
    return f"{v / 2**20:.2f}"


def report(rows: list[dict], skipped: list[str]) -> str:
    """The page below its title and header (``benchmarks.pages``)."""
    sides = [(r, s, r[s]) for r in rows if "error" not in r for s in ("unplanned", "planned")]
    ok = [(r, s, x) for r, s, x in sides if "error" not in x]
    under = [(r, s, x) for r, s, x in ok if x["measured"] <= x["bound"]]
    proven = [(r, s, x) for r, s, x in ok if x["guaranteed"]]
    proven_under = sum(x["measured"] <= x["bound"] for _, _, x in proven)
    ratios = [x["measured"] / x["bound"] for _, _, x in ok]
    lines = [f"{torch.get_num_threads()} torch threads. Each model as `benchmarks/thirdparty_models.py` builds it "
             "(its library, small config, random weights, dropout or stochastic depth on), in `Trainer`'s loop "
             "(`loss = model(**batch).loss; loss.backward()`), compiled with `torch.compile` (inductor, default "
             f"options): unplanned, and with `ilp`'s plan at {FRACTION:g} of its store-all activations (or the least "
             "feasible budget) applied onto a copy. Bound: `scheduler.compiled_bound` (NOTE [ Compiled peak bound ]), "
             "read on fake tensors before anything runs; fused: its estimate without the pointwise outputs inductor "
             "fuses (no bound); measured: the allocator's peak of the third compiled step (the profiler's memory "
             "events, parameters, buffers and inputs included). Proven: no convolution that inductor's layout pass "
             "rewrites (`guaranteed`); where there is one, its channels-last copies are counted, not proven.", ""]
    if ok:
        lines += [f"**{len(under)} of {len(ok)} compiled steps at or under their bound "
                  f"({proven_under} of the {len(proven)} where it is proven); measured/bound "
                  f"{min(ratios):.3f} to {max(ratios):.3f}.**", ""]
    lines += ["| model | side | regions | graphs | eager nodes | bound MiB | fused MiB | measured MiB | measured/bound "
              "| proven | at or under |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, s, x in sides:
        regions = "-" if s == "unplanned" else str(r["regions"])
        if "error" in x:
            lines.append(f"| {r['model']} | {s} | {regions} | - | - | - | - | - | **failed** | - | - |")
            continue
        lines.append(f"| {r['model']} | {s} | {regions} | {x['graphs']} | {x['eager_nodes']} | {_mib(x['bound'])} | "
                     f"{_mib(x['fused'])} | {_mib(x['measured'])} | {x['measured'] / x['bound']:.3f} | "
                     f"{'yes' if x['guaranteed'] else 'no'} | {'yes' if x['measured'] <= x['bound'] else '**no**'} |")
    over = [(r, s, x) for r, s, x in ok if x["measured"] > x["bound"]]
    if over:
        lines += ["", "Over the bound:"] + [
            f"- {r['model']} {s}: {_mib(x['measured'] - x['bound'])} MiB over "
            f"({'proven: a defect of the bound' if x['guaranteed'] else 'layout copies counted, not proven'}; "
            f"layout copies counted {_mib(x['layout'])} MiB)" for r, s, x in over]
    failed = [f"- {r['model']}: **failed**: {r['error']}" for r in rows if "error" in r]
    failed += [f"- {r['model']} {s}: **failed**: {x['error']}" for r, s, x in sides if "error" in x]
    lines += ([""] + failed if failed else []) + ([""] + [f"- {line}" for line in skipped] if skipped else [])
    return "\n".join(lines).rstrip() + "\n"


def main(quick: bool = False, names: list[str] | None = None, command: str | None = None) -> list[dict]:
    """Run the models in ``names`` (default: all, ``QUICK`` with ``quick``); write the results page."""
    return run_suite("compile_thirdparty", run_case, report, TITLE, "rows", quick=quick, names=names,
                     command=command, cases=COMPILE_CASES)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    warnings.filterwarnings("ignore", category=EvalModeWarning)
    main(names=sys.argv[1:] or None, command=command_line("benchmarks.compile_thirdparty"))
