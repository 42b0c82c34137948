"""Chunked LM head and loss vs transformers' own gradient checkpointing (NOTE [ Chunked head ] in solvers.model.chunks).

On small transformers GPT-2, Llama and BERT models with a realistic vocabulary
(32,000) at sequence 512: transformers' checkpointing peak (the allocator, one
real step), the least budget we plan with and without the chunked head
(``ilp`` over the chunk menu), that plan applied and measured by the allocator,
the longest sequence (doubling from 512) whose least chunked plan fits
transformers' peak at 512, and our step time at their peak over theirs.

CNN rows (:data:`CNN_CASES`, :func:`run_cnn`): this project's bottleneck
ResNet with ``checkpoint_sequential`` over its blocks, one segment per block,
as "theirs"; and torchvision's DenseNet-121 with its own ``memory_efficient``
checkpointing where torchvision imports (it is no dependency of this project:
the page says when the row is skipped). Nothing of a CNN is chunked, so the
rows say what a one-level plan gains there. The "nested" column is the least
budget when plans may also nest regions (:func:`nested_least`; with the chunk
menus on the language models).

Step times (:func:`compare_steps`): theirs and ours alternate (ABBA...), one
warm-up step after each switch and the best of two timed steps, on one
thread; the ratio is the median over the pairs, with the pairs' min-max, so a
shared machine's load shifting between the two measurements moves the spread,
not the ratio.

Writes ``benchmarks/results/chunked.md``. Run: ``python -m benchmarks.run --only chunked``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

import scheduler
import solvers
from scheduler.measuring.steps import allocator_step_peak
from scheduler.sizing.budget import format_bytes
from solvers.model.chunks import CHUNK_MENU, find_calls
from solvers.menus.chunks import solve_chunked

from benchmarks.pages import write_page

VOCAB, HIDDEN, LAYERS, BATCH = 32000, 128, 2, 1
MLP_MENU = (1, 2, 4)
#: The CNN row: ``scheduler.models.cnn.build_resnet`` at this depth, width, image side, and batch.
CNN = dict(depth=26, width=16, image_size=96, classes=100)
CNN_BATCH = 8


def _model(kind: str, seq: int) -> tuple[Any, dict]:
    import transformers

    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=seq,
                                     use_cache=False)
        return transformers.GPT2LMHeadModel(cfg).train(), {"input_ids": ids, "labels": ids}
    if kind == "llama":
        cfg = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                       max_position_embeddings=seq, use_cache=False)
        return transformers.LlamaForCausalLM(cfg).train(), {"input_ids": ids, "labels": ids}
    cfg = transformers.BertConfig(hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                                  num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=seq,
                                  use_cache=False)
    labels = ids.clone()
    labels[:, ::7] = -100
    return transformers.BertForMaskedLM(cfg).train(), {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                       "labels": labels}


def _loss(out: Any) -> torch.Tensor:
    return out.loss


#: Our solver on the language models: the default, exact over regions and kept nodes on these graphs (``dp`` is
#: exact on chains only: on these its chunked least was 1.6x ilp's on GPT-2).
LM_SOLVER = "ilp"


def _least(graph: Any, menu: tuple[int, ...], mlp_menu: tuple[int, ...]) -> int:
    mlp_menu = mlp_menu if find_calls(graph) else (1,)  # GPT-2's MLPs hold a dropout: never chunked
    try:
        solve_chunked(graph, 1, lambda g, b: solvers.solve(g, b, LM_SOLVER), menu, mlp_menu)
    except solvers.InfeasibleBudget as exc:
        return exc.min_feasible_bytes
    raise AssertionError("a 1-byte budget fits")


@dataclass(frozen=True)
class Side:
    """One way of running the step: ``on()`` installs it on the model, ``off()`` undoes it."""

    on: Callable[[], Any]
    off: Callable[[], Any]


@dataclass(frozen=True)
class StepRatio:
    """Our step time over theirs: the median of the pairs' ratios, their min and max, and the pair count."""

    median: float
    low: float
    high: float
    pairs: int

    def __str__(self) -> str:
        return f"{self.median:.2f} ({self.low:.2f}-{self.high:.2f})"


