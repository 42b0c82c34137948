"""Per-rank predictions against real steps on gloo: FSDP2 over 2 and 4 processes, 2- and 4-stage pipelines under
GPipe and 1F1B (``torch.distributed.pipelining``), each with its plans applied. Every rank's allocator peak is at
or below its prediction, and the gradients equal one process stepping the whole batch.

One spawn of 4 processes runs every configuration (NOTE [ Measuring a rank ] in
``scheduler.measuring.distributed``); the 2-rank ones run in both pairs of ranks at once.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import scheduler
from scheduler.distributed import Layout, solve_layout
from scheduler.distributed.fsdp import fsdp_units, lingering_bytes
from scheduler.distributed.stages import stage_starts
from scheduler.measuring.distributed import FsdpRun, PipelineRun, run_distributed, single_process_grads
from scheduler.models.staged import StagedLM

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")]

SPEC = "test_distributed_runs:tiny"
BATCH, SEQ, MICROBATCHES = 8, 32, 4


def tiny() -> StagedLM:
    torch.manual_seed(0)
    return StagedLM(vocab=256, width=64, heads=4, layers=4, seq=SEQ).train()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (BATCH, SEQ), generator=g), torch.randint(0, 256, (BATCH, SEQ), generator=g)


tiny.batch = _batch  # type: ignore[attr-defined]


def _tight(graph, layout, share):
    """The stage plans at ``share`` of the store-all peak of the largest rank (some stages checkpoint). Interval
    plans (``selective=False``): a plan keeping nodes inside a region is predicted safely but loosely here (4-stage
    GPipe, stage 0: 1,472,000 B predicted, 1,126,400 measured), which the closeness test would not measure."""
    full = solve_layout(graph, "1GiB", layout)
    return solve_layout(graph, int(full.peak_bytes * share), layout, strict=False, selective=False)


@pytest.fixture(scope="module")
def measured():
    model = tiny()
    x, y = _batch()
    graphs = {b: scheduler.trace(model, (x[:b], y[:b])) for b in (BATCH // 4, BATCH // 2)}
    units = tuple(f"layers.{i}" for i in range(4))
    cases = []
    for shard in (2, 4):
        # gloo gathers in order: nothing ahead; its 2 worker threads may keep 2 finished collectives' buffers
        # (NOTE [ FSDP2's buffers ])
        layout = Layout(shard=shard, forward_prefetch=0, collective_threads=2)
        plans = _tight(graphs[BATCH // shard], layout, 0.85)
        _, unit_list, root = fsdp_units(graphs[BATCH // shard], units)
        cases.append((plans, FsdpRun(shard, units, plans.stages[0].plan), lingering_bytes(unit_list, root, 2)))
    for stages in (2, 4):
        for schedule in ("gpipe", "1f1b"):
            layout = Layout(pp=stages, microbatches=MICROBATCHES, schedule=schedule)
            graph = graphs[BATCH // MICROBATCHES]
            plans = _tight(graph, layout, 0.85)
            run = PipelineRun(stage_starts(graph, layout), schedule, MICROBATCHES, tuple(s.plan for s in plans.stages))
            cases.append((plans, run, 0))
    results = run_distributed(SPEC, 4, [run for _, run, _ in cases])
    return [(plans, result, held) for (plans, _, held), result in zip(cases, results)], single_process_grads(SPEC)


def test_every_rank_is_at_or_below_its_prediction(measured):
    cases, _ = measured
    for plans, result, _ in cases:
        for stage in plans.stages:
            if stage.plan is None:  # this stage has no plan at the tight budget: it ran without one, unpredicted
                continue
            assert result.peak(stage.index) <= stage.peak_bytes, (plans.layout.describe(), stage.index)
    checkpointed = [s for plans, _, _ in cases for s in plans.stages if s.plan is not None and s.plan.regions]
    assert len(checkpointed) >= 4, "the budgets are tight enough that plans checkpoint"


def test_predictions_are_close(measured):
    """Pipelines within 5 % above their measure; FSDP2 within 25 % (its buffers are bounded over whole units)
    less what gloo's worker threads may keep, which a step on an idle machine rarely shows.

    The first stage of the 4-stage GPipe measured 1,342,720 B against 1,357,312 predicted in some runs and
    1,054,976 B in others (issue 33): the earlier runs' pipeline stages, left in reference cycles, were collected
    during its measured step, and the frees of their gradients (made in an earlier measured step) lowered the
    running sum. ``profile_step`` now collects before the step and keeps the collector off during it (NOTE
    [ Measuring with profiler events ] in ``scheduler.measuring.profiler``): 1,342,720 B in every run."""
    cases, _ = measured
    for plans, result, held in cases:
        slack = 0.25 if plans.layout.shard > 1 else 0.05
        for stage in plans.stages:
            if stage.plan is not None:
                assert stage.peak_bytes - held <= (1 + slack) * result.peak(stage.index), (plans.layout.describe(),
                                                                                           stage.index)


def test_gradients_equal_one_process(measured):
    cases, reference = measured
    for plans, result, _ in cases:
        assert result.grads.keys() == reference.keys(), plans.layout.describe()
        for name, grad in result.grads.items():
            torch.testing.assert_close(grad, reference[name], rtol=1e-5, atol=1e-6, msg=name)
