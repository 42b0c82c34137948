"""Plans for distributed training: per-rank budgets under FSDP2 and tensor parallelism, per-stage plans for pipelines.

Example:
    >>> from scheduler.distributed import Layout, solve_layout
    >>> layout = Layout(shard=8, tp=2, pp=4, microbatches=8, schedule="1f1b")
    >>> plans = solve_layout(graph, "80GiB", layout, optimizer="adamw")
    >>> [s.plan.modules for s in plans.stages]         # each applies onto its stage's module

Nothing here imports torch.

May import ``graphs``, ``solvers`` and ``scheduler.sizing``'s budgets and memory; ``fit`` (a layout's
fit) also the size search (``scheduler.sizing.search``).
"""

from __future__ import annotations

from .layout import SCHEDULES, SINGLE, Layout, LayoutError
from .plans import LayoutPlan, StagePlan, solve_layout, stage_graphs
from .ranks import RankState, rank_graph, rank_state
from .schedule import in_flight, rank_order

__all__ = ["Layout", "LayoutError", "SCHEDULES", "SINGLE", "LayoutPlan", "StagePlan", "solve_layout", "stage_graphs",
           "RankState", "rank_graph", "rank_state", "in_flight", "rank_order"]
