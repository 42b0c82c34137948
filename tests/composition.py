"""The composition matrix of issue 33: plan kinds x workflows x model families (helpers for
``tests/scheduler/applying/test_composition.py``).

A *family* is a transformers model as its library configures it by default, at tiny sizes only (every
other default kept: GPT-2's and Llama's ``use_cache=True``, dropout where the config has it). A *kind* is
a plan made by the real solvers so that the kind is really used (regions; regions that keep op outputs;
a chunked head and MLPs; nested regions; one pipeline stage's plan). A *workflow* is what a user does
with the model after ``scheduler.apply``: each runs on a planned copy and on an unplanned twin of the
same weights, seeds and inputs, and returns what the two must agree on (:func:`agree`).
"""

from __future__ import annotations

import copy
import pickle
import tempfile
from typing import Any, Callable

import torch
from torch import nn

import scheduler
from scheduler.applying import applied_plan
from solvers import InfeasibleBudget, Plan
from solvers.model.nested import nested_plan_inner

transformers = None  # imported by the test module (importorskip), set by :func:`use`


def use(module: Any) -> None:
    global transformers
    transformers = module


BATCH, SEQ, VOCAB, LAYERS, WIDTH, HEADS = 4, 32, 256, 2, 64, 4
FAMILIES = ("gpt2", "llama", "bert", "cnn", "vit")
CAUSAL = ("gpt2", "llama")
KINDS = ("regions", "kept", "chunked", "nested", "stage")

#: Relative tolerance where a plan reassociates a sum (a chunked head or MLP: the loss and the weight
#: gradients are sums over row chunks), by dtype of the step; everything else is compared bitwise.
CHUNKED_RTOL = {torch.float32: 1e-5, torch.bfloat16: 5e-2}


# ------------------------------------------------------------------------------------------ families
def build(family: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny model of ``family`` in training mode and a batch of ``BATCH`` rows with labels."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tiny = dict(num_hidden_layers=LAYERS, num_attention_heads=HEADS, hidden_size=WIDTH, intermediate_size=2 * WIDTH)
    if family in ("gpt2", "llama", "bert"):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        batch = {"input_ids": ids, "labels": ids.clone()}
        if family == "gpt2":
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS,
                                                                         vocab_size=VOCAB))
        elif family == "llama":
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=VOCAB, **tiny))
        else:
            model = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=VOCAB, **tiny))
            batch["labels"][:, ::3] = -100  # the masked positions only
            batch["attention_mask"] = torch.ones_like(ids)
    else:
        batch = {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
                 "labels": torch.randint(0, 5, (BATCH,), generator=g)}
        if family == "cnn":  # BatchNorm in every stage
            model = transformers.ResNetForImageClassification(transformers.ResNetConfig(
                embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5))
        else:
            model = transformers.ViTForImageClassification(transformers.ViTConfig(
                image_size=32, patch_size=8, num_labels=5, **tiny))
    return model.train(), batch


def loss_of(out: Any) -> torch.Tensor:
    return out.loss if not isinstance(out, tuple) else out[0]


# ------------------------------------------------------------------------------------------ plans
def make_plan(family: str, kind: str, graph: Any) -> Plan:
    """The plan of ``kind`` for ``graph`` by the real solvers, at a budget where the kind is used; for a
    pipeline stage, the first stage of a 2-stage GPipe layout whose plan checkpoints.

    Budgets are in bytes, from the least feasible one-level budget and store-all's peak of this graph
    (a fixed fraction would not put every family where the kind pays)."""
    full = scheduler.simulate(graph).peak_bytes
    try:
        scheduler.solve(graph, 1, selective=False)
    except InfeasibleBudget as info:
        least = info.min_feasible_bytes
    budgets = [least + (full - least) * i // 8 for i in range(8)]  # the least one-level budget up to store-all's
    if kind == "regions":
        plan = scheduler.solve(graph, budgets[4], selective=False)
        assert plan.regions and not plan.saved, "a one-level plan without kept ops"
    elif kind == "kept":
        plan = next((p for p in (scheduler.solve(graph, b) for b in budgets) if p.saved), None)
        assert plan is not None and any(plan.save_ops), "the plan keeps op outputs inside its regions"
    elif kind == "chunked":
        plan = scheduler.solve(graph, least - 1, chunks=(1, 2, 4), mlp_chunks=(1, 2))
        assert any(k > 1 for _, _, k in plan.chunks), "the plan runs calls in chunks"
    elif kind == "nested":  # below every one-level plan, where nesting pays; else every region of the least
        try:                # one-level plan nested (what the solver would nest, had it paid on these tiny sizes)
            plan = scheduler.solve(graph, least - 1, nested=True)
        except InfeasibleBudget:
            one = scheduler.solve(graph, budgets[2], selective=False)
            flags = [True] * len(one.regions)
            plan = Plan.from_regions(graph, one.regions, inner=nested_plan_inner(graph, one.regions, flags))
        assert plan.inner, "the plan nests regions"
    else:
        from scheduler.distributed import Layout, solve_layout

        layout = Layout(pp=2, microbatches=2)
        whole = solve_layout(graph, "1GiB", layout).peak_bytes
        plan = None
        for share in (0.85, 0.8):  # ViT's first stage fits no plan at 0.85 of the whole layout's peak
            stages = solve_layout(graph, int(whole * share), layout, strict=False).stages
            plan = next((s.plan for s in stages if s.plan is not None and s.plan.regions), None)
            if plan is not None:
                break
        assert plan is not None, "a stage's plan checkpoints"
    return plan


# ------------------------------------------------------------------------------------------ steps
def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.clone() for n, b in model.named_buffers() if "running" in n or "num_batches" in n}


