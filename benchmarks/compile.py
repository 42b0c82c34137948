"""Issue 35: our plans compiled with inductor against torch.compile's own activation memory budget.

For transformers GPT-2 and Llama (small configs), a torchvision ViT and a
torchvision ResNet-18 at a small input, each wrapped so that a call returns
the loss, on one torch thread, in one process:

* the compiled unplanned step (``torch.compile``, inductor, budget 1.0): its
  peak, its step time, and its gradients, the reference of every row;
* compile's own knob, ``torch._functorch.config.activation_memory_budget``
  at 0.1, 0.3, 0.5, 0.7 and 0.9 (every call of that model runs inside the
  config patch);
* our plan (``dp``, kept nodes on: NOTE [ Kept calls under torch.compile ]; LM heads in ``CHUNKS``)
  solved at each of their measured peaks, applied onto a copy of the model and compiled with
  inductor at budget 1.0; solved again aimed by what it measured (at most ``SOLVES`` times);
* our plan below compile's least peak (``BELOW`` of it), where ours reaches.

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

from benchmarks.pages import out_dir, write_page

log = logging.getLogger("benchmarks.compile")

#: torch intra-op threads while measuring (the machine is shared: one thread is steadier).
THREADS = 1
#: Alternated rounds per pair (median of each side's steps).
REPEATS = 3
#: torch.compile's activation_memory_budget fractions.
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
#: Solves of ours per row at most (the budget lowered while ours measures above the target).
SOLVES = 3
#: Ours below compile's least peak: at this fraction of it.
BELOW = 0.9
SOLVER = "dp"
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


def grad_diff(side: Side, reference: dict[str, torch.Tensor]) -> float:
    """Largest |g - ref| over the largest |ref| (0: bitwise)."""
    got = side.grads()
    scale = max(float(g.abs().max()) for g in reference.values())
    worst = max(float((got[n].double() - g.double()).abs().max()) if n in got else float("inf")
                for n, g in reference.items())
    return worst / scale


def rounds(sides: list[Side], args: tuple, repeats: int) -> list[float]:
    """Median step time of each side over ``repeats`` alternated rounds (the order rotates each round)."""
    times: list[list[float]] = [[] for _ in sides]
    for r in range(repeats):
        order = list(range(len(sides)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            t0 = time.perf_counter()
            sides[i].call(args)
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


# --------------------------------------------------------------------------- one model
def _key(plan: Any) -> tuple:
    return (tuple(plan.modules), tuple(plan.save_ops), tuple(plan.inner), tuple(plan.chunks))


def ours_at(graph: Any, model: nn.Module, args: tuple, target: int, label: str,
            made: dict[tuple, tuple[Side, int, Any]], chunks: tuple[int, ...] | None = None
            ) -> tuple[Side | None, dict[str, Any]]:
    """Our plan for a measured peak of at most ``target`` bytes, applied and compiled.

    Solved at ``target`` first (at our least feasible budget when our eager prediction cannot reach it:
    inductor often measures under it), then at the last plan's prediction less what it measured over the
    target (down while ours measures above, up while under: a faster plan that still fits; inductor's
    channels-last copies on a ResNet are a constant over the prediction), ``SOLVES`` solves at most; the fitting
    plan solved at the largest budget is kept, else the lowest. ``made`` holds the plans compiled for this
    model already (by regions and kept calls), so a plan found again is not compiled again."""
    import scheduler
    from solvers.errors import InfeasibleBudget

    budget, row = target, {"target_bytes": target, "solves": 0}
    best: tuple[Side, dict[str, Any]] | None = None
    tried: set[int] = set()
    for _ in range(SOLVES):
        row["solves"] += 1
        try:
            plan = scheduler.solve(graph, budget=budget, solver=SOLVER, selective=True, chunks=chunks)
        except InfeasibleBudget as exc:
            row["floor_bytes"] = exc.min_feasible_bytes
            if budget >= exc.min_feasible_bytes or exc.min_feasible_bytes in tried:
                break
            budget = exc.min_feasible_bytes
            tried.add(budget)
            continue
        key = _key(plan)
        if key not in made:
            planned = copy.deepcopy(model)
            scheduler.apply(planned, plan)
            side = compiled(label, planned, args)
            made[key] = (side, side.peak(args), plan)
        side, peak, plan = made[key]
        got = dict(budget_bytes=budget, peak_bytes=peak, predicted_bytes=scheduler.simulate(graph, plan).peak_bytes,
                   regions=len(plan.modules), kept=sum(len(r) for r in plan.save_ops), compile_s=side.compile_s)
        fits = peak <= target
        if best is None or (fits and (best[1]["peak_bytes"] > target or budget > best[1]["budget_bytes"])) or \
                (not fits and best[1]["peak_bytes"] > target and peak < best[1]["peak_bytes"]):
            best = (side, got)
        # the next prediction aimed at the target less what inductor measured over (or under) this plan's prediction
        new = max(int(got["predicted_bytes"] - (peak - target)), 1)
        if new in tried or new == budget:
            break
        tried.add(budget)
        budget = new
    if best is None:
        row["reached"] = False
        return None, row
    row.update(best[1], reached=best[1]["peak_bytes"] <= target)
    return best[0], row


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
                                       "predicted_bytes": scheduler.simulate(graph).peak_bytes},
                             "rows": []}
    log.info("compile: %s plain %.1f MiB, compiled in %.0f s", name, entry["plain"]["peak_bytes"] / 2**20,
             plain.compile_s)
    least = None
    made: dict[tuple, tuple[Side, int, Any]] = {}
    chunks = CHUNKS if isinstance(model, LmStep) else None  # the head and its loss in row chunks
    for f in fractions:
        theirs = compiled(f"compile@{f:g}", copy.deepcopy(model), args, fraction=f)
        their = {"fraction": f, "peak_bytes": theirs.peak(args), "compile_s": theirs.compile_s}
        theirs.call(args)
        their["grad_diff"] = grad_diff(theirs, reference)
        least = their["peak_bytes"] if least is None else min(least, their["peak_bytes"])
        try:
            side, ours = ours_at(graph, model, args, their["peak_bytes"], f"ours@{f:g}", made, chunks)
        except Exception as exc:  # one failing row is a finding, not the end of the run
            log.warning("compile: %s ours@%g failed", name, f, exc_info=True)
            side, ours = None, {"target_bytes": their["peak_bytes"], "solves": 0, "reached": False,
                                "reason": f"{type(exc).__name__}: {exc}"[:200]}
        if side is not None:
            side.call(args)
            ours["grad_diff"] = grad_diff(side, reference)
        pair = [plain, theirs] + ([side] if side is not None else [])
        times = rounds(pair, args, repeats)
        their["time_s"] = times[1]
        if len(times) > 2:
            ours["time_s"] = times[2]
        entry["rows"].append({"theirs": their, "ours": ours, "plain_time_s": times[0]})
        log.info("compile: %s @%g theirs %.1f MiB %.1f ms, ours %s", name, f, their["peak_bytes"] / 2**20,
                 their["time_s"] * 1e3, {k: v for k, v in ours.items() if k in ("peak_bytes", "time_s", "solves")})
        del theirs, pair
    try:
        side, below = ours_at(graph, model, args, int(least * BELOW), "ours below", made, chunks)
    except Exception as exc:
        log.warning("compile: %s ours below failed", name, exc_info=True)
        side, below = None, {"solves": 0, "reached": False, "reason": f"{type(exc).__name__}: {exc}"[:200]}
    if side is not None:
        side.call(args)
        below["grad_diff"] = grad_diff(side, reference)
        times = rounds([plain, side], args, repeats)
        below["time_s"], below["plain_time_s"] = times[1], times[0]
    entry["below"] = below
    entry["least_theirs_bytes"] = least
    made.clear()
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
                           "repeats": repeats, "solver": SOLVER, "fractions": list(fractions), "models": []}
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


# --------------------------------------------------------------------------- the page
def _mib(b: Any) -> str:
    return f"{b / 2**20:.2f}" if isinstance(b, (int, float)) else "-"


def _ms(s: Any) -> str:
    return f"{s * 1e3:.1f}" if isinstance(s, (int, float)) else "-"


def _diff(d: Any) -> str:
    return "0" if d == 0 else (f"{d:.1e}" if isinstance(d, float) else "-")


TITLE = "Our plans compiled with inductor against torch.compile's activation memory budget"


def _pairs(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(m["model"], r["theirs"], r["ours"]) for m in doc["models"] if "rows" in m for r in m["rows"]]


def _wins(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    return bool(ours.get("reached")) and ours["peak_bytes"] <= theirs["peak_bytes"] and \
        ours.get("time_s", float("inf")) <= theirs["time_s"]


def report(doc: dict[str, Any]) -> str:
    """The Markdown page below its title and header."""
    lines = [
        f"torch {doc['torch']} ({doc['python']}: the venv of `thirdparty`, which has torchvision), inductor, "
        f"{doc['threads']} torch thread; our solver `{doc['solver']}` with kept nodes (saved under compile by "
        "torch's selective checkpoint, NOTE [ Kept calls under torch.compile ]).",
        "",
        "Each row: compile's own knob `torch._functorch.config.activation_memory_budget` at the row's fraction, "
        "and our plan solved with compile's measured peak as its budget (solved again, up to "
        f"{SOLVES} times, at its prediction less what it measured over that peak, or plus what under; the fitting "
        "plan solved at the largest budget kept; language models' heads and losses in up to "
        f"{max(CHUNKS)} row chunks), applied onto a copy of the model and compiled with inductor "
        "at budget 1.0. Peaks: the allocator's (profiler memory events), whole step. Times: median of "
        f"{doc['repeats']} alternated rounds of the compiled unplanned step, compile's and ours. `pred`: our "
        "plan's `simulate` peak (an eager prediction, the bound for compiled runs). Gradients: the largest "
        "difference from the compiled unplanned step's over its largest gradient (0: bitwise). Dropout off.",
        "",
        "| model | budget | compile MiB | compile ms | compile grads | ours MiB | pred MiB | ours ms | "
        "ours/compile time | ours grads | solves | regions, kept calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in doc["models"]:
        if "rows" not in m:
            lines.append(f"| {m['model']} | | | | | | | | | | | skipped: {m.get('skipped')} |")
            continue
        p = m["plain"]
        plain_ms = statistics.median(r["plain_time_s"] for r in m["rows"])
        lines.append(f"| {m['model']} | plain (1.0) | {_mib(p['peak_bytes'])} | {_ms(plain_ms)} | 0 | | "
                     f"{_mib(p['predicted_bytes'])} | | | | | |")
        for r in m["rows"]:
            t, o = r["theirs"], r["ours"]
            if not o.get("reached") and "peak_bytes" not in o:
                lines.append(f"| {m['model']} | {t['fraction']:g} | {_mib(t['peak_bytes'])} | {_ms(t['time_s'])} | "
                             f"{_diff(t['grad_diff'])} | no plan ({o.get('reason') or 'floor ' + _mib(o.get('floor_bytes'))}) | | | | | "
                             f"{o['solves']} | |")
                continue
            ratio = f"{o['time_s'] / t['time_s']:.3f}" if "time_s" in o else "-"
            lines.append(f"| {m['model']} | {t['fraction']:g} | {_mib(t['peak_bytes'])} | {_ms(t['time_s'])} | "
                         f"{_diff(t['grad_diff'])} | {_mib(o['peak_bytes'])} | {_mib(o['predicted_bytes'])} | "
                         f"{_ms(o.get('time_s'))} | {ratio} | {_diff(o.get('grad_diff'))} | {o['solves']} | "
                         f"{o['regions']}, {o['kept']} |")
        b = m["below"]
        if "peak_bytes" in b:
            lines.append(f"| {m['model']} | ours below {BELOW:g} x {_mib(m['least_theirs_bytes'])} | | | | "
                         f"{_mib(b['peak_bytes'])} | {_mib(b['predicted_bytes'])} | {_ms(b.get('time_s'))} | | "
                         f"{_diff(b.get('grad_diff'))} | {b['solves']} | {b['regions']}, {b['kept']} |")
        else:
            lines.append(f"| {m['model']} | ours below {BELOW:g} x {_mib(m['least_theirs_bytes'])} | | | | no plan "
                         f"(floor {_mib(b.get('floor_bytes'))}) | | | | | {b['solves']} | |")
    lines += ["", "## What it shows", ""] + claims(doc)
    lines += ["", "Model sizes: " + "; ".join(
        f"{m['model']} {m['options']}" + (f" ({m['graph_nodes']} nodes, plain compile {m['plain']['compile_s']:.0f} s, "
                                          f"{m['wall_s']:.0f} s in all)" if "rows" in m else "")
        for m in doc["models"]), ""]
    return "\n".join(lines)


def claims(doc: dict[str, Any]) -> list[str]:
    """The headline lines: where ours is at least as fast at no larger peak, and where not, in numbers."""
    pairs = _pairs(doc)
    wins = [(n, t) for n, t, o in pairs if _wins(t, o)]
    won = ", ".join(f"{n}@{t['fraction']:g}" for n, t in wins) or "none"
    out = [f"- ours at least as fast at no larger peak: {len(wins)} of {len(pairs)} budgets ({won})"]
    for n, t, o in pairs:
        if _wins(t, o):
            continue
        if not o.get("reached") and "peak_bytes" not in o:
            out.append(f"  - {n}@{t['fraction']:g}: no plan of ours at {_mib(t['peak_bytes'])} MiB (our least "
                       f"{_mib(o.get('floor_bytes'))} MiB)")
            continue
        why = []
        if o["peak_bytes"] > t["peak_bytes"]:
            least = f", our least prediction {_mib(o['floor_bytes'])} MiB" if "floor_bytes" in o else ""
            why.append(f"ours {_mib(o['peak_bytes'])} MiB against {_mib(t['peak_bytes'])} after {o['solves']} solves{least}")
        if "time_s" in o and o["time_s"] > t["time_s"]:
            why.append(f"ours {_ms(o['time_s'])} ms against {_ms(t['time_s'])} ({o['time_s'] / t['time_s']:.3f})")
        out.append(f"  - {n}@{t['fraction']:g}: " + "; ".join(why))
    below = [(m["model"], m["below"], m["least_theirs_bytes"]) for m in doc["models"] if "below" in m]
    out.append("- ours below compile's least peak: " + "; ".join(
        f"{n} {_mib(b['peak_bytes'])} MiB against {_mib(least)}" if b.get("peak_bytes", least) < least
        else f"{n} not reached ({_mib(b.get('peak_bytes', b.get('floor_bytes')))} MiB against {_mib(least)})"
        for n, b, least in below))
    ours = [o for _, _, o in pairs if "peak_bytes" in o] + [b for _, b, _ in below if "peak_bytes" in b]
    under = [o for o in ours if o["peak_bytes"] <= o["predicted_bytes"]]
    worst = max((o["peak_bytes"] / o["predicted_bytes"] for o in ours), default=0.0)
    out.append(f"- our measured peak under inductor at or under our (eager) prediction: {len(under)} of {len(ours)} "
               f"(largest measured/predicted {worst:.3f})")
    grads = [o.get("grad_diff") for o in ours if o.get("grad_diff") is not None]
    theirs = [t["grad_diff"] for _, t, _ in pairs]
    out.append(f"- gradients against the compiled unplanned step: ours at most {max(grads, default=0):.1e}, "
               f"compile's at most {max(theirs, default=0):.1e} (relative to the largest gradient)")
    return out


def main(quick: bool = False) -> None:
    import importlib.util

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
    main(quick="--quick" in sys.argv[1:])