def compare_steps(step: Callable[[], Any], theirs: Side, ours: Side, pairs: int, *, timed: int = 2,
                  threads: int = 1, clock: Callable[[], float] = time.perf_counter) -> StepRatio:
    """Our step time over theirs, measured in ``pairs`` adjacent pairs (ABBA...: the order alternates).

    Each side, once installed, runs one warm-up step and ``timed`` steps, of
    which the fastest counts (load from other jobs only ever adds time). The
    ratio is the median of the pairs' ratios; ``threads`` intra-op threads
    while timing (one: a 2-core machine shared with other jobs slows a
    two-thread step whenever either core is taken). Unlike
    ``scheduler.comparing.headtohead.alternate``, each side is installed on the
    one model for its turn and removed after it (outside the timed steps).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    ratios = []
    try:
        for p in range(pairs):
            times = {}
            for name in (("theirs", "ours") if p % 2 == 0 else ("ours", "theirs")):
                side = theirs if name == "theirs" else ours
                side.on()
                try:
                    step()
                    best = float("inf")
                    for _ in range(timed):
                        t0 = clock()
                        step()
                        best = min(best, clock() - t0)
                    times[name] = best
                finally:
                    side.off()
            ratios.append(times["ours"] / times["theirs"])
    finally:
        torch.set_num_threads(before)
    return StepRatio(statistics.median(ratios), min(ratios), max(ratios), pairs)


def _lm_step(model: Any, kwargs: dict) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(**kwargs).loss.backward()
    return step


def _solve(graph: Any, budget: int) -> Any:
    mlp_menu = MLP_MENU if find_calls(graph) else (1,)
    return solve_chunked(graph, budget, lambda g, b: solvers.solve(g, b, LM_SOLVER), CHUNK_MENU, mlp_menu)


def _measure(model: Any, kwargs: dict, plan: Any) -> int:
    scheduler.apply(model, plan)
    try:
        return allocator_step_peak(model, model, (), kwargs, _loss)
    finally:
        scheduler.remove(model)


def _theirs_side(model: Any) -> Side:
    return Side(lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}),
                model.gradient_checkpointing_disable)


def _ours_side(model: Any, plan: Any) -> Side:
    return Side(lambda: scheduler.apply(model, plan), lambda: scheduler.remove(model))


def run_model(kind: str, seq: int, pairs: int, longest_to: int) -> dict:
    model, kwargs = _model(kind, seq)
    theirs_side = _theirs_side(model)
    theirs_side.on()
    theirs = allocator_step_peak(model, model, (), kwargs, _loss)
    theirs_side.off()
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    plain_least, least = _least(graph, (1,), (1,)), _least(graph, CHUNK_MENU, MLP_MENU)
    plan = _solve(graph, least)
    measured = _measure(model, kwargs, plan)
    at_theirs = _solve(graph, theirs)
    measured_theirs = _measure(model, kwargs, at_theirs)
    ratio = compare_steps(_lm_step(model, kwargs), theirs_side, _ours_side(model, at_theirs), pairs)
    longest = seq
    while longest * 2 <= longest_to:
        m2, kw2 = _model(kind, longest * 2)
        if _least(scheduler.trace(m2, (), kw2, loss=_loss), CHUNK_MENU, MLP_MENU) > theirs:
            break
        longest *= 2
    return dict(model=kind, theirs=theirs, plain_least=plain_least, least=least, predicted=plan.peak_bytes,
                measured=measured, k=_ks(plan), k_theirs=_ks(at_theirs), predicted_theirs=at_theirs.peak_bytes,
                measured_theirs=measured_theirs, longest=longest, time_ratio=ratio,
                recomputed=_recomputed(graph, at_theirs),
                their_recomputed=_flops_share(model, (), kwargs, _their_layers(model)),
                **_nested(graph, lambda plan: _measure(model, kwargs, plan), CHUNK_MENU, MLP_MENU))


def _recomputed(graph: Any, plan: Any) -> float:
    """The FLOPs ``plan`` recomputes (predicted), as a share of the traced forward's FLOPs (0: nothing)."""
    return solvers.simulate(graph, plan).recompute_flops / max(graph.total_fwd_flops(), 1)