def _zero(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def _held(model, batch, **extra):
    _zero(model)
    torch.manual_seed(0)
    out = model(**batch, **extra)
    loss_of(out).backward()
    return {"loss": loss_of(out).detach(), "grads": _grads(model), "buffers": _buffers(model)}


def wf_held(model, batch, family):
    return _held(model, batch)


def wf_dropped(model, batch, family):
    _zero(model)
    torch.manual_seed(0)
    loss = model(**batch).loss
    loss.backward()
    return {"loss": loss.detach(), "grads": _grads(model), "buffers": _buffers(model)}


def wf_tuple_output(model, batch, family):
    return _held(model, batch, return_dict=False)


def wf_eval_grad(model, batch, family):
    model.eval()
    _zero(model)
    out = model(**batch)
    out.loss.backward()
    return {"loss": out.loss.detach(), "logits": out.logits.detach() if out.logits is not None else None,
            "grads": _grads(model)}


def wf_generate(model, batch, family):
    model.eval()
    ids = batch["input_ids"][:1, :5]
    return {"tokens": model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                     pad_token_id=0)}


def wf_autocast_bf16(model, batch, family):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return _held(model, batch)


def wf_to_bf16(model, batch, family):
    model.to(torch.bfloat16)
    batch = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()}
    return _held(model, batch)


def wf_grad_accum(model, batch, family):
    _zero(model)
    losses = []
    for micro in range(2):
        torch.manual_seed(micro)
        half = {k: v[micro * BATCH // 2:(micro + 1) * BATCH // 2] for k, v in batch.items()}
        loss = model(**half).loss
        loss.backward()
        losses.append(loss.detach())
    return {"losses": losses, "grads": _grads(model), "buffers": _buffers(model)}


def wf_retain_graph(model, batch, family):
    _zero(model)
    torch.manual_seed(0)
    out = model(**batch)
    out.loss.backward(retain_graph=True)
    first = _grads(model)
    out.loss.backward()
    return {"loss": out.loss.detach(), "first": first, "grads": _grads(model)}


def wf_grad_penalty(model, batch, family):
    _zero(model)
    torch.manual_seed(0)
    loss = model(**batch).loss
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, create_graph=True)
    penalty = sum(g.pow(2).sum() for g in grads)
    (loss + penalty).backward()
    return {"loss": loss.detach(), "penalty": penalty.detach(), "grads": _grads(model)}


def wf_save_load(model, batch, family):
    """state_dict keys, save_pretrained/from_pretrained, pickle and deepcopy: every copy steps as the model."""
    plan = applied_plan(model)
    out = {"keys": list(model.state_dict())}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        out["reloaded"] = dict(type(model).from_pretrained(tmp).state_dict())
    copied = copy.deepcopy(model)
    assert applied_plan(copied) == plan
    assert all(a is not b for a, b in zip(copied.modules(), model.modules()))
    clone = pickle.loads(pickle.dumps(model))
    assert applied_plan(clone) == plan
    out["pickled"] = _held(clone, batch)
    return out


def _dataset(batch):
    rows = next(iter(batch.values())).shape[0]
    return [{k: v[i] for k, v in batch.items()} for i in range(rows)]


def _trainer(model, tmp):
    args = transformers.TrainingArguments(output_dir=tmp, max_steps=1, per_device_train_batch_size=BATCH,
                                          per_device_eval_batch_size=2, report_to="none", save_strategy="no")
    return transformers.Trainer(model=model, args=args, compute_metrics=_metrics)


def _metrics(prediction):
    preds = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return {"mean_prediction": float(preds.astype("float64").mean())}


def wf_trainer_train(model, batch, family):
    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(model, tmp)
        trainer.train_dataset = _dataset(batch)
        trainer.train()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "buffers": _buffers(model)}


def wf_trainer_evaluate(model, batch, family):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = _trainer(model, tmp).evaluate(_dataset(batch))
    return {k: v for k, v in metrics.items() if k in ("eval_loss", "eval_mean_prediction")}


def wf_trainer_predict(model, batch, family):
    with tempfile.TemporaryDirectory() as tmp:
        result = _trainer(model, tmp).predict(_dataset(batch))
    preds = result.predictions[0] if isinstance(result.predictions, tuple) else result.predictions
    return {"predictions": torch.from_numpy(preds.copy()), "loss": result.metrics["test_loss"]}


