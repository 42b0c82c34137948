"""Persistent-state arithmetic against hand counts and against torch's own optimizers."""

import pytest
import torch
from torch import nn

from graphs import synthetic
from scheduler.sizing.budget import BudgetError
from scheduler.sizing.memory import (
    DEFAULT_RESERVE, levers, memory_report, parse_reserve, persistent_state, plan_memory, render_report,
)
from solvers import simulate

GiB = 1 << 30


def mlp(dtype=torch.float32) -> nn.Module:
    # 2-layer MLP: fc1 16 -> 32 (512 weights + 32 biases), fc2 32 -> 4 (128 + 4): 676 parameters.
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(dtype)


MLP_PARAMS = 16 * 32 + 32 + 32 * 4 + 4  # = 676, counted by hand


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_mlp_parameter_count_is_the_hand_count():
    assert n_params(mlp()) == MLP_PARAMS == 676


def test_adam_fp32_hand_count():
    s = persistent_state(n_params(mlp()), dtype="fp32", optimizer="adam")
    assert s.param_bytes == 676 * 4 == 2704
    assert s.grad_bytes == 2704
    assert s.optimizer_bytes == 676 * 2 * 4 == 5408  # exp_avg + exp_avg_sq, fp32
    assert s.master_bytes == 0
    assert s.total_bytes == 676 * 16


def test_adam_bf16_mixed_precision_hand_count():
    s = persistent_state(n_params(mlp()), dtype="bf16", optimizer="adam", mixed_precision=True)
    assert s.param_bytes == 676 * 2 == 1352  # bf16 weights
    assert s.grad_bytes == 1352  # bf16 gradients
    assert s.optimizer_bytes == 676 * 2 * 4 == 5408  # two fp32 states
    assert s.master_bytes == 676 * 4 == 2704  # fp32 master copy
    assert s.total_bytes == 676 * 16  # ZeRO's 2 + 2 + 12 bytes per parameter


def test_pure_bf16_adam_and_sgd_variants():
    assert persistent_state(676, dtype="bf16", optimizer="adamw").total_bytes == 676 * (2 + 2 + 4)
    assert persistent_state(676, optimizer="sgd").optimizer_bytes == 0
    assert persistent_state(676, optimizer="sgd-momentum").optimizer_bytes == 676 * 4
    mp_sgd = persistent_state(676, dtype="fp16", optimizer="sgd", mixed_precision=True)
    assert (mp_sgd.optimizer_bytes, mp_sgd.master_bytes) == (0, 676 * 4)  # SGD keeps no state, master stays
    none = persistent_state(676, dtype="bf16", optimizer="none", mixed_precision=True)
    assert none.total_bytes == 676 * 4  # weights + grads only


def test_frozen_parameters_cost_their_weights_only():
    s = persistent_state(1000, trainable=100, optimizer="adam")
    assert (s.param_bytes, s.grad_bytes, s.optimizer_bytes) == (4000, 400, 800)


@pytest.mark.parametrize("dtype,name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_adam_state_matches_torch_optimizer(dtype, name):
    # Independent check: the tensors torch.optim.Adam really allocates after one step.
    model = mlp(dtype)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 16, dtype=dtype)).sum().backward()
    opt.step()
    state = sum(t.numel() * t.element_size() for st in opt.state.values() for k, t in st.items() if k != "step")
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    s = persistent_state(n_params(model), dtype=name, optimizer="adam")
    assert (s.param_bytes, s.grad_bytes, s.optimizer_bytes) == (weights, grads, state)


def test_bad_inputs_are_refused_with_the_fix():
    with pytest.raises(BudgetError, match="bf16 or fp16"):
        persistent_state(10, dtype="fp32", mixed_precision=True)
    with pytest.raises(BudgetError, match="choose one of"):
        persistent_state(10, optimizer="lion")
    with pytest.raises(BudgetError, match="choose one of"):
        persistent_state(10, dtype="int8")


def test_reserve_forms():
    card = 80 * GiB
    assert parse_reserve(None, card) == int(DEFAULT_RESERVE * card)
    assert parse_reserve("10%", card) == 8 * GiB
    assert parse_reserve(0.1, card) == 8 * GiB
    assert parse_reserve("2GiB", card) == 2 * GiB
    assert parse_reserve("0", card) == 0
    with pytest.raises(BudgetError):
        parse_reserve("90GiB", card)
    with pytest.raises(BudgetError):
        parse_reserve("lots", card)


def test_report_categories_add_up_to_the_simulated_peak():
    graph = synthetic.transformer(40)
    # The graph's params as fp32 weights of p parameters (param_bytes = 4p).
    import dataclasses
    graph = dataclasses.replace(graph, param_bytes=400 * (1 << 20))
    state = persistent_state(graph.param_bytes // 4, optimizer="adam")
    sim = simulate(graph, None, record=False)
    rep = memory_report(state, 8 * GiB, reserve="1GiB", input_bytes=graph.input_bytes,
                        plans=[plan_memory("store-all", sim, state.grad_bytes, 0)])
    p = rep.plans[0]
    # Step total = simulate's peak + optimizer state + reserve, whichever way it is split.
    assert rep.total_bytes(p) == sim.peak_bytes + state.optimizer_bytes + (1 << 30)
    assert rep.solver_budget_bytes == 8 * GiB - (1 << 30) - state.optimizer_bytes
    text = render_report(rep)
    for word in ("parameters", "gradients", "optimizer state", "framework reserve", "store-all"):
        assert word in text


def test_levers_when_persistent_state_alone_is_over_the_card():
    state = persistent_state(6_738_415_616, optimizer="adam")  # Llama-2-7B, fp32 Adam: 100 GiB
    rep = memory_report(state, 80 * GiB)
    assert rep.activation_room_bytes < 0
    text = " ".join(levers(rep))
    assert "ZeRO" in text and "cannot help" in text and "pure bf16" in text and "trainable" in text
    # With room left, the activation levers come first and nothing claims batch cannot help.
    small = memory_report(persistent_state(1000), 1 * GiB)
    lv = levers(small)
    assert "smaller batch" in lv[0] and not any("cannot help" in x for x in lv)
