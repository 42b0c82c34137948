"""A chunked head in the workflows people run (NOTE [ Chunked head (applying) ], NOTE [ Chunk menus ]):
``transformers.Trainer`` with its default arguments (train, evaluate with compute_metrics, predict),
``return_dict=False``, ``model.eval()`` with gradients on, a stock GPT-2 (dropout in its MLPs) under the README's
pair of menus, and a Llama traced at a coarse granularity. Losses and gradients are compared with an unplanned
twin within 1e-6 relative (the chunks reassociate sums over rows)."""

from __future__ import annotations

import copy
import dataclasses
import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # Trainer needs it

import scheduler  # noqa: E402
from graphs import FUSED_HEADS_META  # noqa: E402
from scheduler.report import plan_summary  # noqa: E402
from solvers import Plan  # noqa: E402
from solvers.model.chunks import chunk_entries, chunked_graph, find_calls  # noqa: E402

VOCAB, BATCH, SEQ = 1000, 2, 32
RTOL = 1e-6  # NOTE [ Chunked head ]: sums over token rows reassociated


def _gpt2(dropout: bool = True):
    torch.manual_seed(0)
    drop = {} if dropout else dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=SEQ, **drop)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return transformers.GPT2LMHeadModel(cfg).train(), {"input_ids": ids, "labels": ids}


def _loss(out):
    return out.loss


def _chunked_plan(graph, k: int) -> Plan:
    gk = chunked_graph(graph, k)
    plan = Plan.from_regions(gk, [(sp.first, sp.last) for sp in gk.spans if "@chunk" in sp.module])
    return dataclasses.replace(plan, chunks=chunk_entries(graph, k), fingerprint=graph.fingerprint(),
                               graph_meta=graph.meta).labelled(graph)


def _planned_pair(dropout: bool = False, k: int = 4, fused: bool = True):
    """A planned GPT-2 and its twin; ``fused``: its plain linear head fused with the loss (NOTE [ Fused head ]),
    else autograd's chunk loop with every chunk a region."""
    model, kwargs = _gpt2(dropout)
    twin = copy.deepcopy(model)
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    if not fused:
        graph = dataclasses.replace(graph, meta={**graph.meta, FUSED_HEADS_META: []})
    scheduler.apply(model, _chunked_plan(graph, k))
    return model, twin, kwargs


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() <= RTOL


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_trainer_with_default_arguments_trains_evaluates_and_predicts(tmp_path):
    """apply once made model.forward's signature (*args, **kwargs), so Trainer's remove_unused_columns (on by
    default) dropped every column: KeyError 'input_ids' / "You must specify exactly one of input_ids"."""
    model, twin, _ = _planned_pair()
    assert list(inspect.signature(model.forward).parameters)[:2] == ["input_ids", "cache"]
    torch.manual_seed(1)
    rows = [{"input_ids": ids, "labels": ids.clone()} for ids in torch.randint(0, VOCAB, (6, SEQ))]

    def metrics(pred):
        return {"tokens": float((pred.predictions.argmax(-1)[:, :-1] == pred.label_ids[:, 1:]).mean())}

    results = []
    for m in (model, twin):
        # default arguments but for where it writes, how long, and plain SGD (Adam's first step, g/|g|, would
        # turn a rounding difference in a near-zero gradient into a whole step)
        args = transformers.TrainingArguments(output_dir=str(tmp_path / str(len(results))), max_steps=2,
                                              per_device_train_batch_size=2, per_device_eval_batch_size=2,
                                              report_to="none", optim="sgd", learning_rate=0.5, logging_steps=1,
                                              save_strategy="no")
        trainer = transformers.Trainer(model=m, args=args, train_dataset=rows, eval_dataset=rows[:4],
                                       compute_metrics=metrics)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        results.append((losses, trainer.evaluate(), trainer.predict(rows[:4]), dict(m.named_parameters())))
    (losses, evaluated, predicted, params), (losses2, evaluated2, predicted2, params2) = results
    assert len(losses) == 2 and losses == pytest.approx(losses2, rel=RTOL)
    assert all(_close(params[n].detach(), p.detach()) for n, p in params2.items())
    assert evaluated["eval_loss"] == pytest.approx(evaluated2["eval_loss"], rel=RTOL)
    assert evaluated["eval_tokens"] == evaluated2["eval_tokens"]
    assert predicted.predictions.shape == (4, SEQ, VOCAB)  # evaluation runs without grad: the logits, whole
    assert _close(torch.as_tensor(predicted.predictions), torch.as_tensor(predicted2.predictions))