WORKFLOWS: dict[str, Callable[..., dict]] = {
    "held": wf_held, "dropped": wf_dropped, "trainer-train": wf_trainer_train,
    "trainer-evaluate": wf_trainer_evaluate, "trainer-predict": wf_trainer_predict,
    "tuple-output": wf_tuple_output, "generate": wf_generate,
    "eval-grad": wf_eval_grad, "autocast-bf16": wf_autocast_bf16, "to-bf16": wf_to_bf16,
    "grad-accum": wf_grad_accum, "retain-graph": wf_retain_graph, "grad-penalty": wf_grad_penalty,
    "save-load": wf_save_load, "peak": None,  # the held step by the allocator (the test module measures it)
}

#: Workflows that differ from the held step only in who calls the model, in its output's form, or run
#: without grad (nothing is checkpointed): the kind of regions does not change them, the chunked head
#: does (it replaces the model's own forward), so they run for those two kinds.
CALLERS = ("dropped", "trainer-train", "trainer-evaluate", "trainer-predict", "tuple-output", "generate")

#: Kinds the solvers never use on a family at these sizes (no budget makes them pay), and why.
NOT_USED = {("cnn", "nested"): "no budget makes nesting pay on this ResNet: the solver nests nothing"}


def applies(family: str, kind: str, workflow: str) -> bool:
    """Whether cell ``family-kind-workflow`` tests something (see CALLERS): generation is for causal LMs; a
    gradient penalty needs attention that torch can differentiate twice (its CPU flash attention, which
    Llama's and ViT's default ``sdpa`` runs, cannot: the unplanned model fails too); peaks are predicted
    for one stage's rank, not for the whole model, so a stage's plan has no peak cell here."""
    if (family, kind) in NOT_USED or (workflow in CALLERS and kind not in ("regions", "chunked")):
        return False
    if workflow == "generate":
        return family in CAUSAL
    if workflow == "grad-penalty":
        return family not in ("llama", "vit")
    return not (workflow == "peak" and kind == "stage")


# ------------------------------------------------------------------------------------------ comparing
def agree(planned: Any, plain: Any, rtol: float | None, where: str = "", floor: float = 0.0) -> None:
    """``planned`` equals ``plain`` bitwise (``rtol`` None), or within ``rtol`` of the largest magnitude
    of each tensor (a reassociated sum); dicts, lists and floats recursively. Within a dict of tensors (the
    gradients) the scale is at least the largest magnitude of any of them: a gradient that is zero in exact
    arithmetic (BERT's key bias: softmax ignores a shift of the scores) is rounding noise made of summands
    the size of the others."""
    if isinstance(plain, dict):
        assert isinstance(planned, dict) and planned.keys() == plain.keys(), f"{where}: {sorted(plain)}"
        tensors = [v for v in plain.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if tensors and len(tensors) == len(plain):
            floor = max(floor, max(v.abs().max().item() for v in tensors))
        for k in plain:
            agree(planned[k], plain[k], rtol, f"{where}.{k}", floor)
    elif isinstance(plain, (list, tuple)):
        assert len(planned) == len(plain), where
        for i, (a, b) in enumerate(zip(planned, plain)):
            agree(a, b, rtol, f"{where}[{i}]", floor)
    elif isinstance(plain, torch.Tensor):
        assert isinstance(planned, torch.Tensor), f"{where}: {type(planned).__name__} where the plain step has a tensor"
        assert planned.shape == plain.shape and planned.dtype == plain.dtype, where
        if rtol is None or not plain.is_floating_point():
            assert torch.equal(planned, plain), f"{where}: not bitwise equal"
        else:
            scale = max(plain.abs().max().item(), floor, 1e-30)
            assert ((planned - plain).abs().max() / scale).item() <= rtol, where
    elif isinstance(plain, float) and rtol is not None:
        assert abs(planned - plain) <= rtol * max(abs(plain), 1e-30), where
    else:
        assert planned == plain, f"{where}: {planned!r} != {plain!r}"


def tolerance(kind: str, workflow: str) -> float | None:
    if kind != "chunked":
        return None
    return CHUNKED_RTOL[torch.bfloat16 if "bf16" in workflow else torch.float32]



# ------------------------------------------------------------------------------------------ peft
#: The modules LoRA adapts per family (peft's own defaults for these architectures, or their convolutions).
LORA_TARGETS = {"gpt2": ["c_attn"], "llama": ["q_proj", "v_proj"], "bert": ["query", "value"],
                "cnn": ["convolution"], "vit": ["q_proj", "v_proj"]}


def lora(model: nn.Module, family: str) -> nn.Module:
    """``model`` wrapped by peft's LoRA (the base frozen, adapters trained), as a user traces and plans it."""
    import peft

    torch.manual_seed(2)
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=LORA_TARGETS[family]))
