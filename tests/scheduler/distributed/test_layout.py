"""The layout (checked with clear errors) and the pipeline schedules' orders, against torch's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scheduler.distributed import Layout, LayoutError, in_flight, rank_order
from scheduler.distributed.schedule import ChunkMemory, rank_peak


@pytest.mark.parametrize("kwargs, words", [
    (dict(shard=0), "shard must be a whole number"),
    (dict(tp=True), "tp must be a whole number"),
    (dict(schedule="zero-bubble"), "unknown pipeline schedule"),
    (dict(sequence_parallel=True), "needs tp > 1"),
    (dict(pp=4, microbatches=2, schedule="1f1b"), "at least as many micro-batches as pipeline stages"),
    (dict(pp=2, microbatches=4, schedule="interleaved-1f1b"), "virtual_stages"),
    (dict(pp=2, microbatches=4, virtual_stages=2), "needs the interleaved-1f1b schedule"),
    (dict(pp=2, microbatches=5, schedule="interleaved-1f1b", virtual_stages=2), "multiple of the rounds"),
    (dict(pp=2, microbatches=2, stage_starts=("a", "b")), "begin at 1 module paths"),
    (dict(forward_prefetch=-1), "forward_prefetch"),
    (dict(collective_threads=-1), "collective_threads"),
])
def test_a_layout_that_cannot_run_is_refused_naming_the_degree(kwargs, words):
    with pytest.raises(LayoutError, match=words):
        Layout(**kwargs)


def test_a_layout_describes_itself_and_counts_its_ranks():
    layout = Layout(shard=8, tp=2, sequence_parallel=True, pp=4, microbatches=8, schedule="1F1B")
    assert layout.schedule == "1f1b" and layout.world == 64 and layout.stages == 4
    assert layout.describe() == "fsdp 8 x tp 2 (sp) x pp 4, 8 micro-batches, 1f1b"
    assert Layout().single and not Layout(microbatches=2).single
    assert Layout(replicate=2, shard=4).data_parallel == 8


def _actions(order):
    """torch's schedule IR as (kind, stage, micro-batch), compute actions only."""
    out = []
    for a in order:
        if a is None:
            continue
        kind = str(a.computation_type)
        if kind.endswith("FORWARD") and "BACKWARD" not in kind:
            out.append(("F", a.stage_index, a.microbatch_index))
        elif "BACKWARD" in kind:
            out.append(("B", a.stage_index, a.microbatch_index))
    return out


def _ours(layout, rank):
    return [(op.kind, op.stage, op.microbatch) for op in rank_order(layout, rank)]


def _most_held(actions, stage):
    held = most = 0
    for kind, s, _ in actions:
        if s != stage:
            continue
        held += kind == "F"
        most = max(most, held)
        held -= kind == "B"
    return most


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 4), (4, 8), (3, 5)])
def test_gpipe_and_1f1b_orders_hold_what_torchs_do(pp, m):
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe

    me = SimpleNamespace(_num_stages=pp, _n_microbatches=m)
    gpipe = ScheduleGPipe._get_pipeline_order(me)
    onef = Schedule1F1B._get_pipeline_order(me)
    for rank in range(pp):
        assert _ours(Layout(pp=pp, microbatches=m, schedule="gpipe"), rank) == _actions(gpipe[rank])
        ours = _ours(Layout(pp=pp, microbatches=m, schedule="1f1b"), rank)
        # the same forwards and backwards in the same order (torch's IR numbers the last rank's forwards from 1)
        assert [a[0] for a in ours] == [a[0] for a in _actions(onef[rank])]
        assert _most_held(ours, rank) == _most_held(_actions(onef[rank]), rank) == min(m, pp - rank)
        assert in_flight(Layout(pp=pp, microbatches=m, schedule="1f1b"), rank)[0] == min(m, pp - rank)
        assert in_flight(Layout(pp=pp, microbatches=m, schedule="gpipe"), rank)[0] == m


@pytest.mark.parametrize("pp, v, m", [(2, 2, 4), (4, 2, 8), (2, 3, 4), (4, 2, 4)])
def test_interleaved_order_is_torchs(pp, v, m):
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    rounds = max(1, m // pp)
    layout = Layout(pp=pp, microbatches=m, schedule="interleaved-1f1b", virtual_stages=v)
    for rank in range(pp):
        me = SimpleNamespace(n_local_stages=v, microbatches_per_round=m // rounds, pp_group_size=pp,
                             _n_microbatches=m)
        theirs = _actions(ScheduleInterleaved1F1B._calculate_single_rank_operations(me, rank))
        assert _ours(layout, rank) == theirs
        for stage in range(rank, pp * v, pp):
            count, reason = in_flight(layout, stage)
            assert count == _most_held(theirs, stage) and f"rank {rank}" in reason


def test_without_a_pipeline_micro_batches_run_one_after_another():
    assert in_flight(Layout(microbatches=4), 0) == (1, "no pipeline: the micro-batches run one after another "
                                                       "(gradient accumulation)")


def test_a_ranks_peak_walks_its_order():
    """1F1B's first stage of 2, 4 micro-batches: F0 F1 B0 F2 B1 F3 B2 B3; the gradients exist from B0's end."""
    c = ChunkMemory(retained_bytes=100, forward_bytes=110, first_backward_bytes=150, backward_bytes=230,
                    grad_bytes=70)
    layout = Layout(pp=2, microbatches=4, schedule="1f1b")
    peak = rank_peak(layout, 0, {0: c})
    # F2 after B0: one held (100) + forward (110) + gradients (70) = 280; B1: one other held + 230 = 330
    assert peak.bytes == 330 and (peak.op.kind, peak.op.microbatch) == ("B", 1) and peak.held == {0: 2}
    gpipe = rank_peak(Layout(pp=2, microbatches=4, schedule="gpipe"), 0, {0: c})
    assert gpipe.bytes == 3 * 100 + 150  # the first backward, every micro-batch held, gradients still being made