def test_return_dict_false_returns_the_tuple_form():
    """return_dict=False with labels was refused as if the model 'changes the logits after its head'."""
    model, twin, kwargs = _planned_pair()
    out = model(**kwargs, return_dict=False)
    plain = twin(**kwargs, return_dict=False)
    assert isinstance(out, tuple) and len(out) == len(plain) and out[1] is None  # the logits' place kept
    assert _close(out[0], plain[0])
    out[0].backward()
    plain[0].backward()
    theirs = _grads(twin)
    assert all(_close(g, theirs[n]) for n, g in _grads(model).items())


def test_eval_with_grad_runs_the_plain_head():
    """model.eval() with gradients on and labels once returned logits=None, silently."""
    model, twin, kwargs = _planned_pair()
    model.eval(), twin.eval()
    out, plain = model(**kwargs), twin(**kwargs)
    assert out.logits is not None and torch.equal(out.logits, plain.logits) and torch.equal(out.loss, plain.loss)
    out.loss.backward()
    plain.loss.backward()
    theirs = _grads(twin)
    assert all(torch.equal(g, theirs[n]) for n, g in _grads(model).items())
    model.train()
    assert model(**kwargs).logits is None  # training: the head in chunks again


def test_the_readme_menus_on_a_stock_gpt2_chunk_its_head():
    """--chunks 1,2,4,8,16 --mlp-chunks 1,2,4 on GPT-2 as configured by default (dropout in its MLPs) once failed
    with 'no call of this graph is row-wise': the MLP menu is skipped, said, and the head chunked."""
    model, kwargs = _gpt2(dropout=True)
    twin = copy.deepcopy(model)
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    assert not find_calls(graph)
    menus = dict(chunks=(1, 2, 4), mlp_chunks=(1, 2))  # the README pair, shorter: the same skip
    with pytest.raises(scheduler.InfeasibleBudget) as least:
        scheduler.solve(graph, 1, **menus)
    plan = scheduler.solve(graph, least.value.min_feasible_bytes, **menus)
    assert plan.chunk_modules == ("lm_head+loss",) and plan.findings["head_chunks"] > 1
    assert "'transformer.h.0.mlp'" in plan.findings["chunks_skipped"]
    assert "chunk menus: the MLPs are not chunked" in plan_summary(graph, plan)
    scheduler.apply(model, plan)
    for m in (model, twin):
        torch.manual_seed(2)  # the same dropout masks in both
        m(**kwargs).loss.backward()
    theirs = _grads(twin)
    assert all(_close(g, theirs[n]) for n, g in _grads(model).items())


def test_a_coarse_trace_of_llama_chunks_its_mlps():
    """At granularity 4 (what ``auto`` picks for a 32-layer Llama-3-8B) each MLP is one node running its three
    products; the MLPs were then no row-wise call, where the op-by-op trace had one per layer."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=256, num_key_value_heads=2, num_hidden_layers=2,
                                   num_attention_heads=4, vocab_size=VOCAB)
    model = transformers.LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    graph = scheduler.trace(model, (), {"input_ids": ids, "labels": ids}, loss=_loss, granularity=4)
    mlps = [sp for sp in graph.spans if sp.module.endswith(".mlp")]
    assert mlps and all(sp.first == sp.last for sp in mlps)  # grouped into one node each
    assert [sp.module for sp in find_calls(graph)] == [sp.module for sp in mlps]
    plan = scheduler.solve(graph, 1.0, chunks=(1,), mlp_chunks=(2,))
    assert sorted(plan.chunk_modules) == sorted(sp.module for sp in mlps)


def test_a_batch_with_fewer_rows_than_chunks_runs_one_chunk_per_row():
    """NOTE [ Chunk counts and rows ]: a plan's k above a smaller batch's rows runs no empty chunks."""
    model, twin, kwargs = _planned_pair(k=16, fused=False)
    short = {key: value[:1, :4] for key, value in kwargs.items()}  # 4 token rows
    out, plain = model(**short), twin(**short)
    assert model.__dict__["forward"].recomputes == 0 and _close(out.loss, plain.loss)
    out.loss.backward()
    assert model.__dict__["forward"].recomputes == 4