def _flops_share(model: Any, args: tuple, kwargs: dict, paths: Sequence[str]) -> float:
    """The forward FLOPs of the calls at ``paths`` (what checkpointing them recomputes), as a share of the
    whole forward's, counted by torch's ``FlopCounterMode`` on one forward (the paths are disjoint)."""
    from torch.utils.flop_counter import FlopCounterMode

    root = type(model).__name__
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args, **kwargs)
    counts = counter.get_flop_counts()
    return sum(sum(counts.get(f"{root}.{p}", {}).values()) for p in paths) / max(counter.get_total_flops(), 1)


def _their_layers(model: Any) -> list[str]:
    """The calls transformers checkpoints: its ``GradientCheckpointingLayer`` submodules."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [name for name, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]


@dataclass(frozen=True)
class CnnCase:
    """A CNN row: how to build the model at a batch, and how its own library checkpoints it.

    Attributes:
        name: the row's name. build: ``batch -> (model, args, kwargs)``, the model returning its loss.
        theirs: ``model -> Side`` installing their checkpointing. their_calls: ``model -> paths`` of the calls
        theirs recomputes. batch: the measured batch. solver: ours (``dp`` where the model is a chain of blocks;
        ``ilp`` where ``dp``'s chain plans cannot reach their peak). what: the setup, for the page. needs: the
        packages it imports that this project does not depend on (the row is skipped, saying so, without them).
    """

    name: str
    build: Callable[[int], tuple[Any, tuple, dict]]
    theirs: Callable[[Any], Side]
    their_calls: Callable[[Any], list[str]]
    batch: int
    solver: str
    what: str
    needs: tuple[str, ...] = ()


def _resnet(batch: int) -> tuple[Any, tuple, dict]:
    from scheduler.models.cnn import build_resnet

    torch.manual_seed(0)
    model, args, kwargs = build_resnet(batch=batch, **CNN)
    return model.train(), args, kwargs


def _sequential_side(model: Any) -> Side:
    """Theirs for the ResNet: ``checkpoint_sequential`` over the blocks, one segment per block (the last segment
    runs plainly, as ``checkpoint_sequential`` runs it)."""
    from torch.utils.checkpoint import checkpoint_sequential

    blocks = model.layers

    def on() -> None:
        blocks.forward = lambda x: checkpoint_sequential(blocks, len(blocks), x, use_reentrant=False)

    return Side(on, lambda: blocks.__dict__.pop("forward"))


class _WithLoss(torch.nn.Module):
    """A torchvision classifier returning its cross-entropy loss (``forward(images, labels)``)."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.net(images), labels)


def _densenet(batch: int) -> tuple[Any, tuple, dict]:
    import torchvision

    torch.manual_seed(0)
    model = _WithLoss(torchvision.models.densenet121(weights=None, num_classes=CNN["classes"])).train()
    side = DENSENET_IMAGE
    return model, (torch.randn(batch, 3, side, side),), {"labels": torch.randint(0, CNN["classes"], (batch,))}


def _dense_layers(model: Any) -> list[tuple[str, Any]]:
    from torchvision.models.densenet import _DenseLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, _DenseLayer)]


def _memory_efficient_side(model: Any) -> Side:
    """Theirs for DenseNet: torchvision's ``memory_efficient`` (each dense layer's concatenation, norm1, relu1
    and conv1 checkpointed), switched on every dense layer."""
    layers = [m for _, m in _dense_layers(model)]

    def switch(value: bool) -> Callable[[], None]:
        def go() -> None:
            for m in layers:
                m.memory_efficient = value
        return go

    return Side(switch(True), switch(False))


