"""Third-party models as their libraries ship them, planned with ckpt and trained in the user's own loop (issue 23).

Each model is built by its own library from a small config with random weights
(offline): transformers GPT-2, Llama, BERT, T5, ViT and Whisper, timm ViT-S,
ResNet-50 and ConvNeXt, torchvision ResNet, a diffusers ``UNet2DModel``, a peft
LoRA adapter on GPT-2 and peft's prefix tuning on Llama, monai's ``BasicUNet``
and a segmentation_models_pytorch U-Net, each with dropout or stochastic depth on where the model has it
(``benchmarks/thirdparty_models.py``). For each model:

* the plan is solved (``ilp``) at half its store-all activations (or at the
  least feasible budget when that is higher), for each loop style, and
  applied onto the user's module (``scheduler.apply``), which then trains in
  the user's own loop: ``out = model(**batch); out.loss.backward()`` (the
  output held through the backward, :func:`held`) or
  ``loss = model(**batch).loss; loss.backward()`` (dropped before it,
  :func:`dropped`). The plan solved for the held loop runs in both loops;
* in two orders: the model built and put in training mode before it is traced
  (``train``), and the model reloaded the way its library ships weights
  (``from_pretrained``, or ``load_state_dict`` and ``eval()``), traced in the
  eval mode that leaves it in, then ``model.train()`` and the plan applied
  (``eval -> train``);
* each step is measured by the allocator (the profiler's memory events,
  ``scheduler.measuring.profiler``: what "fits" means) and its gradients,
  loss and buffers are compared bitwise with the unplanned step of the same
  loop from the same seed;
* a trace of the same model built on ``meta`` and targeting the CPU is held
  against the CPU trace: store-all peaks within 2 %.

A library that is not installed is skipped with a line saying so. The
project's own venv has transformers only; the committed results come from a
throwaway venv with the rest (README, "Third-party models")::

    PYTHONPATH=. /tmp/venv/bin/python -m benchmarks.thirdparty [MODEL ...]
    python -m benchmarks.run --only thirdparty        # make bench; --quick: gpt2 only

Writes ``benchmarks/results/thirdparty.md`` and ``thirdparty.json`` when every model was asked for
(``--quick`` or named models: the table is printed only).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import scheduler
import solvers
from scheduler.measuring.profiler import profile_step
from scheduler.measuring.training import clear_grads, step_tensors
from scheduler.measuring.storages import live_bytes_of
from scheduler.tracing.capture import TraceError
from scheduler.tracing.tracer import EvalModeWarning

from .pages import SUITES, out_dir, write_page
from .thirdparty_models import CASES, LOSS_NAMES, QUICK, Case

log = logging.getLogger(__name__)
FRACTION = 0.5
SEED = 0


# --------------------------------------------------------------- the user's loops
def held(model: nn.Module, args: tuple, kwargs: dict, loss: Callable[[Any], torch.Tensor]) -> torch.Tensor:
    """``out = model(**batch); out.loss.backward()``: the output (logits and all) lives through the backward."""
    out = model(*args, **kwargs)
    value = loss(out)
    value.backward()
    return value.detach()


def dropped(model: nn.Module, args: tuple, kwargs: dict, loss: Callable[[Any], torch.Tensor]) -> torch.Tensor:
    """``loss = model(**batch).loss; loss.backward()`` (as ``Trainer``): the output is gone before the backward."""
    value = loss(model(*args, **kwargs))
    value.backward()
    return value.detach()


LOOPS: dict[str, Callable[..., torch.Tensor]] = {"held": held, "dropped": dropped}


# ---------------------------------------------------------------------- measuring
@dataclasses.dataclass(frozen=True)
class Step:
    """One seeded step of a user's loop: the allocator's peak and what the step computed."""

    peak_bytes: int
    loss: torch.Tensor
    grads: tuple[torch.Tensor | None, ...]
    buffers: tuple[torch.Tensor, ...]

    def same_as(self, other: "Step") -> bool:
        """Loss, every gradient and every buffer bitwise equal."""
        grads = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
                    for a, b in zip(self.grads, other.grads))
        return torch.equal(self.loss, other.loss) and grads and len(self.grads) == len(other.grads) and \
            all(torch.equal(a, b) for a, b in zip(self.buffers, other.buffers))


def _step(model: nn.Module, loop: str, batch: tuple, loss: Callable[[Any], torch.Tensor],
          buffers: list[torch.Tensor]) -> Step:
    """The user's ``loop`` once from ``SEED``, buffers as in ``buffers`` and no gradients, under the profiler."""
    args, kwargs = batch
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)
    clear_grads(model)
    out: list[torch.Tensor] = []
    torch.manual_seed(SEED)
    trace = profile_step(lambda: out.append(LOOPS[loop](model, args, kwargs, loss)),
                         baseline_bytes=live_bytes_of(step_tensors(model, args, kwargs)))
    grads = tuple(None if p.grad is None else p.grad.detach().clone() for p in model.parameters())
    return Step(trace.peak_bytes, out[0], grads, tuple(b.detach().clone() for b in model.buffers()))


