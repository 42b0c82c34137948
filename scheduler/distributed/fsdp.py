"""What one FSDP2 rank holds of a graph: sharded state, and the layers it all-gathers as the step runs.

NOTE [ FSDP2's buffers ]
    ``fully_shard`` keeps each parameter, its gradient and its optimizer
    state as a ``1/shard`` slice on every rank, and gathers a unit's (a
    module wrapped with its own ``fully_shard``) whole parameters just before
    that unit runs. Measured on gloo (2 and 4 CPU processes, one unit per
    block and the model as root; allocator events around FSDP2's
    ``record_function`` labels, torch 2.13):

    * the root's parameters are gathered at the start and kept whole to the
      end of the backward (the root is not resharded after its forward), and
      its gradients stay whole until the root's reduce-scatter at the end;
    * a unit's all-gather allocates its output and, beside it, the unit's
      whole parameters (the copy-out); the output is released after the
      copy, but the collective may still hold it while the next all-gather
      runs: which buffers meet depends on the processes' timing (on 4
      processes one rank of four measured a unit's bytes above the others,
      2,317,960 bytes against 2,118,024 at the same step, from one run to the
      next), so the bound counts every buffer that can be alive;
    * after a unit's forward its whole parameters are freed
      (``reshard_after_forward=True``, the default);
    * in the backward FSDP2 gathers the next unit (in backward order) ahead
      (twice its bytes while the all-gather runs); a unit holds its whole
      gradients until its reduce-scatter, which copies them into a send
      buffer that lives until that reduce-scatter is waited for, in the next
      unit's post-backward;
    * the root's own backward (the head and the loss, before any unit's)
      starts the last unit's all-gather: two units' bytes.

    So the per-rank graph charges each node, as workspace held while it runs
    (forward, recompute and backward), what FSDP may hold beside it: the
    root's whole parameters always; in unit ``k``, the larger of its forward
    (its parameters and all-gather output, unit ``k - 1``'s output still
    held, and the units prefetched ahead, ``forward_prefetch``: 1 for CUDA's
    side stream) and its backward (its parameters and gradients, unit
    ``k - 1`` gathered twice, unit ``k + 1``'s send buffer); in the root,
    two of the larger end unit. Parameters are ``1/shard`` and always live;
    gradients ``1/shard`` from their node's backward on, the root's whole.
    It is an upper bound at every step, charged over the whole unit.

    On gloo, FSDP2's release of a buffer is not its free: each of the
    process group's worker threads (two by default) keeps the last
    collective it ran, with its buffers, until the thread is scheduled again
    to take the next one. On an idle machine that is at once; on a busy one
    it can be much later: with the 4 processes on one core, one step of four
    held the root's all-gather output (from the start of the forward) and
    ``layers.3``'s (from the start of the backward) while ``layers.2`` was
    gathered, 339,712 bytes above the same step unloaded (199,936 + 139,776:
    both units' whole bytes), and 57,792 over the prediction; an earlier
    test run on a loaded machine was 68,608 over. So a layout's
    ``collective_threads`` (gloo: 2; NCCL, whose buffers FSDP2 frees on its
    streams: 0, the default) charges every node that many largest
    collective buffers of the rank (a unit's or the root's whole parameters:
    an all-gather's output, a reduce-scatter's input) beside what FSDP2
    holds: whichever of them the threads still hold, never more. Not
    modelled: ``reshard_after_forward=False`` (the unit stays whole from its
    forward to its backward), gradient accumulation without reduce-scatter
    (``set_requires_gradient_sync(False)``), DDP's gradient buckets.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from graphs import Graph

from .layout import LayoutError
from .tensor_parallel import split_bytes

__all__ = ["FsdpUnit", "repeated_blocks", "fsdp_units", "lingering_bytes", "shard_fsdp"]

_BLOCK = re.compile(r"^(.*)\.(\d+)$")


@dataclass(frozen=True)
class FsdpUnit:
    """One module wrapped with ``fully_shard`` (the root: every parameter of no other unit).

    Attributes:
        module: its path (``""`` for the root).
        param_bytes: its whole parameters on this rank (after tensor parallelism).
        first: position of its first node (-1 for the root).
    """

    module: str
    param_bytes: int
    first: int = -1


def repeated_blocks(graph: Graph) -> tuple[str, ...]:
    """The module paths of the graph's repeated blocks: the spans named ``PREFIX.<i>`` whose
    ``PREFIX`` has the most such calls (2 or more), in order; empty when there is none."""
    prefixes = Counter()
    for sp in graph.spans:
        m = _BLOCK.match(sp.module)
        if m:
            prefixes[m.group(1)] += 1
    if not prefixes:
        return ()
    prefix, count = max(prefixes.items(), key=lambda kv: (kv[1], -len(kv[0])))
    if count < 2:
        return ()
    blocks = sorted((sp.first, sp.module) for sp in graph.spans if _BLOCK.match(sp.module)
                    and _BLOCK.match(sp.module).group(1) == prefix)
    return tuple(m for _, m in blocks)


def _inside(path: str, module: str) -> bool:
    return path == module or path.startswith(module + ".")


def fsdp_units(graph: Graph, modules: Sequence[str] = ()) -> tuple[list[int], tuple[FsdpUnit, ...], FsdpUnit]:
    """``(unit of each node, the units in forward order, the root)`` for ``fully_shard`` on ``modules``
    (default: the repeated blocks) and on the model.

    Raises:
        LayoutError: a named unit is no submodule call of the graph.
    """
    names = tuple(modules) or repeated_blocks(graph)
    known = {sp.module for sp in graph.spans}
    for name in names:
        if name not in known:
            raise LayoutError(f"fsdp unit {name!r} is no submodule call of the graph; name module paths the graph's "
                              "spans list (ckpt solve prints them), e.g. model.layers.0")
    unit_of = []
    for nd in graph.nodes:
        inside = [k for k, u in enumerate(names) if _inside(nd.module, u)]
        unit_of.append(max(inside, key=lambda k: len(names[k])) if inside else -1)
    sizes = [0] * len(names)
    first = [len(graph.nodes)] * len(names)
    for i, (nd, u) in enumerate(zip(graph.nodes, unit_of)):
        if u >= 0:
            sizes[u] += nd.param_bytes
            first[u] = min(first[u], i)
    units = [FsdpUnit(names[k], sizes[k], first[k]) for k in range(len(names)) if first[k] < len(graph.nodes)]
    order = {u.module: k for k, u in enumerate(sorted(units, key=lambda u: u.first))}
    unit_of = [order[names[u]] if u >= 0 and names[u] in order else -1 for u in unit_of]
    units = sorted(units, key=lambda u: u.first)
    root = FsdpUnit("", graph.param_bytes - sum(u.param_bytes for u in units))
    return unit_of, tuple(units), root


def _unit_extras(units: Sequence[FsdpUnit], root: FsdpUnit, forward_prefetch: int) -> tuple[list[int], int]:
    """Per unit, and for the root's nodes, the bytes FSDP holds beside a node (NOTE [ FSDP2's buffers ])."""
    size = [u.param_bytes for u in units]
    extras = []
    for k, own in enumerate(size):
        before = size[k - 1] if k > 0 else 0  # the unit before in the forward, after in the backward
        after = size[k + 1] if k + 1 < len(size) else 0
        ahead = sum(size[k + 1:k + 1 + forward_prefetch])
        forward = 2 * own + before + ahead  # params, its all-gather's output, the last one's, the prefetched
        backward = 2 * own + 2 * before + after  # params and grads, the next gather (twice), the last send buffer
        extras.append(root.param_bytes + max(forward, backward))
    ends = max(size[0], size[-1]) if size else 0
    return extras, root.param_bytes + 2 * ends


def lingering_bytes(units: Sequence[FsdpUnit], root: FsdpUnit, threads: int) -> int:
    """The most the backend's ``threads`` worker threads can hold of finished collectives: the ``threads``
    largest collective buffers (each unit's and the root's whole parameters), NOTE [ FSDP2's buffers ]."""
    sizes = sorted([u.param_bytes for u in units] + [root.param_bytes], reverse=True)
    return sum(sizes[:threads]) if threads > 0 else 0


def shard_fsdp(graph: Graph, shard: int, *, units: Sequence[str] = (), forward_prefetch: int = 1,
               collective_threads: int = 0) -> Graph:
    """The graph one of ``shard`` FSDP2 ranks runs (NOTE [ FSDP2's buffers ]); ``graph`` itself for ``shard == 1``.
    ``collective_threads``: the backend's worker threads that may keep a finished collective's buffers."""
    if shard == 1:
        return graph
    unit_of, unit_list, root = fsdp_units(graph, units)
    extras, root_extra = _unit_extras(unit_list, root, forward_prefetch)
    held = lingering_bytes(unit_list, root, collective_threads)
    extras, root_extra = [e + held for e in extras], root_extra + held
    unattributed = max(0, graph.param_bytes - sum(nd.param_bytes for nd in graph.nodes))
    nodes = []
    last = len(graph.nodes) - 1
    for i, (nd, u) in enumerate(zip(graph.nodes, unit_of)):
        grads = split_bytes(nd.param_bytes, shard) if u >= 0 else nd.param_bytes  # the root's stay whole
        if i == last:
            grads += unattributed  # created at the start of the backward, like the root's
        extra = extras[u] if u >= 0 else root_extra
        nodes.append(dataclasses.replace(nd, param_bytes=grads, workspace_bytes=nd.workspace_bytes + extra))
    return graph.with_nodes(nodes, param_bytes=split_bytes(graph.param_bytes, shard))