DENSENET_IMAGE = 64
CNN_CASES = (
    CnnCase(f"resnet-{CNN['depth']}", _resnet, _sequential_side,
            lambda m: [f"layers.{i}" for i in range(len(m.layers) - 1)],  # the last segment is not checkpointed
            CNN_BATCH, "dp",
            f"this project's bottleneck ResNet-{CNN['depth']} (width {CNN['width']}, {CNN['image_size']}x"
            f"{CNN['image_size']} images, batch {CNN_BATCH}, BatchNorm); theirs: `checkpoint_sequential(model.layers, "
            "one segment per block, use_reentrant=False)` (every block but the last checkpointed, as transformers "
            "does per layer); ours: `dp`"),
    CnnCase("densenet-121", _densenet, _memory_efficient_side,
            lambda m: [f"{p}.{c}" for p, _ in _dense_layers(m) for c in ("norm1", "relu1", "conv1")], 4, "ilp",
            f"torchvision's DenseNet-121 (random weights, {DENSENET_IMAGE}x{DENSENET_IMAGE} images, batch 4); "
            "theirs: its own `memory_efficient=True`; ours: `ilp` (DenseNet is no chain of blocks: `dp`'s least "
            "plan is above their peak)", needs=("torchvision",)),
)


def _plain_least(graph: Any, solver: str) -> int:
    try:
        solvers.solve(graph, 1, solver)
    except solvers.InfeasibleBudget as exc:
        return exc.min_feasible_bytes
    raise AssertionError("a 1-byte budget fits")


def _missing(case: CnnCase) -> str | None:
    """Why ``case`` cannot run here (a package it needs does not import), or None."""
    import importlib

    for name in case.needs:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or torchvision's C ops refusing this torch build
            return f"{name} does not import here ({type(exc).__name__}: {str(exc)[:80]})"
    return None


