"""The fused head on language models as their libraries ship them: predicted against the allocator, gradients.

For each transformers causal or masked LM below (random weights from its
config as shipped, made small: 2 layers, hidden 64, a 1,000-word vocabulary,
a batch of 2 x 32 tokens, dropout as configured):

* the plain step's allocator peak, and the graph's fusable output layer
  (``graph.meta["fused_heads"]``, NOTE [ Fused head ] in ``solvers/model/fused.py``);
* two plans over the head menu (1, 2, 4): at the plain step's peak (the head
  whole, fused, where it can run so) and at the least budget the menu
  reaches; each applied onto the model, one step measured by the allocator
  against ``simulate``'s prediction, its loss and gradients against the
  plain step's from the same seed (relative to the step's largest gradient:
  the sums over rows are reassociated);
* a model whose head cannot be chunked (Gemma 2 soft-caps its logits after
  its head) is reported with the solver's reason.

Writes ``benchmarks/results/fused_lms.md``. Run: ``python -m benchmarks.run --only fused_lms``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

import scheduler
import solvers
from scheduler.measuring.steps import allocator_step_peak
from scheduler.sizing.budget import format_bytes

from benchmarks.pages import write_page

log = logging.getLogger(__name__)

VOCAB, BATCH, SEQ = 1000, 2, 32
MENU = (1, 2, 4)
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB)
#: name: (config class, model class, config arguments)
MODELS: dict[str, tuple[str, str, dict]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_SMALL, num_key_value_heads=2, head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(_SMALL, num_key_value_heads=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_SMALL, num_key_value_heads=2)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_SMALL, num_key_value_heads=1, head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_SMALL, num_key_value_heads=1, head_dim=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_SMALL, pad_token_id=0)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(_SMALL, num_key_value_heads=2, num_local_experts=4)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                        vocab_size=VOCAB)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB)),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _SMALL),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                                num_attention_heads=4, vocab_size=VOCAB, word_embed_proj_dim=64)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB)),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(_SMALL, max_position_embeddings=64)),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM", dict(dim=64, hidden_dim=128, n_layers=2, n_heads=4,
                                                                      vocab_size=VOCAB)),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM", dict(_SMALL, pad_token_id=0)),
}


def _loss(out: Any) -> torch.Tensor:
    return out.loss


def _step(model: Any, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    out = model(**batch)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def run_one(name: str) -> dict:
    import transformers

    config, cls, kwargs = MODELS[name]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, config)(**kwargs)).train()
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    batch = {"input_ids": ids, "labels": ids.clone()}
    if "Masked" in cls:
        batch["labels"][:, ::3] = -100  # the tokens a masked LM does not predict
    started = time.perf_counter()
    graph = scheduler.trace(model, (), batch, loss=_loss)
    loss0, grads0 = _step(model, batch)
    plain = allocator_step_peak(model, model, (), batch, _loss)
    row: dict[str, Any] = {"model": name, "class": cls, "fused": graph.meta.get("fused_heads"), "plain": plain}
    try:
        scheduler.solve(graph, 1, chunks=MENU)
    except solvers.InfeasibleBudget as exc:
        least = exc.min_feasible_bytes
    except solvers.SolverInputError as exc:  # the head cannot run in chunks: the solver says why
        row["refused"] = str(exc)
        return row
    largest = max(g.abs().max().item() for g in grads0.values())
    for label, budget in (("at_plain", plain), ("least", least)):
        plan = scheduler.solve(graph, budget, chunks=MENU)
        scheduler.apply(model, plan)
        try:
            loss, grads = _step(model, batch)
            measured = allocator_step_peak(model, model, (), batch, _loss)
        finally:
            scheduler.remove(model)
        row[label] = {"k": [c[2] for c in plan.chunks], "regions": len(plan.regions),
                      "predicted": solvers.simulate(graph, plan).peak_bytes, "measured": measured,
                      "grad": max((grads[k] - grads0[k]).abs().max().item() for k in grads0) / largest,
                      "loss": abs(loss - loss0).item() / abs(loss0).item()}
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _cell(r: dict) -> list[str]:
    return [f"{'x'.join(map(str, r['k'])) or '-'}; {r['regions']}", format_bytes(r["predicted"]),
            format_bytes(r["measured"]), f"{r['measured'] - r['predicted']:+,d}", f"{r['grad']:.1e}"]


def main(quick: bool = False) -> None:
    rows = []
    for name in (("gpt2", "gemma2") if quick else MODELS):
        try:
            rows.append(run_one(name))
        except Exception as exc:  # a model that breaks the pipeline is a result to report, not a crash
            log.exception("fused_lms: %s failed", name)
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        log.info("%s", rows[-1])
    planned = [r for r in rows if "at_plain" in r]
    cells = [r[key] for r in planned for key in ("at_plain", "least")]
    under = sum(c["measured"] <= c["predicted"] for c in cells)
    worst = max((c["grad"] for c in cells), default=0.0)
    lines = [
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        f"**{under} of {len(cells)} plans at or under their prediction by the allocator; gradients within "
        f"{worst:.1e} of the plain step's largest; {len(planned)} of {len(rows)} models planned, "
        f"{sum('refused' in r for r in rows)} refused with the solver's reason, {sum('error' in r for r in rows)} "
        "failed.**",
        "",
        "| model | class | fused layer | plain peak | at the plain peak: k; regions | predicted | measured | "
        "measured - predicted (B) | grad | least: k; regions | predicted | measured | measured - predicted (B) | "
        "grad |",
        "|" + "---|" * 14,
    ]
    for r in planned:
        lines.append("| " + " | ".join([r["model"], r["class"], ", ".join(r["fused"] or []) or "-",
                                        format_bytes(r["plain"]), *_cell(r["at_plain"]), *_cell(r["least"])]) + " |")
    for r in rows:
        if "refused" in r or "error" in r:
            lines.append(f"\n- {r['model']}: {'refused' if 'refused' in r else 'FAILED'}: "
                         f"{r.get('refused') or r.get('error')}")
    write_page("fused_lms.md", "The fused head on LMs as their libraries ship them", lines, quick=quick)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
