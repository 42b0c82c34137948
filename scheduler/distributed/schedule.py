"""Pipeline schedules: the order each rank runs its micro-batches in, and what that holds.

NOTE [ Micro-batches in flight ]
    A pipeline stage keeps what a micro-batch's forward retained (the saved
    activations, the input it received, the output it sent) until that
    micro-batch's backward has run, so at its peak a stage holds several
    micro-batches at once. How many is the schedule's doing; the orders here
    are those of ``torch.distributed.pipelining`` (checked against its
    ``_step_microbatches`` and ``_calculate_single_rank_operations``):

    * ``gpipe`` (``ScheduleGPipe``): every forward, then every backward: a
      stage holds all ``microbatches`` at its first backward;
    * ``1f1b`` (``Schedule1F1B``): stage ``s`` of ``pp`` runs
      ``min(microbatches, pp - s)`` forwards (its warm-up), then one backward
      and one forward in turn: it never holds more than that, so the first
      stage holds ``pp`` micro-batches and the last one;
    * ``interleaved-1f1b`` (``ScheduleInterleaved1F1B``): rank ``r`` holds
      stages ``r, r + pp, ...``; it warms up with ``(v - 1) * per_round +
      2 * (pp - 1 - r)`` forward chunks (``per_round = microbatches //
      max(1, microbatches // pp)``), then runs a forward and a backward per
      step: each stage's count is read off that order.

    A rank's peak is then, over the operations of its order, what the
    micro-batches held at that moment retain plus what the running forward or
    backward needs beyond its own retained bytes (:func:`rank_peak`). With one
    stage per rank that is ``(k - 1) * retained + one micro-batch's peak``
    for the stage's count ``k`` (:func:`in_flight`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .layout import Layout

__all__ = ["Op", "ChunkMemory", "RankPeak", "rank_order", "in_flight", "rank_peak", "stages_of_rank"]


@dataclass(frozen=True)
class Op:
    """One compute operation of a pipeline rank.

    Attributes:
        kind: ``"F"`` (forward) or ``"B"`` (backward, input and weight gradients).
        stage: the stage it runs.
        microbatch: which micro-batch.
    """

    kind: str
    stage: int
    microbatch: int


@dataclass(frozen=True)
class ChunkMemory:
    """What one micro-batch of one stage holds, in bytes above the stage's parameters, inputs and buffers.

    Attributes:
        retained_bytes: held from the end of its forward until its backward
            (saved activations, the received input, the sent output, the Python scalars its
            autograd nodes saved: NOTE [ What a rank holds ]).
        forward_bytes: the most its forward holds at once (no gradient counted).
        first_backward_bytes: the most its backward holds at once while the
            stage's parameter gradients are made as it goes (its first one).
        backward_bytes: the same with every gradient already made.
        grad_bytes: the stage's parameter gradients, once made.
        sent_bytes: the gradient of what it received, which it sends back after its backward (the
            schedule holds it while the send is pending).
        held_peak_bytes: its peak as a stage's plan is solved (``inflight.persistent_graph``: the gradients
            held throughout, each backward's new ones charged to its node in both passes).
    """

    retained_bytes: int
    forward_bytes: int
    first_backward_bytes: int
    backward_bytes: int
    grad_bytes: int
    sent_bytes: int = 0
    held_peak_bytes: int = 0


@dataclass(frozen=True)
class RankPeak:
    """A rank's peak over its order (:func:`rank_peak`).

    Attributes:
        bytes: the peak above the rank's persistent state.
        op: the operation running at the peak.
        held: micro-batches held per stage at that moment (the running one included).
    """

    bytes: int
    op: Op
    held: Mapping[int, int]


def stages_of_rank(layout: Layout, rank: int) -> tuple[int, ...]:
    """The stages pipeline rank ``rank`` runs: ``rank, rank + pp, ...``."""
    return tuple(rank + k * layout.pp for k in range(layout.virtual_stages))


def rank_order(layout: Layout, rank: int) -> tuple[Op, ...]:
    """The forward and backward operations of pipeline rank ``rank``, in the order it runs them
    (NOTE [ Micro-batches in flight ]; idle steps left out)."""
    m, pp = layout.microbatches, layout.pp
    if layout.pp == 1:
        return tuple(op for mb in range(m) for op in (Op("F", 0, mb), Op("B", 0, mb)))
    if layout.schedule == "gpipe":
        return tuple([Op("F", rank, mb) for mb in range(m)] + [Op("B", rank, mb) for mb in range(m)])
    if layout.schedule == "1f1b":
        warmup = min(m, pp - rank)
        ops = [Op("F", rank, mb) for mb in range(warmup)]
        fwd, bwd = warmup, 0
        while bwd < m:
            ops.append(Op("B", rank, bwd))
            bwd += 1
            if fwd < m:
                ops.append(Op("F", rank, fwd))
                fwd += 1
        return tuple(ops)
    return _interleaved(layout, rank)


def _interleaved(layout: Layout, rank: int) -> tuple[Op, ...]:
    """torch's ``ScheduleInterleaved1F1B._calculate_single_rank_operations``, without its idle steps."""
    m, pp, v = layout.microbatches, layout.pp, layout.virtual_stages
    per_round = m // max(1, m // pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
    fwd_bwd = m * v - warmup

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % v) * pp + rank

    def bwd_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * pp + rank

    nxt_f: dict[int, int] = {}
    nxt_b: dict[int, int] = {}
    ops: list[Op] = []

    def add(kind: str, stage: int) -> None:
        counter = nxt_f if kind == "F" else nxt_b
        ops.append(Op(kind, stage, counter.get(stage, 0)))
        counter[stage] = counter.get(stage, 0) + 1

    for step in range(warmup + fwd_bwd + warmup):
        if step < warmup:
            add("F", fwd_stage(step))
        elif step < warmup + fwd_bwd:
            add("F", fwd_stage(step))
            add("B", bwd_stage(step))
        else:
            add("B", bwd_stage(step))
    return tuple(ops)