def _solve(graph: Any, budget: int) -> tuple[Any, int]:
    """``ilp``'s plan at ``budget``, or at the least feasible budget when ``budget`` is below it."""
    try:
        return scheduler.solve(graph, budget, solver="ilp", time_limit_s=20), budget
    except solvers.InfeasibleBudget as exc:
        return scheduler.solve(graph, exc.min_feasible_bytes, solver="ilp", time_limit_s=20), exc.min_feasible_bytes


def _runs(model: nn.Module, graph: Any, budget: int, batch: tuple, loss: Callable[[Any], torch.Tensor]
          ) -> list[dict]:
    """Plans for each loop applied onto ``model`` and run in the user's loops, beside the unplanned steps."""
    buffers = [b.detach().clone() for b in model.buffers()]
    plain = {loop: _step(model, loop, batch, loss, buffers) for loop in LOOPS}
    rows = []
    for solved_for in LOOPS:
        plan, at = _solve(graph.with_loop(solved_for), budget)
        scheduler.apply(model, plan)
        try:
            for run_as in (LOOPS if solved_for == "held" else (solved_for,)):  # a held plan fits a dropped loop too
                step = _step(model, run_as, batch, loss, buffers)
                predicted = solvers.simulate(graph.with_loop(run_as), plan, record=False).peak_bytes
                rows.append({"plan_for": solved_for, "run_as": run_as, "regions": len(plan.regions),
                             "status": str(plan.status), "budget": at, "predicted": predicted,
                             "allocator": step.peak_bytes, "plain_allocator": plain[run_as].peak_bytes,
                             "bitwise": step.same_as(plain[run_as])})
        finally:
            scheduler.remove(model)
    return rows


def _to_meta(value: Any, moved: dict[int, Any]) -> Any:
    """``value`` on ``meta``; one tensor passed twice (ids as labels) stays one tensor."""
    if not isinstance(value, torch.Tensor):
        return value
    return moved.setdefault(id(value), value.to("meta"))


def _meta_store_all(case: Case, batch: tuple, target: Any) -> int:
    """Store-all peak of the same model built on ``meta``, traced for the CPU (``target="cpu"``)."""
    with torch.device("meta"):
        twin = case.build().train()
    moved: dict[int, Any] = {}
    args = tuple(_to_meta(a, moved) for a in batch[0])
    kwargs = {k: _to_meta(v, moved) for k, v in batch[1].items()}
    on_meta = _to_meta(target, moved)
    graph = scheduler.trace(twin, args, kwargs, loss=lambda out: case.loss(out, on_meta), target="cpu")
    return solvers.simulate(graph, record=False).peak_bytes


def _meta_or_error(case: Case, batch: tuple, target: Any) -> int | str:
    """:func:`_meta_store_all`, or the tracer's error (a forward that branches on its device: on the page)."""
    try:
        return _meta_store_all(case, batch, target)
    except TraceError as exc:
        return str(exc)


