"""Plans applied onto the user's own module: the integration matrix of issue 14.

Every row runs a real step with the plan and the same step without it (same
weights, seed and inputs) and asserts the gradients are bitwise equal; rows at
other shapes also assert the measured peak (live storages) stays at or below
the prediction for the traced (largest) shape.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import scheduler
import solvers
from scheduler.applying import ApplyError, applied_plan, region_wrappers
from scheduler.measuring.storages import measure_step
from scheduler.models import build
from scheduler.tracing.tracer import capture
from solvers import Plan, PlanMismatch, simulate

transformers = pytest.importorskip("transformers")


# ------------------------------------------------------------------ models
def tiny_gpt2() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=64, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg).train()


def tiny_vit() -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 image_size=32, patch_size=8, num_labels=5)
    return transformers.ViTForImageClassification(cfg).train()


def gpt2_batch(batch: int, seq: int, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (batch, seq), generator=g)
    return {"input_ids": ids, "labels": ids}


def vit_batch(batch: int, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=g), "labels": torch.randint(0, 5, (batch,), generator=g)}


def hf_loss(out):
    return out.loss


def plan_for(model: nn.Module, args=(), kwargs=None, loss=None) -> tuple[object, Plan]:
    """The ilp plan at the budget of per-module (one region per block): aligned, solved, tight."""
    graph = capture(model, args, kwargs or {}, loss=loss).graph
    assert graph.spans, "the tracer records submodule calls"
    per_block = solvers.solve(graph, 1 << 50, solver="per-module")
    plan = scheduler.solve(graph, per_block.peak_bytes, solver="ilp", time_limit_s=60)
    assert plan.regions and all(plan.modules)
    return graph, plan


def step(model: nn.Module, kwargs: dict, *, args=(), loss=None, seed: int = 0) -> tuple[torch.Tensor, dict]:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    out = model(*args, **kwargs)
    value = loss(out) if loss is not None else out
    value.backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_step(model: nn.Module, plan: Plan, kwargs: dict, *, args=(), loss=None) -> int:
    """Gradients of a step with the plan bitwise equal those without; returns the recomputes that ran."""
    scheduler.remove(model)
    l0, g0 = step(model, kwargs, args=args, loss=loss)
    scheduler.apply(model, plan)
    before = sum(w.recomputes for w in region_wrappers(model))
    l1, g1 = step(model, kwargs, args=args, loss=loss)
    recomputes = sum(w.recomputes for w in region_wrappers(model)) - before
    assert torch.equal(l0, l1)
    assert g0.keys() == g1.keys()
    for name in g0:
        assert torch.equal(g0[name], g1[name]), name
    return recomputes


@pytest.fixture(scope="module")
def gpt2_setup():
    model = tiny_gpt2()
    graph, plan = plan_for(model, kwargs=gpt2_batch(4, 32), loss=hf_loss)
    return model, graph, plan


# ------------------------------------------------------------------ shapes
@pytest.mark.parametrize("batch,seq", [(4, 32), (2, 32), (4, 16), (1, 7)])
def test_gpt2_other_shapes_keep_gradients_and_stay_under_the_traced_prediction(gpt2_setup, batch, seq):
    model, graph, plan = gpt2_setup
    kwargs = gpt2_batch(batch, seq)
    assert assert_same_step(model, plan, kwargs, loss=hf_loss) == len(plan.regions)
    torch.manual_seed(0)
    measured = measure_step(model, (), kwargs, loss=hf_loss).peak_bytes
    assert measured <= simulate(graph, plan).peak_bytes


def test_variable_length_batches_train_like_the_unplanned_model(gpt2_setup):
    model, _, plan = gpt2_setup
    scheduler.remove(model)
    twin = copy.deepcopy(model)
    scheduler.apply(model, plan)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    for seq in (32, 9, 21, 32):
        losses = []
        for m, opt in zip((model, twin), opts):
            opt.zero_grad()
            torch.manual_seed(seq)
            loss = m(**gpt2_batch(3, seq, seed=seq)).loss
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        assert torch.equal(losses[0], losses[1])
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n


def test_eval_no_grad_and_generate_run_the_plain_forward(gpt2_setup):
    model, _, plan = gpt2_setup
    scheduler.remove(model)
    ids = gpt2_batch(1, 5)["input_ids"]
    model.eval()
    try:
        with torch.no_grad():
            ref_logits = model(ids).logits
        ref = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        scheduler.apply(model, plan)
        before = sum(w.recomputes for w in region_wrappers(model))
        with torch.no_grad():
            assert torch.equal(model(ids).logits, ref_logits)
        assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0), ref)
        assert sum(w.recomputes for w in region_wrappers(model)) == before
    finally:
        model.train()


def test_state_dict_save_pretrained_pickle_deepcopy(gpt2_setup, tmp_path):
    model, _, plan = gpt2_setup
    scheduler.remove(model)
    keys = list(model.state_dict())
    scheduler.apply(model, plan)
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path / "m")
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "m")
    for (n, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), n
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert applied_plan(clone) == plan
        wrappers = region_wrappers(clone)
        assert [w.path for w in wrappers] == [w.path for w in region_wrappers(model)]
        assert all(w.module is not v.module for w, v in zip(wrappers, region_wrappers(model)))
        assert assert_same_step(clone, plan, gpt2_batch(2, 16), loss=hf_loss) == len(plan.regions)


def test_dtype_change_and_autocast_after_apply(gpt2_setup):
    model, _, plan = gpt2_setup
    scheduler.remove(model)
    half = copy.deepcopy(model).to(torch.bfloat16)
    scheduler.apply(half, plan)
    assert assert_same_step(half, plan, gpt2_batch(2, 16), loss=hf_loss) == len(plan.regions)

    def autocast_loss(out):
        return out.loss

    scheduler.apply(model, plan)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert assert_same_step(model, plan, gpt2_batch(2, 16), loss=autocast_loss) == len(plan.regions)


def test_hooks_and_adapters_added_after_apply_take_effect(gpt2_setup):
    base, graph, plan = gpt2_setup
    # A plan without kept op calls: those are counted per region, so an adapter added inside a region that keeps
    # some turns the overloads it calls off there (KeptOpsDropped, NOTE [ Kept calls that do not come ]).
    plan = scheduler.solve(graph, plan.budget_bytes, solver="ilp", selective=False, time_limit_s=60)
    assert plan.regions and not plan.saved
    scheduler.remove(base)
    model, twin = copy.deepcopy(base), copy.deepcopy(base)
    scheduler.apply(model, plan)
    seen = []
    for m in (model, twin):
        block = m.transformer.h[0]
        block.mlp.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))

        class Adapter(nn.Module):  # LoRA-style: base(x) + B(A(x)), A and B new parameters
            def __init__(self, base: nn.Module) -> None:
                super().__init__()
                self.base = base
                torch.manual_seed(3)
                self.a = nn.Linear(32, 4, bias=False)
                self.b = nn.Linear(4, 3 * 32, bias=False)

            def forward(self, x):
                return self.base(x) + self.b(self.a(x))

        block.attn.c_attn = Adapter(block.attn.c_attn)
    kwargs = gpt2_batch(2, 16)
    l1, g1 = step(model, kwargs, loss=hf_loss)
    l0, g0 = step(twin, kwargs, loss=hf_loss)
    assert torch.equal(l0, l1) and g0.keys() == g1.keys()
    assert "transformer.h.0.attn.c_attn.a.weight" in g1
    assert all(torch.equal(g0[k], g1[k]) for k in g0)
    assert len(seen) >= 2


def test_frozen_parameters_and_gradient_accumulation(gpt2_setup):
    model, _, plan = gpt2_setup
    scheduler.remove(model)
    twin = copy.deepcopy(model)
    for m in (model, twin):
        m.transformer.wte.weight.requires_grad_(False)
    scheduler.apply(model, plan)
    try:
        grads = []
        for m in (model, twin):
            for p in m.parameters():
                p.grad = None
            for micro in range(2):
                torch.manual_seed(micro)
                m(**gpt2_batch(2, 16, seed=micro)).loss.backward()
            grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
        assert "transformer.wte.weight" not in grads[0]
        assert grads[0].keys() == grads[1].keys()
        assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])
    finally:
        for m in (model, twin):
            m.transformer.wte.weight.requires_grad_(True)


def test_torch_compile_aot_eager_is_bitwise(gpt2_setup):
    model, _, plan = gpt2_setup
    scheduler.remove(model)
    twin = copy.deepcopy(model)
    scheduler.apply(model, plan)
    kwargs = gpt2_batch(2, 16)
    compiled = torch.compile(model, backend="aot_eager")
    l1, _ = step(compiled, kwargs, loss=hf_loss)
    g1 = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    l0, _ = step(torch.compile(twin, backend="aot_eager"), kwargs, loss=hf_loss)
    g0 = {n: p.grad for n, p in twin.named_parameters() if p.grad is not None}
    assert torch.equal(l0, l1) and g0.keys() == g1.keys()
    assert all(torch.equal(g0[k], g1[k]) for k in g0)


def test_trainer_trains_the_applied_model_unchanged(gpt2_setup, tmp_path):
    pytest.importorskip("accelerate")
    from torch.utils.data import Dataset

    model, _, plan = gpt2_setup
    scheduler.remove(model)
    twin = copy.deepcopy(model)
    scheduler.apply(model, plan)

    class Tokens(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            ids = gpt2_batch(1, 16, seed=i)["input_ids"][0]
            return {"input_ids": ids, "labels": ids}

    finals = []
    for m in (model, twin):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "t"), per_device_train_batch_size=2,
                                              max_steps=2, report_to=[], save_strategy="no", logging_steps=1,
                                              use_cpu=True, seed=0, dataloader_num_workers=0)
        transformers.Trainer(model=m, args=args, train_dataset=Tokens()).train()
        finals.append([p.detach().clone() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*finals))
    assert applied_plan(model) == plan


# -------------------------------------------------------------- other models
def test_vit_other_batch_sizes():
    model = tiny_vit()
    graph, plan = plan_for(model, kwargs=vit_batch(4), loss=hf_loss)
    for batch in (4, 3, 1):
        assert assert_same_step(model, plan, vit_batch(batch), loss=hf_loss) == len(plan.regions)
        torch.manual_seed(0)
        assert measure_step(model, (), vit_batch(batch), loss=hf_loss).peak_bytes <= simulate(graph, plan).peak_bytes


def test_builtin_resnet_batchnorm_statistics_and_other_image_sizes():
    ex = build("resnet", batch=4, image_size=32, width=8)  # width 8: the same calls, a quarter of the FLOPs per step
    model = ex.model
    graph, plan = plan_for(model, ex.args, ex.kwargs, loss=ex.loss)
    for batch, size in ((4, 32), (2, 32), (4, 24)):
        x = torch.randn(batch, *ex.args[0].shape[1:2], size, size, generator=torch.Generator().manual_seed(batch))
        y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(size))
        stats = [b.clone() for b in model.buffers()]
        scheduler.remove(model)
        l0, g0 = step(model, {}, args=(x, y))
        after0 = [b.clone() for b in model.buffers()]
        with torch.no_grad():
            for b, s in zip(model.buffers(), stats):
                b.copy_(s)
        scheduler.apply(model, plan)
        l1, g1 = step(model, {}, args=(x, y))
        assert torch.equal(l0, l1) and all(torch.equal(g0[k], g1[k]) for k in g0)
        assert all(torch.equal(a, b) for a, b in zip(after0, model.buffers())), "running statistics updated once"


# ------------------------------------------------------------------ errors
def test_a_plan_for_another_model_names_the_first_missing_module(gpt2_setup):
    _, graph, _ = gpt2_setup
    span = next(sp for sp in graph.spans if sp.module == "transformer.h.1.mlp")
    plan = Plan.from_regions(graph, [(span.first, span.last)])
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)
    other = transformers.GPT2LMHeadModel(cfg)
    with pytest.raises(PlanMismatch, match=r"'transformer\.h\.1\.mlp'"):
        scheduler.apply(other, plan)
    assert region_wrappers(other) == []
    bigger = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64,
                                                                  n_positions=64))
    with pytest.raises(PlanMismatch, match="parameters"):
        scheduler.apply(bigger, plan)


def test_a_region_on_a_nested_or_local_class_applies_and_another_class_is_still_refused():
    class Outer:
        class Block(nn.Module):  # qualified name "...Outer.Block": the trace records it, apply compared the name
            def __init__(self) -> None:
                super().__init__()
                self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 8)

            def forward(self, x):
                return x + self.b(torch.tanh(self.a(x)))

    class Other(Outer.Block):
        pass

    def net(block):
        torch.manual_seed(0)
        return nn.Sequential(block(), block(), nn.Linear(8, 2))

    x = torch.randn(4, 8)
    graph = scheduler.trace(net(Outer.Block), (x,))
    assert "Outer.Block" in graph.meta["modules"]["0"]
    plan = solvers.Plan.from_regions(graph, [(sp.first, sp.last) for sp in graph.spans if sp.module in ("0", "1")])
    model, ref = net(Outer.Block), net(Outer.Block)
    scheduler.apply(model, plan)
    model(x).sum().backward()
    ref(x).sum().backward()
    assert len(region_wrappers(model)) == 2
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
    scheduler.apply(net(Other), plan)  # a subclass is that class still (FSDP2's wrapped classes pass so)
    with pytest.raises(PlanMismatch, match=r"'0' was a .*Outer\.Block and is a Linear"):
        scheduler.apply(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)), plan)


def test_a_plan_without_module_regions_says_to_use_the_graph_lowering(gpt2_setup):
    _, graph, _ = gpt2_setup
    plan = Plan.from_regions(graph.unaligned(), [(3, 4)])
    with pytest.raises(ApplyError, match="lower='graph'"):
        scheduler.apply(tiny_gpt2(), plan)


def test_torch_compile_inductor_runs_and_stays_close(gpt2_setup):
    """Inductor compiles the checkpointed calls as its own checkpoint operator; its kernels are not
    bitwise eager's (no RNG here: dropout is on, so compare with dropout off)."""
    model, _, plan = gpt2_setup
    scheduler.remove(model)
    twin = copy.deepcopy(model).eval()  # eval: dropout off, so both see the same function
    planned = copy.deepcopy(model).eval()
    scheduler.apply(planned, plan)
    kwargs = gpt2_batch(2, 16)
    l1, _ = step(torch.compile(planned), kwargs, loss=hf_loss)
    g1 = {n: p.grad for n, p in planned.named_parameters() if p.grad is not None}
    l0, g0 = step(twin, kwargs, loss=hf_loss)
    torch.testing.assert_close(l1, l0, rtol=1e-4, atol=1e-5)
    assert g0.keys() == g1.keys()
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-3, atol=1e-5, msg=k)