def run_cnn(case: CnnCase, pairs: int, largest_to: int) -> dict:
    """A CNN row: their checkpointing peak against our least one-level plan and our plan at their peak
    (nothing of a CNN is chunked: NOTE [ Chunked head ]), and the largest batch (doubling) at their peak."""
    model, args, kwargs = case.build(case.batch)
    theirs_side = case.theirs(model)
    theirs_side.on()
    theirs = allocator_step_peak(model, model, args, kwargs, None)
    theirs_side.off()
    graph = scheduler.trace(model, args, kwargs)
    least = _plain_least(graph, case.solver)

    def measured(plan: Any) -> int:
        scheduler.apply(model, plan)
        try:
            return allocator_step_peak(model, model, args, kwargs, None)
        finally:
            scheduler.remove(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(*args, **kwargs).backward()

    plan, at_theirs = solvers.solve(graph, least, case.solver), solvers.solve(graph, theirs, case.solver)
    ratio = compare_steps(step, theirs_side, _ours_side(model, at_theirs), pairs)
    largest = case.batch
    while largest * 2 <= largest_to:
        m2, a2, kw2 = case.build(largest * 2)
        if _plain_least(scheduler.trace(m2, a2, kw2), case.solver) > theirs:
            break
        largest *= 2
    return dict(model=case.name, what=case.what, batch=case.batch, theirs=theirs, least=least,
                predicted=plan.peak_bytes, measured=measured(plan), predicted_theirs=at_theirs.peak_bytes,
                measured_theirs=measured(at_theirs), largest=largest, time_ratio=ratio,
                recomputed=_recomputed(graph, at_theirs),
                their_recomputed=_flops_share(model, args, kwargs, case.their_calls(model)),
                **_nested(graph, measured))


def nested_least(graph: Any, menu: tuple[int, ...] = (1,), mlp_menu: tuple[int, ...] = (1,)) -> tuple[int, Any]:
    """The least budget of a plan that may nest regions (NOTE [ Nested regions ] in ``solvers.model.nested``) on
    ``graph``, with the chunk menus of :func:`_least` (the default: nothing chunked), and the plan solved at it:
    ``scheduler.solve(..., nested=True)``: the frontier program over the menu of inner regions where the graph
    is narrow enough (optimal over it), else the cheapest of ``dp`` over nested candidates, the one-level solver
    (``ilp``) and nestings of its plan (NOTE [ Solving nested plans ])."""
    mlp_menu = mlp_menu if find_calls(graph) else (1,)
    options = dict(nested=True, chunks=menu if menu != (1,) else None,
                   mlp_chunks=mlp_menu if mlp_menu != (1,) else None)
    try:
        scheduler.solve(graph, 1, **options)
    except solvers.InfeasibleBudget as exc:
        return exc.min_feasible_bytes, scheduler.solve(graph, exc.min_feasible_bytes, **options)
    raise AssertionError("a 1-byte budget fits")


def _ks(plan: Any) -> str:
    return f"{plan.findings.get('head_chunks', 1)}/{plan.findings.get('call_chunks', 1)}"


def planned_only(layers: int, seq: int) -> dict:
    """Llama-3-8B's shape (vocabulary 128,256) in bf16, traced on the meta device for the default target
    (an H100): least budgets planned, nothing measured (it does not fit this machine)."""
    from scheduler.models import build

    ex = build("hf:llama-3-8b", layers=layers, batch=1, seq=seq, dtype="bf16", device="meta")
    graph = scheduler.trace(ex.model, ex.args, ex.kwargs, loss=ex.loss)
    return dict(store_all=solvers.simulate(graph).peak_bytes, plain=_least(graph, (1,), (1,)),
                head=_least(graph, CHUNK_MENU, (1,)), both=_least(graph, CHUNK_MENU, MLP_MENU))


def _nested(graph: Any, measure: Callable[[Any], int], *menus: tuple[int, ...]) -> dict:
    """A row's nested cells: the least budget with nesting allowed, the plan's inner regions, its allocator peak."""
    least, plan = nested_least(graph, *menus)
    return dict(nested=least, nested_inner=len(plan.inner), nested_measured=measure(plan))


def _nested_cells(rows: Sequence[dict]) -> tuple[str, str, Callable[[dict], str]]:
    """The nested column's header, rule and cell (nothing when no row has one)."""
    if all(r.get("nested") is None for r in rows):
        return "", "", lambda r: ""
    return (" our least, nesting allowed: predicted / measured (inner regions) | ", "---|",
            lambda r: (f" {format_bytes(r['nested'])} ({r['nested'] / r['theirs']:.2f}) / "
                       f"{format_bytes(r['nested_measured'])} ({r['nested_inner']}) |") if r.get("nested") else " - |")


def cnn_lines(cnns: Sequence[dict], largest_to: int) -> list[str]:
    """The page's CNN section from :func:`run_cnn`'s rows (and ``{model, skipped}`` for a case not run)."""
    cnn_rows = [r for r in cnns if "skipped" not in r]
    head, rule, cell = _nested_cells(cnn_rows)
    lines = ["", "CNNs (a CNN has nothing to chunk: its head and loss are over batch rows, its convolutions read "
              "neighbouring rows, so ours is a one-level plan): "
              + "; ".join(f"**{r['model']}**: {r['what']}" for r in cnn_rows)
              + f". {CNN['classes']} classes. Largest batch: doubling up to {largest_to}, the largest whose least "
              "plan is at most their peak at the row's batch. Measured as above.", "",
              "| model | their peak | our least | / theirs |" + head + " measured (predicted) | at their peak: "
              "measured (predicted) | recomputed ours / theirs | largest batch at their peak "
              "| step time ours / theirs |",
              "|---|---|---|---|" + rule + "---|---|---|---|---|"]
    for c in cnn_rows:
        lines.append(f"| {c['model']} | {format_bytes(c['theirs'])} | {format_bytes(c['least'])} | "
                     f"{c['least'] / c['theirs']:.2f} |{cell(c)} {format_bytes(c['measured'])} "
                     f"({format_bytes(c['predicted'])}) | {format_bytes(c['measured_theirs'])} "
                     f"({format_bytes(c['predicted_theirs'])}) | {c['recomputed']:.2f} / {c['their_recomputed']:.2f} "
                     f"| {c['largest']} | {c['time_ratio']} |")
    lines.append("")
    for r in cnns:
        if "skipped" in r:
            lines += [f"Not measured: {r['model']}: {r['skipped']}.", ""]
    lines += ["What a CNN gains: " + "; ".join(
        f"{c['model']}, a least budget {1 - c['least'] / c['theirs']:.0%} below their peak, "
        + ("no larger batch" if c["largest"] == c["batch"] else f"batch {c['largest']} at their peak")
        + f", and at their peak a plan recomputing {c['recomputed']:.2f} of the forward against their "
        f"{c['their_recomputed']:.2f}" for c in cnn_rows) + " (chunks buy a CNN nothing; what is left is where a "
        "one-level plan puts its boundaries)."]
    return lines


def main(quick: bool = False) -> None:
    seq, pairs, longest_to, largest_to = (512, 3, 1024, 16) if quick else (512, 11, 4096, 64)
    rows = [run_model(kind, seq, pairs, longest_to) for kind in ("gpt2", "llama", "bert")]
    cnns = [dict(model=case.name, skipped=why) if (why := _missing(case)) else run_cnn(case, pairs, largest_to)
            for case in CNN_CASES]
    big_layers, big_seq = (2, 2048) if quick else (2, 8192)
    big = planned_only(big_layers, big_seq)
    head, rule, cell = _nested_cells(rows)
    lines = [
        f"CPU, fp32, batch {BATCH}, sequence {seq}, vocabulary {VOCAB}, hidden {HIDDEN}, "
        f"{LAYERS} layers, `use_cache=False` (as transformers' checkpointing sets it). Theirs: "
        "`gradient_checkpointing_enable(use_reentrant=False)`, peak by the allocator "
        f"(profiler memory events, one real step). Ours: `{LM_SOLVER}` over the head menu "
        f"{CHUNK_MENU} and the MLP menu {MLP_MENU} (k head/MLP in the table; 1 = as traced, but a head ending in "
        "a plain linear layer: whole, fused with its loss, NOTE [ Fused head ]), the plan applied "
        "onto the same model and measured the same way, at our least budget and at their peak. Longest "
        f"sequence: doubling from {seq} up to {longest_to}, the longest whose least plan is at most their peak at "
        f"{seq}. Nesting allowed: the least budget of `scheduler.solve(..., nested=True)` with the same menus "
        "(`ilp`'s frontier program over the menu of inner regions where the graph is narrow enough, optimal over "
        "it; else, as on these chunked graphs, the cheapest of `dp` over nested candidates, `ilp`'s one-level plan "
        "and nestings of it, feasible: NOTE [ Solving nested plans ]), the plan at it "
        "measured by the allocator, with its count of inner regions. Recomputed: the FLOPs our plan at their peak "
        "recomputes (predicted), and those theirs does (the "
        "calls it checkpoints, by torch's `FlopCounterMode`), as shares of the forward's FLOPs. Step time: ours at "
        f"their peak over theirs, {pairs} adjacent pairs alternating the order (ABBA...), each side one warm-up "
        "step after the switch and the best of two timed steps, one thread; the median of the pairs' ratios, their "
        "min-max in brackets.",
        "",
        "| model | their peak | our least, unchunked | our least, chunked (k) | / theirs |" + head +
        " measured (predicted) | at their peak: measured (k) | recomputed ours / theirs | longest seq at their peak "
        "| step time ours / theirs |",
        "|---|---|---|---|---|" + rule + "---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {format_bytes(r['theirs'])} | {format_bytes(r['plain_least'])} | "
                     f"{format_bytes(r['least'])} ({r['k']}) | {r['least'] / r['theirs']:.2f} |{cell(r)} "
                     f"{format_bytes(r['measured'])} ({format_bytes(r['predicted'])}) | "
                     f"{format_bytes(r['measured_theirs'])} ({r['k_theirs']}) | "
                     f"{r['recomputed']:.2f} / {r['their_recomputed']:.2f} | {r['longest']} | {r['time_ratio']} |")
    lines += cnn_lines(cnns, largest_to)
    lines += ["", f"Planned only (meta trace, bf16, for an H100): Llama-3-8B's shape with {big_layers} layers at "
              f"batch 1, sequence {big_seq} (vocabulary 128,256; transformers' loss upcasts the logits to fp32). "
              f"Least budget from `{LM_SOLVER}`:", "",
              "| store-all | least, one level | least, head chunked | least, head and MLPs chunked |",
              "|---|---|---|---|",
              f"| {format_bytes(big['store_all'])} | {format_bytes(big['plain'])} | {format_bytes(big['head'])} | "
              f"{format_bytes(big['both'])} |"]
    path = write_page("chunked.md", "Chunked LM head + loss (and MLPs) vs transformers' gradient checkpointing",
                      lines, quick=quick)
    print(path.read_text())


if __name__ == "__main__":
    main()