def run_case(name: str, case: Case) -> dict:
    """Every measurement of one model: its two orders, its meta trace."""
    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    model = case.build().train()
    args, kwargs, target = case.inputs()
    batch = (args, kwargs)

    def loss(out: Any) -> torch.Tensor:
        return case.loss(out, target)

    graph = scheduler.trace(model, args, kwargs, loss=loss)  # the held loop (the default)
    budget = _solve(graph, solvers.activation_budget_bytes(graph, FRACTION))[1]
    row: dict[str, Any] = {
        "model": name, "library": f"{case.library} {importlib.metadata.version(_distribution(case.library))}",
        "class": type(model).__name__, "loss": LOSS_NAMES[case.loss], "params": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad), "nodes": len(graph),
        "store_all": solvers.simulate(graph, record=False).peak_bytes, "budget": budget,
        "meta_store_all": _meta_or_error(case, batch, target),
        "runs": {"train": _runs(model, graph, budget, batch, loss)}}
    with tempfile.TemporaryDirectory() as folder:
        shipped = case.reload(model, Path(folder))
    row["reloaded_in_eval"] = not shipped.training
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EvalModeWarning)
        shipped_graph = scheduler.trace(shipped, args, kwargs, loss=loss)
    row["eval_warned"] = any(issubclass(w.category, EvalModeWarning) for w in caught)
    row["same_graph"] = shipped_graph.fingerprint() == graph.fingerprint()
    shipped.train()
    row["runs"]["eval -> train"] = _runs(shipped, shipped_graph, budget, batch, loss)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def _distribution(library: str) -> str:
    return {"segmentation_models_pytorch": "segmentation-models-pytorch"}.get(library, library)


# ----------------------------------------------------------------------- report
def _b(v: int) -> str:
    return f"{v:,}"


def _pct(a: int, b: int) -> str:
    return f"{100 * (a - b) / b:+.2f} %"


TITLE = "Third-party models as their libraries ship them"


def _meta_cell(row: dict) -> str:
    return _b(row["meta_store_all"]) if isinstance(row["meta_store_all"], int) else "**failed** (below)"


