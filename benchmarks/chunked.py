"""Chunked LM head and loss vs transformers' own gradient checkpointing (NOTE [ Chunked head ] in solvers.chunks).

On small transformers GPT-2, Llama and BERT models with a realistic vocabulary
(32,000) at sequence 512: transformers' checkpointing peak (the allocator, one
real step), the least budget we plan with and without the chunked head
(``dp`` over the chunk menu), that plan applied and measured by the allocator,
the longest sequence (doubling from 512) whose least chunked plan fits
transformers' peak at 512, and our step time over theirs (median of steps).

Writes ``benchmarks/results/chunked.md``. Run: ``python -m benchmarks.run --only chunked``.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

import scheduler
import solvers
from scheduler.measuring.steps import allocator_step_peak
from scheduler.sizing.budget import format_bytes
from solvers.chunks import CHUNK_MENU, solve_chunked

RESULTS = Path(__file__).parent / "results"
VOCAB, HIDDEN, LAYERS, BATCH = 32000, 128, 2, 1


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


def _least(graph: Any, menu: tuple[int, ...]) -> int:
    try:
        solve_chunked(graph, 1, lambda g, b: solvers.solve(g, b, "dp"), menu)
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


def run_model(kind: str, seq: int, repeats: int, longest_to: int) -> dict:
    model, kwargs = _model(kind, seq)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    theirs = allocator_step_peak(model, model, (), kwargs, _loss)
    their_time = _step_time(model, kwargs, repeats)
    model.gradient_checkpointing_disable()
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    plain_least, least = _least(graph, (1,)), _least(graph, CHUNK_MENU)
    plan = solve_chunked(graph, least, lambda g, b: solvers.solve(g, b, "dp"), CHUNK_MENU)
    scheduler.apply(model, plan)
    measured = allocator_step_peak(model, model, (), kwargs, _loss)
    our_time = _step_time(model, kwargs, repeats)
    scheduler.remove(model)
    longest = seq
    while longest * 2 <= longest_to:
        m2, kw2 = _model(kind, longest * 2)
        if _least(scheduler.trace(m2, (), kw2, loss=_loss), CHUNK_MENU) > theirs:
            break
        longest *= 2
    return dict(model=kind, theirs=theirs, plain_least=plain_least, least=least, k=plan.findings.get("head_chunks", 1),
                predicted=plan.peak_bytes, measured=measured, longest=longest, time_ratio=our_time / their_time)


def main(quick: bool = False) -> None:
    seq, repeats, longest_to = (512, 2, 1024) if quick else (512, 5, 4096)
    rows = [run_model(kind, seq, repeats, longest_to) for kind in ("gpt2", "llama", "bert")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Chunked LM head + loss vs transformers' gradient checkpointing",
        "",
        f"Command: `python -m benchmarks.run --only chunked{' --quick' if quick else ''}`; commit {commit}; "
        f"CPU, fp32, batch {BATCH}, sequence {seq}, vocabulary {VOCAB}, hidden {HIDDEN}, {LAYERS} layers. "
        "Peaks by the allocator (profiler memory events, one real step); least budgets from `dp` over the "
        f"chunk menu {CHUNK_MENU} (1 = the head as traced); the plan at our least budget applied and measured; "
        f"longest sequence: doubling from {seq} up to {longest_to}, the longest whose least plan fits their peak.",
        "",
        "| model | their checkpointing peak | our least, unchunked | our least, chunked (k) | ratio to theirs | "
        "measured (predicted) | longest seq at their peak | step time ours / theirs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {format_bytes(r['theirs'])} | {format_bytes(r['plain_least'])} | "
                     f"{format_bytes(r['least'])} ({r['k']}) | {r['least'] / r['theirs']:.2f} | "
                     f"{format_bytes(r['measured'])} ({format_bytes(r['predicted'])}) | {r['longest']} | "
                     f"{r['time_ratio']:.2f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "chunked.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