def _held_counts(order: tuple[Op, ...]) -> dict[int, int]:
    """Per stage, the most of its micro-batches held at once (the running one included)."""
    held: dict[int, int] = {}
    most: dict[int, int] = {}
    for op in order:
        if op.kind == "F":
            held[op.stage] = held.get(op.stage, 0) + 1
            most[op.stage] = max(most.get(op.stage, 0), held[op.stage])
        else:
            most[op.stage] = max(most.get(op.stage, 0), held.get(op.stage, 0))
            held[op.stage] -= 1
    return most


def in_flight(layout: Layout, stage: int) -> tuple[int, str]:
    """How many micro-batches ``stage`` holds at most at once, and where that count comes from."""
    m, pp = layout.microbatches, layout.pp
    if pp == 1:
        return 1, ("no pipeline: the micro-batches run one after another (gradient accumulation)" if m > 1
                   else "one micro-batch")
    rank = layout.rank_of_stage(stage)
    count = _held_counts(rank_order(layout, rank))[stage]
    if layout.schedule == "gpipe":
        return count, f"GPipe runs all {m} forwards before the first backward"
    if layout.schedule == "1f1b":
        return count, (f"1F1B: stage {stage} of {pp} warms up with min(microbatches, pp - stage) = "
                       f"min({m}, {pp - stage}) = {count} forwards before its first backward")
    per_round = m // max(1, m // pp)
    warmup = min((layout.virtual_stages - 1) * per_round + 2 * (pp - 1 - rank), m * layout.virtual_stages)
    return count, (f"interleaved 1F1B: rank {rank} runs {warmup} forward chunks ((v - 1) x {per_round} + "
                   f"2 x (pp - 1 - rank)) before its first backward, then a forward and a backward per step; "
                   f"stage {stage} holds at most {count} of them")


def rank_peak(layout: Layout, rank: int, chunks: Mapping[int, ChunkMemory]) -> RankPeak:
    """The peak of pipeline rank ``rank`` above its stages' parameters, inputs and buffers, walking its
    order (NOTE [ Micro-batches in flight ]); ``chunks`` gives each of its stages' :class:`ChunkMemory`.

    A stage's gradients exist from the end of its first backward on. The gradients a backward sends back
    stay referenced by the pending sends: under GPipe until the step ends (it waits for every send at
    the end), under the 1F1B schedules until the stage's next backward has made its own.
    """
    held: dict[int, int] = {s: 0 for s in stages_of_rank(layout, rank)}
    made: set[int] = set()
    pending: dict[int, int] = {}
    retained = grads = 0
    best: RankPeak | None = None
    for op in rank_order(layout, rank):
        c = chunks[op.stage]
        if op.kind == "F":
            now = retained + c.forward_bytes + grads + sum(pending.values())
            held[op.stage] += 1
            snapshot = dict(held)
            retained += c.retained_bytes
        else:
            own = c.backward_bytes - c.grad_bytes if op.stage in made else c.first_backward_bytes
            now = retained - c.retained_bytes + own + grads + sum(pending.values())
            snapshot = dict(held)
            held[op.stage] -= 1
            retained -= c.retained_bytes
            if op.stage not in made:
                made.add(op.stage)
                grads += c.grad_bytes
            gpipe = layout.schedule == "gpipe"
            pending[op.stage] = (pending.get(op.stage, 0) if gpipe else 0) + c.sent_bytes
        if best is None or now > best.bytes:
            best = RankPeak(now, op, snapshot)
    if best is None:
        raise ValueError(f"rank {rank} runs no operation")
    return best
