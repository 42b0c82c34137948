"""Only the first sum into a shared parameter's pending view gradient is out of place.

T5 (4 + 4 layers at t5-small widths, batch 4, 128 / 64 tokens): the least
feasible budget was reported as 475.1 MiB, set by the backward of
``encoder.embed_tokens``, while transformers' own checkpointing ran the step
in 437.1 MiB (allocator peaks). The shared embedding (also the decoder's, and
the LM head's, tied) gets three gradients; the head's is a view (a transpose),
so the decoder's is added out of place, but the encoder's goes in place into
that plain sum. The tracer, on fake tensors where every sum is out of place,
charged the encoder's embedding a second ``[32128, 512]`` buffer: twice, by
its window for a repeated contribution and by the window of the parameter's
``AccumulateGrad``, which took in the sum made just before it (NOTE [ Shared
parameter gradients ] in ``scheduler.tracing.costs``). Measured here by the
allocator (the storage count runs under a dispatch mode, where every sum is
out of place: NOTE [ Counting like simulate ] in ``scheduler.measuring.storages``).
"""

import pytest
import torch

import scheduler
from scheduler.measuring.steps import allocator_step_peak
from scheduler.tracing.tracer import capture
from solvers import InfeasibleBudget, simulate

transformers = pytest.importorskip("transformers")

# What the graph holds and the allocator does not, at the decoder embedding's backward (both peaks):
# 8 bytes of a saved Python scalar (NOTE [ Saved Python scalars ]) and the decoder's shifted input ids
# ([2, 16] int64), which the embedding's backward releases before the engine's sum.
HELD_LONGER = 8 + 2 * 16 * 8


@pytest.fixture(scope="module")
def t5():
    torch.manual_seed(0)
    cfg = transformers.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=2000,
                                decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).train()
    kwargs = {"input_ids": torch.randint(0, 2000, (2, 32)), "labels": torch.randint(0, 2000, (2, 16))}
    graph = capture(model, (), kwargs, loss=lambda out: out.loss, costs="flops").graph
    return model, kwargs, graph


def _allocator_peak(model, kwargs) -> int:
    torch.manual_seed(0)
    return allocator_step_peak(model, model, (), kwargs, lambda out: out.loss)


def test_only_the_decoders_contribution_is_summed_out_of_place(t5):
    model, _, graph = t5
    weight = model.shared.weight.numel() * model.shared.weight.element_size()
    assert model.lm_head.weight is model.shared.weight is model.encoder.embed_tokens.weight
    [encoder] = [nd for nd in graph.nodes if nd.module == "encoder.embed_tokens" and nd.out_bytes]
    [decoder] = [nd for nd in graph.nodes if nd.module == "decoder.embed_tokens" and nd.out_bytes]
    assert encoder.workspace_bytes == weight  # its contribution, added in place
    assert decoder.workspace_bytes == 2 * weight - decoder.out_bytes  # its contribution and the sum


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_:FutureWarning")
def test_store_all_and_the_floor_plan_measure_as_predicted(t5):
    model, kwargs, graph = t5
    assert _allocator_peak(model, kwargs) == simulate(graph).peak_bytes - HELD_LONGER
    with pytest.raises(InfeasibleBudget) as info:
        scheduler.solve(graph, 1 << 20, solver="ilp")
    floor = info.value.min_feasible_bytes
    plan = scheduler.solve(graph, floor, solver="ilp")
    scheduler.apply(model, plan)
    try:
        assert _allocator_peak(model, kwargs) == simulate(graph, plan).peak_bytes - HELD_LONGER
    finally:
        scheduler.remove(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        transformers_peak = _allocator_peak(model, kwargs)
    finally:
        model.gradient_checkpointing_disable()
    assert floor < transformers_peak  # the floor was 3,372,752 bytes, above transformers' 3,261,576
