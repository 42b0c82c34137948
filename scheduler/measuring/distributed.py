"""Real distributed steps on CPU processes (gloo): each rank's allocator peak and the gradients.

NOTE [ Measuring a rank ]
    Each rank runs one warm-up step (FSDP2's lazy initialisation, the
    pipeline's shape inference and receive buffers), clears its gradients,
    and runs the measured step under the profiler (``profile_step``). Its peak
    is what was alive before the step (its parameter shards, its inputs, and
    the receive buffers ``torch.distributed.pipelining``'s ``PipelineStage``
    keeps, one per micro-batch, for the activations it receives and the
    gradients it is sent back) plus the highest running sum of the
    allocator's events during the step. The gradients of the measured step
    (whole, ``full_tensor`` of FSDP's shards; per stage for a pipeline) are
    kept from the first group of ranks, to be compared with one process
    stepping the whole batch. The last pipeline stage steps with
    ``return_outputs=False``, so the schedule keeps no micro-batch's output
    past its backward.

    One spawn of ``world`` processes runs every run asked for, one after the
    other: a run over fewer ranks (FSDP over 2 of 4, a 2-stage pipeline)
    runs in every group of that many consecutive ranks at once, each group
    stepping the whole batch, so starting processes (most of a run's time on
    a small model) is paid once.

A run names its model by an example spec, ``"package.module:function"``: a
function returning the model (seeded: every call builds the same weights),
with the attribute ``batch() -> (inputs, targets)`` for the whole batch; the
model is a ``scheduler.models.staged.StagedLM`` (its ``forward(x, targets)``
returns the loss). Workers resolve it by import, so it must live in an
importable module.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from solvers import Plan

from ..models.staged import lm_loss, stage_module
from .profiler import profile_step
from .storages import live_bytes_of

__all__ = ["FsdpRun", "PipelineRun", "RankMeasurement", "RunResult", "run_distributed", "single_process_grads"]


@dataclass(frozen=True)
class FsdpRun:
    """An FSDP2 step over ``shard`` ranks: ``fully_shard`` on each of ``units``, then on the model.

    Attributes:
        shard: ranks per group.
        units: module paths wrapped with their own ``fully_shard``.
        plan: applied onto the model before ``fully_shard`` (None: none).
    """

    shard: int
    units: tuple[str, ...] = ()
    plan: Plan | None = None


@dataclass(frozen=True)
class PipelineRun:
    """A pipelined step over ``len(starts) + 1`` ranks, one stage each, cut where ``starts`` begin.

    Attributes:
        starts: the layers where stages 1, 2, ... begin (``layers.2``...).
        schedule: ``gpipe`` or ``1f1b``.
        microbatches: micro-batches the batch is split into.
        plans: each stage's plan (empty: none).
    """

    starts: tuple[str, ...]
    schedule: str
    microbatches: int
    plans: tuple[Plan | None, ...] = ()

    @property
    def shard(self) -> int:
        return len(self.starts) + 1


@dataclass(frozen=True)
class RankMeasurement:
    """One rank's measured step (NOTE [ Measuring a rank ]).

    Attributes:
        rank: the rank within its group (the stage, for a pipeline).
        peak_bytes: ``baseline_bytes`` plus the allocator's highest running sum in the step.
        baseline_bytes: alive before the step (parameter shards, inputs, receive buffers).
        buffer_bytes: of those, the pipeline's receive buffers.
    """

    rank: int
    peak_bytes: int
    baseline_bytes: int
    buffer_bytes: int = 0


@dataclass(frozen=True)
class RunResult:
    """What one run measured: every rank of every group, and the first group's gradients by name."""

    run: FsdpRun | PipelineRun
    ranks: tuple[RankMeasurement, ...]
    grads: dict[str, torch.Tensor]

    def peak(self, rank: int) -> int:
        """The highest peak of the ranks at position ``rank`` of their group."""
        return max(r.peak_bytes for r in self.ranks if r.rank == rank)


def _resolve(spec: str) -> Callable[[], Any]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        if g is not None:
            out[name] = g.detach().clone()
    return out


