"""A chunked head applied onto transformers models (NOTE [ Chunked head (applying) ]): the loss and the
gradients of the plain step (the loss sum is reassociated over chunks: 1e-6 relative), the allocator's
peak at or below the prediction, remove() restores the model."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import scheduler  # noqa: E402
from graphs import FUSED_HEADS_META  # noqa: E402
from scheduler.applying.chunked import ChunkedHeadError, ChunkedHeadWarning, _Chunks  # noqa: E402
from scheduler.measuring.steps import allocator_step_peak, measure_step_peak  # noqa: E402
from solvers import Plan, simulate  # noqa: E402
from solvers.model.chunks import chunk_entries, chunked_graph, find_calls, find_tail  # noqa: E402

VOCAB, BATCH, SEQ, LAYERS = 2000, 2, 64, 2


def _model(kind: str):
    torch.manual_seed(0)
    small = dict(num_hidden_layers=LAYERS, num_attention_heads=4, vocab_size=VOCAB)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model, kwargs = transformers.GPT2LMHeadModel(cfg), {"input_ids": ids, "labels": ids}
    elif kind == "llama":
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=256, num_key_value_heads=2, **small)
        labels = ids.clone()
        labels[0, :5] = -100  # ignored tokens (a prompt) count in neither sum nor mean
        model, kwargs = transformers.LlamaForCausalLM(cfg), {"input_ids": ids, "labels": labels}
    else:
        cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, **small)
        labels = ids.clone()
        labels[:, ::3] = -100
        model = transformers.BertForMaskedLM(cfg)
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    return model.train(), kwargs


def _loss(out):
    return out.loss


def _unfused(graph):
    """``graph`` with its head left to autograd's chunk loop (NOTE [ Fused head ] fuses a plain linear head): the
    loop any other head runs, tested here."""
    return dataclasses.replace(graph, meta={**graph.meta, FUSED_HEADS_META: []})


def _chunked_plan(graph, k: int, checkpointed: bool = True, call_k: int = 1) -> Plan:
    gk = chunked_graph(graph, k, call_k)
    regions = [(sp.first, sp.last) for sp in gk.spans if "@chunk" in sp.module] if checkpointed else []
    plan = Plan.from_regions(gk, regions)
    return dataclasses.replace(plan, chunks=chunk_entries(graph, k, call_k), fingerprint=graph.fingerprint(),
                               graph_meta=graph.meta).labelled(graph)


def _step(model, kwargs):
    model.zero_grad(set_to_none=True)
    out = model(**kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind,k,call_k", [("gpt2", 4, 1), ("llama", 8, 1), ("bert", 4, 1), ("llama", 4, 4),
                                           ("gpt2", 1, 2)])
def test_chunked_head_keeps_the_step_and_fits_its_prediction(kind, k, call_k):
    model, kwargs = _model(kind)
    graph = _unfused(scheduler.trace(model, (), kwargs, loss=_loss))
    plain_out, plain = _step(model, kwargs)
    plan = _chunked_plan(graph, k, call_k=call_k)
    copies = [nd for nd in chunked_graph(graph, k, call_k).nodes if "@" in nd.name]
    assert all(nd.sac_op == -1 for nd in copies)  # a chunk recomputes whole: nothing in it can be kept
    assert any(graph.nodes[graph.index[nd.name.split("@")[0]]].sac_op >= 0 for nd in copies)
    calls = find_calls(graph) if call_k > 1 else ()
    assert len(calls) == (LAYERS if call_k > 1 else 0)  # every MLP
    predicted = simulate(graph, plan).peak_bytes
    assert predicted < simulate(graph).peak_bytes
    scheduler.apply(model, plan)
    wrappers = [m.__dict__["forward"] for m in model.modules() if isinstance(m.__dict__.get("forward"), _Chunks)]
    assert sorted(w.path for w in wrappers) == sorted([sp.module for sp in calls] + ([find_tail(graph).head] if k > 1
                                                                                      else []))
    out, grads = _step(model, kwargs)
    assert (out.logits is None) == (k > 1)  # NOTE [ Chunked head (applying) ]: never whole
    assert torch.allclose(out.loss, plain_out.loss, rtol=1e-6, atol=0)
    assert grads.keys() == plain.keys()
    for name, g in grads.items():
        scale = plain[name].abs().max().clamp_min(1e-30)
        assert ((g - plain[name]).abs().max() / scale).item() <= 1e-6, name
    assert sum(w.recomputes for w in wrappers) == k * (k > 1) + call_k * len(calls)
    assert measure_step_peak(model, model, (), kwargs, _loss) <= predicted
    assert allocator_step_peak(model, model, (), kwargs, _loss) <= predicted
    scheduler.remove(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    again, _ = _step(model, kwargs)
    assert again.logits is not None and torch.equal(again.loss, plain_out.loss)


def test_chunks_without_checkpoint_and_without_labels_run_as_written():
    model, kwargs = _model("gpt2")
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    plain_out, plain = _step(model, kwargs)
    plan = _chunked_plan(graph, 2, checkpointed=False)
    scheduler.apply(model, plan)
    out, grads = _step(model, kwargs)
    assert model.__dict__["forward"].recomputes == 0
    assert allocator_step_peak(model, model, (), kwargs, _loss) <= simulate(graph, plan).peak_bytes
    assert torch.allclose(out.loss, plain_out.loss, rtol=1e-6, atol=0)
    with torch.no_grad():
        logits = model(input_ids=kwargs["input_ids"]).logits
    assert logits.shape == (BATCH, SEQ, VOCAB)


def test_a_model_that_changes_its_logits_after_the_head_is_refused():
    model, kwargs = _model("gpt2")
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    scheduler.apply(model, _chunked_plan(graph, 2))
    forward = model.__dict__["forward"]
    original = forward.original()

    def scaled(*args, **kw):
        out = original(*args, **kw)
        return type(out)(logits=out.logits * 2.0)

    forward.previous = scaled
    with pytest.raises(ChunkedHeadError, match="changes the logits after its head 'lm_head'"):
        model(**kwargs)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("granularity", ["fold", 2])
def test_a_grouped_trace_keeps_its_head_chunkable(kind, granularity):
    """At a coarser granularity (``auto`` on a full-size model) views of the logits stay apart from the labels'
    ops before them, and a node grouping an export check with its cast is read op by op: the tail is still found
    and a chunked plan still fits (a traced Llama-2-7B on meta once refused --chunks at ``auto``)."""
    model, kwargs = _model(kind)
    graph = scheduler.trace(model, (), kwargs, loss=_loss, granularity=granularity)
    tail = find_tail(graph)
    assert tail.head in ("lm_head", "cls")
    plain = scheduler.solve(graph, simulate(graph).peak_bytes)
    with pytest.raises(scheduler.InfeasibleBudget) as least:
        scheduler.solve(graph, 1)
    plan = scheduler.solve(graph, least.value.min_feasible_bytes, chunks=(1, 2, 4, 8, 16))
    assert plan.chunks and plan.peak_bytes < least.value.min_feasible_bytes  # in chunks, or fused (k = 1)
    assert plain.peak_bytes <= simulate(graph).peak_bytes


def test_a_wrapped_causal_lm_gets_its_loss_kind_from_the_model_its_head_is_in():
    """peft's PeftModel wraps a causal LM (``base_model.model.lm_head``): its head was refused ("PeftModel is
    neither") although the model the head lies in says how labels line up. A plain wrapper stands in for peft."""
    from scheduler.applying.chunked import install

    class Wrapper(torch.nn.Module):  # forwards every argument, as PeftModel does
        def __init__(self, inner):
            super().__init__()
            self.base_model = inner

        def forward(self, *args, **kwargs):
            return self.base_model(*args, **kwargs)

    model, kwargs = _model("llama")
    plain_out, plain = _step(model, kwargs)
    wrapped = Wrapper(model)
    install(wrapped, [("base_model.lm_head", 4, range(4), True)])
    out, grads = _step(wrapped, kwargs)
    assert out.logits is None and torch.allclose(out.loss, plain_out.loss, rtol=1e-6, atol=0)
    for name, g in grads.items():
        ref = plain[name.removeprefix("base_model.")]
        assert ((g - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item() <= 1e-6, name
    assert wrapped.base_model.__dict__["forward"].recomputes == 4  # installed on the LM, which gets the labels
    assert "forward" not in wrapped.__dict__


class _LossOf(torch.nn.Module):
    """A module whose forward returns its LM's loss from the ids alone (the compile page's, a training script's)."""

    def __init__(self, lm, own_loss: bool = False):
        super().__init__()
        self.m, self.own_loss = lm, own_loss

    def forward(self, ids):
        if not self.own_loss:
            return self.m(input_ids=ids, labels=ids).loss
        logits = self.m(input_ids=ids).logits  # its loss computed here, outside the LM's forward
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def test_a_chunked_head_runs_inside_a_module_that_calls_the_lm_with_labels():
    """The chunked head goes on the LM the head lies in, which gets the labels: installed on the wrapper, which
    gets none, the head ran whole and the step measured 19.5 MiB on a plan predicted at 10.8 (a small Llama, 8
    chunks). A wrapper that computes the loss itself gets a warning (the head runs whole, over the plan)."""
    lm, kwargs = _model("llama")
    ids = kwargs["input_ids"]
    model = _LossOf(lm)
    graph = scheduler.trace(model, (ids,))
    with pytest.raises(scheduler.InfeasibleBudget) as least:
        scheduler.solve(graph, 1)
    plan = scheduler.solve(graph, least.value.min_feasible_bytes, chunks=(8,))
    assert plan.chunks and plan.chunks[-1][2] == 8
    planned = scheduler.apply(_LossOf(lm), plan)
    assert "forward" in planned.m.__dict__ and "forward" not in planned.__dict__
    measured = allocator_step_peak(planned, planned, (ids,), {}, None)
    assert measured <= plan.peak_bytes < least.value.min_feasible_bytes
    scheduler.remove(planned)
    unplanned = allocator_step_peak(planned, planned, (ids,), {}, None)
    assert unplanned > least.value.min_feasible_bytes  # what the head runs whole costs

    own = scheduler.apply(_LossOf(lm, own_loss=True), plan)
    with pytest.warns(ChunkedHeadWarning, match="without labels"):
        own(ids).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        own(ids).backward()
    assert own.m.__dict__["forward"].unplanned_calls == 2


def test_a_chunked_head_inside_a_wrapper_keeps_a_gradient_penalty_and_autocast():
    """The chunked head installed on the LM inside a wrapper, in two workflows a user's loop has: a gradient
    penalty (a double backward through the chunks) equal to the unplanned step's, and CPU autocast in bfloat16
    within bfloat16's rounding (the chunks' partial sums round apart)."""
    import copy

    lm, kwargs = _model("gpt2")
    lm.config._attn_implementation = "eager"  # torch's CPU flash attention has no double backward
    ids = kwargs["input_ids"]
    graph = scheduler.trace(_LossOf(lm), (ids,))
    with pytest.raises(scheduler.InfeasibleBudget) as least:
        scheduler.solve(graph, 1)
    plan = scheduler.solve(graph, least.value.min_feasible_bytes, chunks=(4,))
    assert plan.chunks and plan.chunks[-1][2] == 4

    def penalised(model):
        model.zero_grad(set_to_none=True)
        loss = model(ids)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        (loss + 0.01 * sum((g ** 2).sum() for g in grads if g is not None)).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    def autocast(model):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    for step, tol in ((penalised, 1e-5), (autocast, 4 * 2.0 ** -8)):
        ref = step(_LossOf(copy.deepcopy(lm)))
        planned = scheduler.apply(_LossOf(copy.deepcopy(lm)), plan)
        calls = planned.m.__dict__["forward"]
        got = step(planned)
        assert calls.unplanned_calls == 0  # the head ran in its chunks
        assert ref.keys() == got.keys()
        for n in ref:
            scale = ref[n].abs().max().item() or 1.0
            assert (ref[n] - got[n]).abs().max().item() <= tol * scale, (step.__name__, n)
