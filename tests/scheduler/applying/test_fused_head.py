"""The fused head (NOTE [ Fused head ] in solvers.model.fused): a plain linear LM head runs with its loss, its
gradients computed chunk by chunk in the forward. The loss and gradients of the plain step to rounding, the
allocator's peak at or below the prediction (and below the plain step's), gradients of gradients exact, and a
head changed after the trace refused."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import scheduler  # noqa: E402
from scheduler.applying.chunked import ChunkedHeadError  # noqa: E402
from scheduler.measuring.steps import allocator_step_peak  # noqa: E402
from scheduler.tracing.chunk_loop import chunked_head_loss, fusable, fused_head_loss  # noqa: E402
from solvers import simulate  # noqa: E402
from solvers.model.fused import FUSED_OP  # noqa: E402
from solvers.model.chunks import expand  # noqa: E402

VOCAB, BATCH, SEQ = 3000, 2, 48


def _model(kind: str):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = ids.clone()
    labels[0, :7] = -100  # a prompt: counted in neither the sum nor the mean
    if kind == "gpt2":  # tied input and output embeddings
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "bert":  # a masked LM: its head runs a dense layer, GELU and layer norm before the decoder
        cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      vocab_size=VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        labels[:, ::3] = -100
        return transformers.BertForMaskedLM(cfg).train(), {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                          "labels": labels}
    else:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
        model = transformers.LlamaForCausalLM(cfg)
    return model.train(), {"input_ids": ids, "labels": labels}


def _loss(out):
    return out.loss


def _grads(model, kwargs):
    model.zero_grad(set_to_none=True)
    out = model(**kwargs)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(got: dict, want: dict, rtol: float = 1e-5) -> None:
    """fp32 rounding, another order of sums, against the step's largest gradient (an attention key's bias has a
    gradient zero in exact arithmetic: 1e-12 in both, differing by as much)."""
    assert got.keys() == want.keys()
    scale = max(w.abs().max() for w in want.values())
    for name, g in got.items():
        assert ((g - want[name]).abs().max() / scale).item() <= rtol, name


@pytest.mark.parametrize("kind,k", [("llama", 1), ("llama", 3), ("gpt2", 1), ("gpt2", 4), ("bert", 1), ("bert", 2)])
def test_a_fused_head_keeps_the_step_and_fits_below_the_plain_peak(kind, k):
    model, kwargs = _model(kind)
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    layer = "cls.predictions.decoder" if kind == "bert" else "lm_head"
    assert graph.meta["fused_heads"] == [layer]
    loss0, plain = _grads(model, kwargs)
    plain_peak = allocator_step_peak(model, model, (), kwargs, _loss)
    plan = scheduler.solve(graph, 10 ** 12, chunks=(k, 2 * k) if k == 1 else (k,))
    assert [c[2] for c in plan.chunks] == [k] and plan.chunk_modules == (("cls" if kind == "bert" else "lm_head")
                                                                          + "+loss",)
    run = expand(graph, plan.chunks)
    assert [nd.op for nd in run.nodes[-2:]] == [FUSED_OP, FUSED_OP]  # the head's nodes are gone
    predicted = simulate(graph, plan).peak_bytes
    scheduler.apply(model, plan)
    out = model(**kwargs)
    assert out.logits is None  # never whole, as with any chunked head
    loss, grads = _grads(model, kwargs)
    assert torch.allclose(loss, loss0, rtol=1e-6, atol=0)
    _close(grads, plain)
    measured = allocator_step_peak(model, model, (), kwargs, _loss)
    assert measured <= predicted < simulate(graph).peak_bytes
    assert measured < plain_peak
    scheduler.remove(model)
    assert model(**kwargs).logits is not None


def test_gradients_of_gradients_and_a_second_backward_run_the_head_again_in_autograd():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    labels = torch.randint(0, 50, (2, 9))
    labels[1, 3:] = -100
    assert fusable(head)

    def penalty(fn):
        loss = fn(head, hidden, labels, "causal", 2)
        (g,) = torch.autograd.grad(loss, hidden, create_graph=True)  # a gradient penalty on the input
        return loss, torch.autograd.grad(g.square().sum(), [hidden, head.weight, head.bias])

    (loss_f, gg_f), (loss_p, gg_p) = penalty(fused_head_loss), penalty(chunked_head_loss)
    assert torch.allclose(loss_f, loss_p, rtol=1e-6)
    for a, b in zip(gg_f, gg_p):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-9)
    loss = fused_head_loss(head, hidden, labels, "causal", 3)
    first = torch.autograd.grad(loss, [hidden, head.weight], retain_graph=True)
    second = torch.autograd.grad(loss * 2, [hidden, head.weight])  # the kept gradients are spent: run again
    for a, b in zip(first, second):
        assert not b.requires_grad and torch.allclose(2 * a, b, rtol=1e-5, atol=1e-7)


def test_a_head_tied_to_the_embedding_backs_up_twice_and_under_a_penalty():
    """The second backward's gradients are the head's own, not ``autograd.grad`` of a recomputed loss, which
    followed the hidden states back to the tied embedding (and freed the layer norm's saved tensors)."""
    torch.manual_seed(0)
    emb, norm, head = torch.nn.Embedding(50, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 50, bias=False)
    head.weight = emb.weight
    ids = torch.randint(0, 50, (2, 9))
    runs = {}
    for name, fn in (("fused", fused_head_loss), ("plain", chunked_head_loss)):
        emb.zero_grad(), norm.zero_grad()
        loss = fn(head, norm(emb(ids))[:, 0:, :], ids, "causal", 2)
        loss.backward(retain_graph=True)
        loss.backward()
        twice = emb.weight.grad.clone()
        emb.zero_grad(), norm.zero_grad()
        loss = fn(head, norm(emb(ids)), ids, "causal", 2)
        grads = torch.autograd.grad(loss, [emb.weight, norm.weight], create_graph=True)
        (loss + sum(g.square().sum() for g in grads)).backward()
        runs[name] = (twice, emb.weight.grad.clone(), norm.weight.grad.clone())
    for a, b in zip(runs["fused"], runs["plain"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_scaled_loss_and_a_frozen_head_get_what_autograd_gives():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 20, bias=False)
    hidden = torch.randn(30, 8, requires_grad=True)
    labels = torch.randint(0, 20, (30,))
    for frozen in (False, True):
        head.weight.requires_grad_(not frozen)
        got = [fused_head_loss(head, hidden, labels, "masked", 4, num_items=17) * 0.25]
        want = [chunked_head_loss(head, hidden, labels, "masked", 1, num_items=17) * 0.25]
        params = [] if frozen else [head.weight]
        for a, b in zip(torch.autograd.grad(got[0], [hidden, *params]), torch.autograd.grad(want[0], [hidden, *params])):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-9)


def test_a_head_with_a_hook_is_not_fused_and_a_fused_plan_then_refuses_it():
    model, kwargs = _model("llama")
    graph = scheduler.trace(model, (), kwargs, loss=_loss)
    plan = scheduler.solve(graph, 10 ** 12, chunks=(1, 2))
    twin = copy.deepcopy(model)
    twin.lm_head.register_forward_hook(lambda m, i, o: None)
    assert not fusable(twin.lm_head) and scheduler.trace(twin, (), kwargs, loss=_loss).meta["fused_heads"] == []
    scheduler.apply(twin, plan)
    with pytest.raises(ChunkedHeadError, match="no longer a plain nn.Linear without hooks"):
        twin(**kwargs)


def test_a_model_that_soft_caps_its_logits_is_refused_when_solved_not_at_its_first_step():
    """Gemma 2 divides, tanh's and multiplies its logits after its head: a menu offered its head (fused whole at
    a menu's 1), and ``apply`` refused the plan at step one (ChunkedHeadError). The tail is refused instead."""
    from solvers.model.chunks import ChunkError, find_tail

    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=1, head_dim=16, vocab_size=VOCAB)
    model = transformers.Gemma2ForCausalLM(cfg).train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    graph = scheduler.trace(model, (), {"input_ids": ids, "labels": ids}, loss=_loss)
    with pytest.raises(ChunkError, match="changes the logits after its head 'lm_head'.*soft-capping"):
        find_tail(graph)
    with pytest.raises(ChunkError, match="the head is not chunked"):
        scheduler.solve(graph, 10 ** 12, chunks=(1, 2))
    assert not scheduler.solve(graph, 10 ** 12).chunks  # without a menu: as before