def report(rows: list[dict], skipped: list[str]) -> str:
    """The page below its title and header (``benchmarks.pages``)."""
    runs = [(r, order, x) for r in rows if "error" not in r for order, xs in r["runs"].items() for x in xs]
    ok = [r for r in rows if "error" not in r]
    fits = sum(x["allocator"] <= x["budget"] for _, _, x in runs)
    under = sum(x["allocator"] <= x["predicted"] for _, _, x in runs)
    same = sum(x["bitwise"] for _, _, x in runs)
    close = sum(isinstance(r["meta_store_all"], int) and abs(r["meta_store_all"] - r["store_all"]) <= 0.02 * r["store_all"]
                for r in ok)
    lines = [f"{torch.get_num_threads()} torch threads. Each model is built by its library (small config, random weights, dropout or stochastic depth on), "
             f"traced with its loss, planned by `ilp` at {FRACTION:g} of its store-all activations (or at the least "
             "feasible budget), applied onto the model (`scheduler.apply`) and trained one step in the user's own "
             "loop: `held` is `out = model(**batch); out.loss.backward()`, `dropped` is "
             "`loss = model(**batch).loss; loss.backward()`. Order `train`: built, `model.train()`, traced; "
             "`eval -> train`: reloaded as the library ships weights (`from_pretrained`, or `load_state_dict` and "
             "`eval()`), traced in eval mode, then `model.train()`. Allocator: the profiler's peak of the step "
             "(parameters, buffers and inputs included); bitwise: loss, gradients and buffers equal to the "
             "unplanned step of the same loop from the same seed.", "",
             f"**{fits} of {len(runs)} applied plans at or below their budget by the allocator, {under} at or below "
             f"their prediction; {same} of {len(runs)} bitwise; meta trace for the CPU within 2 % of the CPU trace "
             f"(store-all) on {close} of {len(ok)} models.**", "",
             "| model | order | plan for | run as | regions | budget | predicted | allocator | allocator - predicted "
             "| fits | bitwise |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, order, x in runs:
        lines.append(f"| {r['model']} | {order} | {x['plan_for']} | {x['run_as']} | {x['regions']} | {_b(x['budget'])} "
                     f"| {_b(x['predicted'])} | {_b(x['allocator'])} | {x['allocator'] - x['predicted']:+,} "
                     f"| {'yes' if x['allocator'] <= x['budget'] else '**NO**'} "
                     f"| {'yes' if x['bitwise'] else '**NO**'} |")
    lines += ["", "| model | library | class | loss | parameters (trainable) | nodes | store-all: cpu trace | meta trace "
              "for cpu | difference | eval trace warned | eval graph = train graph | time |", "|---|---|---|---|---|---|---"
              "|---|---|---|---|---|"]
    for r in ok:
        lines.append(f"| {r['model']} | {r['library']} | {r['class']} | `{r['loss']}` | {_b(r['params'])} ({_b(r['trainable'])}) "
                     f"| {r['nodes']} | {_b(r['store_all'])} | {_meta_cell(r)} "
                     f"| {_pct(r['meta_store_all'], r['store_all']) if isinstance(r['meta_store_all'], int) else '-'} "
                     f"| {'yes' if r['eval_warned'] else 'no'} "
                     f"| {'yes' if r['same_graph'] else 'no'} | {r['seconds']} s |")
    over: dict[str, set[int]] = {}
    for r, _, x in runs:
        if x["allocator"] > x["predicted"]:
            over.setdefault(r["model"], set()).add(x["allocator"] - x["predicted"])
    losses = {r["model"]: r["loss"] for r in ok}
    lines += [""] + [f"- {m} (`{losses[m]}`): over its prediction by {', '.join(f'{d:,}' for d in sorted(ds))} B"
                     for m, ds in over.items()]
    lines += [f"- {r['model']}: the meta trace for the CPU failed: {r['meta_store_all']}" for r in ok
              if not isinstance(r["meta_store_all"], int)]
    lines += [f"- {r['model']}: **failed**: {r['error']}" for r in rows if "error" in r]
    lines += [f"- {line}" for line in skipped]
    return "\n".join(lines).rstrip() + "\n"


def run_suite(suite: str, run_case: Callable[[str, Case], dict], report: Callable[[list[dict], list[str]], str],
              title: str, json_key: str, quick: bool = False, names: list[str] | None = None,
              command: str | None = None, cases: dict[str, Callable[[], Case]] = CASES) -> list[dict]:
    """Run ``run_case`` on the models in ``names`` (default: all of ``cases``, ``QUICK`` with ``quick``) and write
    the page.

    A model whose library is missing is skipped and named; a model that fails is a row with its error, not a
    crash. Only a run over every model (or the quick set) writes ``benchmarks/results/<suite>.md``: a part of
    the models prints its table only, so that a partial run never replaces the full page.
    """
    torch.set_num_threads(2)
    how = next(s.how for s in SUITES if s.name == suite)
    chosen = list(names or (QUICK if quick else cases))
    rows, skipped = [], []
    for name in chosen:
        case = cases[name]()
        if importlib.util.find_spec(case.library) is None:
            skipped.append(f"{name}: skipped, {case.library} is not installed")
            print(skipped[-1], flush=True)
            continue
        log.info("%s: %s", suite, name)
        try:
            rows.append(run_case(name, case))
        except Exception as exc:  # a model that breaks the pipeline is a result to report, not a crash
            log.exception("%s: model %s failed", suite, name)
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
    text = report(rows, skipped)
    if skipped and not quick:
        log.warning("%s: %d of %d models skipped, %s not written; for the full page run %s", suite, len(skipped),
                    len(chosen), f"benchmarks/results/{suite}.md", how)
    elif chosen == list(cases) or quick:
        write_page(f"{suite}.md", title, text, quick=quick, command=command)
        (out_dir(quick) / f"{suite}.json").write_text(json.dumps({"skipped": skipped, json_key: rows}, indent=1) + "\n")
    print(text)
    return rows


def main(quick: bool = False, names: list[str] | None = None, command: str | None = None) -> list[dict]:
    """Run the models in ``names`` (default: all, ``QUICK`` with ``quick``); write the results page."""
    return run_suite("thirdparty", run_case, report, TITLE, "rows", quick=quick, names=names, command=command)


def command_line(module: str) -> str:
    """The command that ran this page, as a user would type it (``PYTHONPATH`` kept)."""
    path = os.environ.get("PYTHONPATH")
    return " ".join([f"PYTHONPATH={path}" if path else "", sys.executable, f"-m {module}", *sys.argv[1:]]).strip()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    warnings.filterwarnings("ignore", category=EvalModeWarning)  # recorded per model in the table
    main(names=sys.argv[1:] or None, command=command_line("benchmarks.thirdparty"))