def _groups(world: int, size: int) -> tuple[int, Any]:
    """Every rank creates every group of ``size`` consecutive ranks; returns (my group's index, my group)."""
    mine = None
    for g in range(world // size):
        group = dist.new_group(list(range(g * size, (g + 1) * size)))
        if g == dist.get_rank() // size:
            mine = group
    return dist.get_rank() // size, mine


def _fsdp(spec: str, run: FsdpRun, world: int) -> tuple[RankMeasurement, dict[str, torch.Tensor]]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    index, group = _groups(world, run.shard)
    mesh = DeviceMesh.from_group(group, "cpu")
    local = dist.get_rank() % run.shard
    model = _resolve(spec)()
    if run.plan is not None:
        from ..applying import apply  # here, after the model is built, as before: the ranks' measured peaks move with it

        apply(model, run.plan)
    for path in run.units:
        fully_shard(model.get_submodule(path), mesh=mesh)
    fully_shard(model, mesh=mesh)
    inputs, targets = _resolve(spec).batch()  # type: ignore[attr-defined]
    share = inputs.shape[0] // run.shard
    x, y = inputs[local * share:(local + 1) * share], targets[local * share:(local + 1) * share]

    def step() -> None:
        model(x, y).backward()

    step()
    for p in model.parameters():
        p.grad = None
    shards = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    trace = profile_step(step, baseline_bytes=live_bytes_of(shards + [x, y]))
    grads = _grads(model)  # every rank of the group takes part in full_tensor's all-gathers
    return RankMeasurement(local, trace.peak_bytes, trace.baseline_bytes), grads if index == 0 and local == 0 else {}


def _pipeline(spec: str, run: PipelineRun, world: int) -> tuple[RankMeasurement, dict[str, torch.Tensor]]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stages = run.shard
    index, group = _groups(world, stages)
    local = dist.get_rank() % stages
    model = _resolve(spec)()
    mod = stage_module(model, run.starts, local)
    del model
    if run.plans and run.plans[local] is not None:
        from ..applying import apply  # (as above)

        apply(mod, run.plans[local])
    stage = PipelineStage(mod, local, stages, torch.device("cpu"), group=group)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[run.schedule]
    sched = kind(stage, run.microbatches, loss_fn=lm_loss)
    inputs, targets = _resolve(spec).batch()  # type: ignore[attr-defined]
    first, last = local == 0, local == stages - 1

    def step() -> None:
        args = (inputs,) if first else ()
        extra = {"target": targets, "losses": []} if last else {}
        sched.step(*args, return_outputs=False, **extra)

    step()
    for p in mod.parameters():
        p.grad = None
    buffers = [info.buffer for infos in list(stage.args_recv_info.values()) + list(stage.grad_recv_info.values())
               for info in infos if getattr(info, "buffer", None) is not None]
    held = list(mod.parameters()) + ([inputs] if first else []) + ([targets] if last else [])
    trace = profile_step(step, baseline_bytes=live_bytes_of(held + buffers))
    measured = RankMeasurement(local, trace.peak_bytes, trace.baseline_bytes, live_bytes_of(buffers))
    return measured, _grads(mod) if index == 0 else {}


def _worker(rank: int, world: int, init: str, spec: str, runs: Sequence[FsdpRun | PipelineRun], out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for k, run in enumerate(runs):
            measure = _fsdp if isinstance(run, FsdpRun) else _pipeline
            measured, grads = measure(spec, run, world)
            with open(os.path.join(out_dir, f"run{k}.rank{rank}.json"), "w") as f:
                json.dump(measured.__dict__, f)
            if grads:
                torch.save(grads, os.path.join(out_dir, f"run{k}.grads{rank}.pt"))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def run_distributed(spec: str, world: int, runs: Sequence[FsdpRun | PipelineRun]) -> list[RunResult]:
    """Run each of ``runs`` on ``world`` gloo processes started once (NOTE [ Measuring a rank ]).

    Raises:
        ValueError: a run's group size does not divide ``world``.
    """
    for run in runs:
        if world % run.shard:
            raise ValueError(f"a run over {run.shard} ranks does not divide {world} processes")
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.spawn(_worker, args=(world, init, spec, list(runs), tmp), nprocs=world, join=True)
        results = []
        for k, run in enumerate(runs):
            ranks = []
            grads: dict[str, torch.Tensor] = {}
            for r in range(world):
                with open(os.path.join(tmp, f"run{k}.rank{r}.json")) as f:
                    ranks.append(RankMeasurement(**json.load(f)))
                path = os.path.join(tmp, f"run{k}.grads{r}.pt")
                if os.path.exists(path):
                    grads.update(torch.load(path))
            results.append(RunResult(run, tuple(ranks), grads))
    return results


def single_process_grads(spec: str) -> dict[str, torch.Tensor]:
    """The gradients of one process stepping ``spec``'s whole batch (the reference for every run)."""
    model = _resolve(spec)()
    inputs, targets = _resolve(spec).batch()  # type: ignore[attr-defined]
    model(inputs, targets).backward()
    return _grads(model)
