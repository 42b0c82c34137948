"""Models nobody here wrote: transformers architectures, end to end.

Each entry builds a small model of a transformers architecture from a config
(random weights, offline) with its own loss (``out.loss``): masked and causal
language models, an encoder-decoder, vision transformers, a ConvNet. Each one
is traced, solved with ``ilp`` at 40 % of its store-all activation peak (or
at its least feasible budget when that is higher), applied onto the model
itself (each region a submodule call, ``scheduler.apply``), and run for a
real step with and without the plan: does the plan fit as measured, are the
gradients and the loss unchanged, and does the traced graph predict the
user's *eager* step (store-all predicted vs measured)?

The factories follow ``ckpt``'s ``package.module:factory`` protocol, so any
of them runs from the command line too::

    ckpt demo benchmarks.zoo:t5 --budget 0.4

Writes ``benchmarks/results/zoo.md`` and ``zoo.json``. Run:
``python -m benchmarks.run --only zoo`` (``--quick``: four models).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

import torch

import scheduler
from scheduler.sizing.budget import format_bytes
from scheduler.measuring.verification import verify
from solvers import InfeasibleBudget, activation_budget_bytes

from benchmarks.pages import out_dir, seconds, write_page

log = logging.getLogger(__name__)
FRACTION = 0.4
BATCH, SEQ, TARGET_SEQ = 4, 128, 64
_SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128, vocab_size=500)


def _loss(out: Any) -> torch.Tensor:
    return out.loss


def _build(config: str, model: str, inputs: Callable[[Any], dict], **kw: Any):
    import transformers

    cfg = getattr(transformers, config)(**kw)
    net = getattr(transformers, model)(cfg).train()
    return net, (), inputs(cfg), _loss


def _causal(cfg: Any) -> dict:
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    return {"input_ids": ids, "labels": ids}


def _masked(cfg: Any) -> dict:
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _seq2seq(cfg: Any) -> dict:
    return {"input_ids": torch.randint(0, cfg.vocab_size, (BATCH, SEQ)),
            "labels": torch.randint(0, cfg.vocab_size, (BATCH, TARGET_SEQ))}


def _image(size: int) -> Callable[[Any], dict]:
    def inputs(cfg: Any) -> dict:
        return {"pixel_values": torch.randn(BATCH, 3, size, size), "labels": torch.randint(0, cfg.num_labels, (BATCH,))}
    return inputs


def bert():
    return _build("BertConfig", "BertForMaskedLM", _masked, **_SMALL)


def distilbert():
    return _build("DistilBertConfig", "DistilBertForMaskedLM", _masked, dim=64, n_layers=3, n_heads=4, hidden_dim=128,
                  vocab_size=500)


def opt():
    return _build("OPTConfig", "OPTForCausalLM", _causal, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  ffn_dim=128, vocab_size=500, word_embed_proj_dim=64)


def mistral():
    return _build("MistralConfig", "MistralForCausalLM", _causal, **_SMALL, num_key_value_heads=2)


def qwen2():
    return _build("Qwen2Config", "Qwen2ForCausalLM", _causal, **_SMALL, num_key_value_heads=2)


def phi():
    return _build("PhiConfig", "PhiForCausalLM", _causal, **_SMALL)


def bloom():
    return _build("BloomConfig", "BloomForCausalLM", _causal, hidden_size=64, n_layer=3, n_head=4, vocab_size=500)


def t5():
    return _build("T5Config", "T5ForConditionalGeneration", _seq2seq, d_model=64, d_ff=128, num_layers=2, num_heads=4,
                  d_kv=16, vocab_size=500, decoder_start_token_id=0, pad_token_id=0)


def bart():
    return _build("BartConfig", "BartForConditionalGeneration", _seq2seq, d_model=64, encoder_layers=2,
                  decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                  decoder_ffn_dim=128, vocab_size=500)


def vit():
    return _build("ViTConfig", "ViTForImageClassification", _image(64), hidden_size=64, num_hidden_layers=3,
                  num_attention_heads=4, intermediate_size=128, image_size=64, patch_size=8, num_labels=10)


def swin():
    return _build("SwinConfig", "SwinForImageClassification", _image(64), image_size=64, patch_size=4, embed_dim=16,
                  depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=10)


def convnext():
    return _build("ConvNextConfig", "ConvNextForImageClassification", _image(64), num_channels=3,
                  hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=10)


def resnet():
    # BatchNorm under torch.export: buffers arrive as get_attr reads (NOTE [ Buffers inside a region ] in ``scheduler.applying.graph``)
    return _build("ResNetConfig", "ResNetForImageClassification", _image(64), embedding_size=16,
                  hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)


#: name -> factory returning ``(model, args, kwargs, loss)``
ZOO: dict[str, Callable[[], tuple]] = {f.__name__: f for f in (
    bert, distilbert, opt, mistral, qwen2, phi, bloom, t5, bart, vit, swin, convnext, resnet)}
QUICK = ("bert", "t5", "vit", "mistral")


def run_one(name: str, *, fraction: float = FRACTION, time_limit_s: float = 20.0) -> dict:
    """Trace, solve, apply and verify one zoo model; a row of measurements."""
    torch.manual_seed(0)
    model, args, kwargs, loss = ZOO[name]()
    t0 = time.perf_counter()
    graph = scheduler.trace(model, args, kwargs, loss=loss)
    budget = activation_budget_bytes(graph, fraction)
    at = f"{fraction:g}"
    try:
        plan = scheduler.solve(graph, budget, solver="ilp", time_limit_s=time_limit_s)
    except InfeasibleBudget as exc:  # a small model's floor (one op's own need) can sit above 40 %
        budget, at = exc.min_feasible_bytes, "least feasible"
        plan = scheduler.solve(graph, budget, solver="ilp", time_limit_s=time_limit_s)
    v = verify(model, plan, args, kwargs, loss=loss, steps=1, graph=graph)
    return {"model": name, "architecture": type(model).__name__, "nodes": len(graph), "budget": at,
            "budget_bytes": int(budget), "status": str(plan.status), "regions": v.regions,
            "predicted_peak": v.predicted_peak_bytes, "measured_peak": v.measured_peak_bytes,
            "predicted_store_all": v.predicted_store_all_bytes, "measured_store_all": v.measured_store_all_bytes,
            "counted_peak": v.counted_peak_bytes, "counted_store_all": v.counted_store_all_bytes,
            "fits": bool(v.fits), "recompute_pct": round(100 * v.predicted_recompute_ratio, 2),
            "recompute_s": plan.recompute_time_s,
            "max_grad_diff": v.max_grad_diff, "loss_diff": v.loss_diff, "buffers_equal": bool(v.buffers_equal),
            "store_all_error_pct": round(100 * (v.predicted_store_all_bytes - v.measured_store_all_bytes)
                                         / max(v.measured_store_all_bytes, 1), 2),
            "seconds": round(time.perf_counter() - t0, 1)}


def _markdown(rows: list[tuple], headers: list[str]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main(quick: bool = False) -> None:
    rows = []
    for name in (QUICK if quick else ZOO):
        try:
            rows.append(run_one(name))
        except Exception as exc:  # a model that breaks the pipeline is a result to report, not a crash
            log.exception("zoo model %s failed", name)
            rows.append({"model": name, "architecture": "", "error": f"{type(exc).__name__}: {exc}"[:300]})
        log.info("%s", rows[-1])
    (out_dir(quick) / "zoo.json").write_text(json.dumps({"fraction": FRACTION, "batch": BATCH, "seq": SEQ, "rows": rows},
                                                  indent=1) + "\n")
    ok = [r for r in rows if "error" not in r]
    body = [(r["model"], r["architecture"], r["nodes"], r["budget"], r["regions"], format_bytes(r["predicted_peak"]),
             format_bytes(r["measured_peak"]), format_bytes(r["budget_bytes"]), "yes" if r["fits"] else "NO",
             f"{r['recompute_pct']}%", seconds(r.get("recompute_s")),
             f"{r['max_grad_diff']:.2g}",
             "yes" if r["buffers_equal"] else "NO",
             f"{format_bytes(r['predicted_store_all'])} / {format_bytes(r['measured_store_all'])}",
             f"{r['store_all_error_pct']:+.2f}%", f"{r['seconds']}s")
            for r in ok]
    lines = ["Transformers architectures built "
             f"from configs (random weights, batch {BATCH}, {SEQ} tokens or 64x64 images), traced with their own "
             f"`out.loss`, `ilp` at {FRACTION:g} of the store-all activation peak (or the least feasible budget), "
             "applied onto the model itself (each region one submodule call) and run for one real CPU step with "
             "and without the plan. Measured: the allocator's peak of the user's eager step (profiler memory events). "
             "Recompute: the plan's recompute FLOPs over the step's, and its predicted recompute time (the roofline "
             "cost on this CPU: what `ilp` minimises).", "",
             f"**{sum(r['fits'] for r in ok)} of {len(rows)} fit as measured; "
             f"{sum(r['max_grad_diff'] == 0 and r['loss_diff'] == 0 for r in ok)} have gradients and loss bitwise "
             f"equal to eager; store-all predicted within 2 % of eager's measured peak on "
             f"{sum(abs(r['store_all_error_pct']) <= 2 for r in ok)}.**", "",
             _markdown(body, ["model", "architecture", "nodes", "budget", "regions", "predicted peak",
                              "measured peak", "budget bytes", "fits", "recompute", "predicted recompute time",
                              "max grad diff vs eager",
                              "buffers equal", "store-all predicted / measured", "store-all error", "time"])]
    for r in rows:
        if "error" in r:
            lines.append(f"\n- {r['model']} ({r['architecture']}): **failed**: {r['error']}")
    write_page("zoo.md", "Models nobody here wrote", lines, quick=quick)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
