"""Chunked LM head and loss vs transformers' own gradient checkpointing (NOTE [ Chunked head ] in solvers.chunks).

On small transformers GPT-2, Llama and BERT models with a realistic vocabulary
(32,000) at sequence 512: transformers' checkpointing peak (the allocator, one
real step), the least budget we plan with and without the chunked head
(``dp`` over the chunk menu), that plan applied and measured by the allocator,
the longest sequence (doubling from 512) whose least chunked plan fits
transformers' peak at 512, and our step time at their peak over theirs
(median of steps).

Writes ``benchmarks/results/chunked.md``. Run: ``python -m benchmarks.run --only chunked``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import scheduler
import solvers
from scheduler.measuring.steps import allocator_step_peak
from scheduler.sizing.budget import format_bytes
from solvers.chunks import CHUNK_MENU, find_calls, solve_chunked

from benchmarks.pages import write_page

VOCAB, HIDDEN, LAYERS, BATCH = 32000, 128, 2, 1
MLP_MENU = (1, 2, 4)


def _model(kind: str, seq: int) -> tuple[Any, dict]:
    import transformers

    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=seq)
        return transformers.GPT2LMHeadModel(cfg).train(), {"input_ids": ids, "labels": ids}
    if kind == "llama":
        cfg = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                       max_position_embeddings=seq)
        return transformers.LlamaForCausalLM(cfg).train(), {"input_ids": ids, "labels": ids}
    cfg = transformers.BertConfig(hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                                  num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=seq)
    labels = ids.clone()
    labels[:, ::7] = -100
    return transformers.BertForMaskedLM(cfg).train(), {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                       "labels": labels}


def _loss(out: Any) -> torch.Tensor:
    return out.loss


def _least(graph: Any, menu: tuple[int, ...], mlp_menu: tuple[int, ...]) -> int:
    mlp_menu = mlp_menu if find_calls(graph) else (1,)  # GPT-2's MLPs hold a dropout: never chunked
    try:
        solve_chunked(graph, 1, lambda g, b: solvers.solve(g, b, "dp"), menu, mlp_menu)
    except solvers.InfeasibleBudget as exc:
        return exc.min_feasible_bytes
    raise AssertionError("a 1-byte budget fits")


def _step_time(model: Any, kwargs: dict, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        model(**kwargs).loss.backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _solve(graph: Any, budget: int) -> Any:
    mlp_menu = MLP_MENU if find_calls(graph) else (1,)
    return solve_chunked(graph, budget, lambda g, b: solvers.solve(g, b, "dp"), CHUNK_MENU, mlp_menu)


def _measure(model: Any, kwargs: dict, plan: Any, repeats: int) -> tuple[int, float]:
    scheduler.apply(model, plan)
    try:
        peak = allocator_step_peak(model, model, (), kwargs, _loss)
        return peak, _step_time(model, kwargs, repeats) if repeats else 0.0
    finally:
        scheduler.remove(model)


def run_model(kind: str, seq: int, repeats: int, longest_to: int) -> dict:
    model, kwargs = _model(kind, seq)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    theirs = allocator_step_peak(model, model, (), kwargs, _loss)
    their_time = _step_time(model, kwargs, repeats)
    model.gradient_checkpointing_disable()
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    plain_least, least = _least(graph, (1,), (1,)), _least(graph, CHUNK_MENU, MLP_MENU)
    plan = _solve(graph, least)
    measured, _ = _measure(model, kwargs, plan, 0)
    at_theirs = _solve(graph, theirs)
    measured_theirs, our_time = _measure(model, kwargs, at_theirs, repeats)
    longest = seq
    while longest * 2 <= longest_to:
        m2, kw2 = _model(kind, longest * 2)
        if _least(scheduler.trace(m2, (), kw2, loss=_loss), CHUNK_MENU, MLP_MENU) > theirs:
            break
        longest *= 2
    return dict(model=kind, theirs=theirs, plain_least=plain_least, least=least, predicted=plan.peak_bytes,
                measured=measured, k=_ks(plan), k_theirs=_ks(at_theirs), predicted_theirs=at_theirs.peak_bytes,
                measured_theirs=measured_theirs, longest=longest, time_ratio=our_time / their_time)


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


def main(quick: bool = False) -> None:
    seq, repeats, longest_to = (512, 2, 1024) if quick else (512, 5, 4096)
    rows = [run_model(kind, seq, repeats, longest_to) for kind in ("gpt2", "llama", "bert")]
    big_layers, big_seq = (2, 2048) if quick else (2, 8192)
    big = planned_only(big_layers, big_seq)
    lines = [
        f"CPU, fp32, batch {BATCH}, sequence {seq}, vocabulary {VOCAB}, hidden {HIDDEN}, "
        f"{LAYERS} layers. Theirs: `gradient_checkpointing_enable(use_reentrant=False)`, peak by the allocator "
        "(profiler memory events, one real step). Ours: `dp` over the head menu "
        f"{CHUNK_MENU} and the MLP menu {MLP_MENU} (k head/MLP in the table; 1 = as traced), the plan applied "
        "onto the same model and measured the same way, at our least budget and at their peak. Longest "
        f"sequence: doubling from {seq} up to {longest_to}, the longest whose least plan is at most their peak at "
        f"{seq}. Step time: median of {repeats} steps after one warm-up, ours at their peak over theirs.",
        "",
        "| model | their peak | our least, unchunked | our least, chunked (k) | / theirs | measured (predicted) "
        "| at their peak: measured (k) | longest seq at their peak | step time ours / theirs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {format_bytes(r['theirs'])} | {format_bytes(r['plain_least'])} | "
                     f"{format_bytes(r['least'])} ({r['k']}) | {r['least'] / r['theirs']:.2f} | "
                     f"{format_bytes(r['measured'])} ({format_bytes(r['predicted'])}) | "
                     f"{format_bytes(r['measured_theirs'])} ({r['k_theirs']}) | {r['longest']} | "
                     f"{r['time_ratio']:.2f} |")
    lines += ["", "No CNN row: a classifier's head and loss are over batch rows (batch x classes logits, small) "
              "and its blocks are convolutions, which read neighbouring rows: nothing of a CNN is chunked, so its "
              "least budget is the one-level plan's (`benchmarks/results/zoo.md`)."]
    lines += ["", f"Planned only (meta trace, bf16, for an H100): Llama-3-8B's shape with {big_layers} layers at "
              f"batch 1, sequence {big_seq} (vocabulary 128,256; transformers' loss upcasts the logits to fp32). "
              "Least budget from `dp`:", "",
              "| store-all | least, one level | least, head chunked | least, head and MLPs chunked |",
              "|---|---|---|---|",
              f"| {format_bytes(big['store_all'])} | {format_bytes(big['plain'])} | {format_bytes(big['head'])} | "
              f"{format_bytes(big['both'])} |"]
    path = write_page("chunked.md", "Chunked LM head + loss (and MLPs) vs transformers' gradient checkpointing",
                      lines, quick=quick)
    print(path.read_text())


if __name__ == "__main__":
    main()
