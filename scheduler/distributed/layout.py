"""The parallel layout of a training step: how one step is split across ranks.

A :class:`Layout` names the degrees people set in torchtitan, Megatron or
their own FSDP2 script: the FSDP (or HSDP) shard degree, the tensor-parallel
degree with or without sequence parallelism, the pipeline stages, the
micro-batches and the pipeline schedule. It decides what each rank holds
(NOTE [ What a rank holds ] in ``scheduler.distributed.ranks``) and, for a
pipeline, how many micro-batches each stage holds in flight
(NOTE [ Micro-batches in flight ] in ``scheduler.distributed.schedule``).

The graph a layout plans is the one a rank runs per micro-batch: trace the
model at the micro-batch size one rank sees (the global batch divided by
the data-parallel degree ``shard * replicate`` and by ``microbatches``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphs import CkptError

__all__ = ["Layout", "LayoutError", "SCHEDULES", "SINGLE"]

#: Pipeline schedules, as torch.distributed.pipelining names them: ScheduleGPipe, Schedule1F1B,
#: ScheduleInterleaved1F1B.
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")

_SCHEDULE_ALIASES = {"interleaved": "interleaved-1f1b", "interleaved1f1b": "interleaved-1f1b"}


class LayoutError(CkptError, ValueError):
    """A parallel layout that cannot run (the message says which degree and what to do)."""


@dataclass(frozen=True)
class Layout:
    """How one training step is split across ranks.

    Attributes:
        shard: FSDP shard degree: parameters, gradients and optimizer state
            are split across this many ranks (``fully_shard``); 1 is no FSDP.
        replicate: HSDP replicate degree: copies of each shard group
            (``fully_shard(mesh=(replicate, shard))``). What a rank holds does
            not depend on it; it only multiplies the ranks.
        tp: tensor-parallel degree (``parallelize_module`` with column- and
            row-wise linears): attention heads and the MLP's hidden width are
            split across ``tp`` ranks.
        sequence_parallel: with ``tp > 1``, the norms, dropouts and the
            residual stream between the parallel linears are split along the
            sequence too (``SequenceParallel``).
        pp: pipeline ranks. Each holds ``virtual_stages`` stages.
        microbatches: micro-batches per step (gradient accumulation without a
            pipeline; the pipeline's micro-batches with one).
        schedule: ``gpipe``, ``1f1b`` or ``interleaved-1f1b``.
        virtual_stages: stages per pipeline rank (``interleaved-1f1b`` only,
            2 or more there; rank ``r`` holds stages ``r, r + pp, ...``).
        stage_starts: module paths where stages 1, 2, ... begin (as
            ``torch.distributed.pipelining``'s ``SplitPoint.BEGINNING``);
            empty: the stages are balanced by us over the graph's repeated
            blocks (NOTE [ Balanced stages ] in ``scheduler.distributed.stages``).
        fsdp_units: module paths wrapped with their own ``fully_shard``
            (each all-gathered on its own); empty: every repeated block
            (``model.layers.0``, ...), the rest being the root's.
        forward_prefetch: FSDP units all-gathered ahead of the one running in
            the forward (1 covers CUDA's implicit prefetch on a side stream;
            0 on a CPU, where gloo gathers in order).
        collective_threads: the collective backend's worker threads that may keep a finished collective's
            buffers alive after FSDP2 released them (NOTE [ FSDP2's buffers ]): gloo's two (its default)
            on CPU processes; 0 for NCCL, whose buffers FSDP2 frees on its streams.
    """

    shard: int = 1
    replicate: int = 1
    tp: int = 1
    sequence_parallel: bool = False
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    stage_starts: tuple[str, ...] = ()
    fsdp_units: tuple[str, ...] = ()
    forward_prefetch: int = 1
    collective_threads: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", _schedule_name(self.schedule))
        object.__setattr__(self, "stage_starts", tuple(self.stage_starts))
        object.__setattr__(self, "fsdp_units", tuple(self.fsdp_units))
        for name in ("shard", "replicate", "tp", "pp", "microbatches", "virtual_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LayoutError(f"layout: {name} must be a whole number of at least 1, got {value!r}")
        for name in ("forward_prefetch", "collective_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LayoutError(f"layout: {name} must be a whole number of 0 or more, got {value!r}")
        if self.fsdp_units and self.shard == 1:
            raise LayoutError(f"layout: --fsdp-units ({', '.join(self.fsdp_units)}) names the modules FSDP2 shards "
                              "on their own, but nothing is sharded: add --fsdp N (2 or more)")
        if self.sequence_parallel and self.tp == 1:
            raise LayoutError("layout: sequence parallelism splits the sequence across the tensor-parallel ranks; "
                              "it needs tp > 1 (--tp 2 or more)")
        if self.schedule == "interleaved-1f1b":
            if self.virtual_stages < 2:
                raise LayoutError("layout: interleaved-1f1b runs 2 or more stages per pipeline rank; set "
                                  "virtual_stages (--virtual-stages) to 2 or more, or use the 1f1b schedule")
            rounds = max(1, self.microbatches // self.pp)
            if self.microbatches % rounds:
                raise LayoutError(f"layout: interleaved-1f1b needs the micro-batches ({self.microbatches}) to be a "
                                  f"multiple of the rounds, max(1, microbatches // pp) = {rounds} (as torch's "
                                  "ScheduleInterleaved1F1B checks)")
        elif self.virtual_stages != 1:
            raise LayoutError(f"layout: {self.schedule} runs one stage per pipeline rank; virtual_stages="
                              f"{self.virtual_stages} needs the interleaved-1f1b schedule")
        if self.pp > 1 and self.schedule == "1f1b" and self.microbatches < self.pp:
            raise LayoutError(f"layout: 1f1b needs at least as many micro-batches as pipeline stages "
                              f"({self.microbatches} < {self.pp}), as torch's Schedule1F1B checks; raise "
                              f"--microbatches to {self.pp} or more, or use gpipe")
        if self.stage_starts and len(self.stage_starts) != self.stages - 1:
            raise LayoutError(f"layout: {self.stages} stages begin at {self.stages - 1} module paths after the first; "
                              f"got {len(self.stage_starts)} ({', '.join(self.stage_starts)})")
        if len(set(self.stage_starts)) != len(self.stage_starts):
            raise LayoutError(f"layout: a stage start is named twice ({', '.join(self.stage_starts)})")

    @property
    def stages(self) -> int:
        """Pipeline stages in all: ``pp * virtual_stages``."""
        return self.pp * self.virtual_stages

    @property
    def data_parallel(self) -> int:
        """Ranks that see different data: ``shard * replicate``."""
        return self.shard * self.replicate

    @property
    def world(self) -> int:
        """Ranks in all: ``shard * replicate * tp * pp``."""
        return self.shard * self.replicate * self.tp * self.pp

    @property
    def single(self) -> bool:
        """One rank holding everything, one micro-batch: what a plain ``solve`` plans."""
        return self.world == 1 and self.microbatches == 1

    def rank_of_stage(self, stage: int) -> int:
        """The pipeline rank that runs ``stage`` (interleaved: stage ``s`` on rank ``s % pp``)."""
        return stage % self.pp

    def describe(self) -> str:
        """``fsdp 8 x tp 2 (sp) x pp 4, 8 micro-batches, 1f1b``: the layout in one line."""
        parts = []
        if self.shard > 1 or self.replicate > 1:
            parts.append(f"hsdp {self.replicate}x{self.shard}" if self.replicate > 1 else f"fsdp {self.shard}")
        if self.tp > 1:
            parts.append(f"tp {self.tp}" + (" (sp)" if self.sequence_parallel else ""))
        if self.pp > 1:
            parts.append(f"pp {self.pp}" + (f" x {self.virtual_stages} virtual" if self.virtual_stages > 1 else ""))
        head = " x ".join(parts) or "one rank"
        tail = f", {self.microbatches} micro-batch{'es' if self.microbatches > 1 else ''}"
        if self.pp > 1:
            tail += f", {self.schedule}"
        return head + tail

    def to_dict(self) -> dict[str, Any]:
        """The layout as JSON scalars and lists (what a plan's findings and the benchmark tables record)."""
        return {"shard": self.shard, "replicate": self.replicate, "tp": self.tp,
                "sequence_parallel": self.sequence_parallel, "pp": self.pp, "microbatches": self.microbatches,
                "schedule": self.schedule, "virtual_stages": self.virtual_stages,
                "stage_starts": list(self.stage_starts), "fsdp_units": list(self.fsdp_units),
                "forward_prefetch": self.forward_prefetch, "collective_threads": self.collective_threads}


def _schedule_name(name: Any) -> str:
    key = str(name).strip().lower().replace("_", "-")
    key = _SCHEDULE_ALIASES.get(key.replace("-", ""), key) if key not in SCHEDULES else key
    if key not in SCHEDULES:
        raise LayoutError(f"layout: unknown pipeline schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return key


#: The layout of one rank holding everything (what ``solve`` plans without a layout).
SINGLE = Layout()
