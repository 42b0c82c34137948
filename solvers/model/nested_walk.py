"""``simulate``'s walk of a plan with inner regions (NOTE [ Nested regions ] in ``solvers.model.nested``)."""

from __future__ import annotations

import bisect

from graphs import SCALARS_META, Graph

from .meter import RECOMPUTE
from .plan import Plan
from .walk import Walk
from .terms import region_rng_bytes

__all__ = ["NestedWalk"]


class NestedWalk(Walk):
    """NOTE [ Execution model ] with NOTE [ Nested regions ]: one-level regions run the inherited steps."""

    def __init__(self, graph: Graph, plan: Plan, record: bool) -> None:
        super().__init__(graph, plan, record)
        self.inner = plan.inner
        starts = [a for a, _ in self.regions]
        self.inner_of: dict[int, list[tuple[int, int]]] = {}  # outer region index -> its inner regions
        for a, b in self.inner:
            self.inner_of.setdefault(bisect.bisect_right(starts, a) - 1, []).append((a, b))
        # a stochastic inner region's generator state, stored at its first forward step (NOTE [ Nested regions ])
        self.inner_rng = {r: rng for r, rng in zip(self.inner, region_rng_bytes(graph, self.inner)) if rng}
        rng_fwd = dict(self.rng_at)
        for (a, _), rng in self.inner_rng.items():
            rng_fwd[a] = rng_fwd.get(a, 0) + rng
        self.rng_fwd = rng_fwd
        # the Python scalars each node's autograd node saves unpacked (NOTE [ Nested regions ]: the outer's recompute)
        scalars = graph.meta.get(SCALARS_META) or {}
        self.scalars = [int(scalars.get(nd.name, 0) or 0) for nd in graph.nodes] if scalars else None

    # ------------------------------------------------------------ backward
    def backward(self) -> None:
        region_last, region_first = self._start_backward()
        regions = self.regions
        inner_last = {b: (a, b) for a, b in self.inner}
        inner_first = {a: (a, b) for a, b in self.inner}
        self.inner_holds: dict[tuple[int, int], list[int]] = {}
        self.inner_rng_held: dict[tuple[int, int], int] = {}  # the recompute's copy of an inner region's state
        for i in range(len(self.nodes) - 1, -1, -1):
            if i in region_last:
                r = region_last[i]
                if r in self.inner_of:
                    self._recompute_outer(*regions[r], self.inner_of[r])
                else:
                    self._recompute(*regions[r])
            if i in inner_last:
                inner = inner_last[i]
                outer_rng, self.rng_at = self.rng_at, {inner[0]: self.inner_rng.get(inner, 0)}
                copies = self.inner_holds.pop(inner, [])
                self._hold_saved_inputs(*inner, copies)
                self.rec_scalars = self.scalars  # its recomputed nodes' Python scalars too (NOTE [ Nested regions ])
                self._recompute(*inner)  # a one-level recompute, under its own fork_rng copy
                self.rec_scalars = None
                self.rng_at = outer_rng
                for j in copies:  # the outer's copies of its inputs: released with the args
                    self._release_recomputed(j)
                self.act -= self.inner_rng_held.pop(inner, 0)  # and the state its checkpoint stored in the outer's
            if self.rg[i]:
                self._node_backward(i)
            if i in inner_first:
                self.act -= self.inner_rng.get(inner_first[i], 0)
            if i in region_first:
                self.act -= self.rng_at.get(i, 0)
                for j in self.region_holds[region_first[i]]:
                    self._release(j)

    def _hold_saved_inputs(self, x: int, y: int, copies: list[int]) -> None:
        """An inner region's nodes that save one of its inputs the outer's recompute made keep that copy
        until their backward (NOTE [ Nested regions ]: the inner recompute's saved tensors)."""
        if not copies:
            return
        made = set(copies)
        rec_hold, saves = self.rec_hold, self.terms.saves
        for k in range(x, y + 1):
            for j in saves[k]:
                if j in made:
                    rec_hold[j] += 1
                    self.rec_node_holds[k].append(j)

    def _release_recomputed(self, j: int) -> None:
        self.rec_hold[j] -= 1
        if self.rec_hold[j] == 0:
            self._drop_recomputed(j)

    def _recompute_outer(self, a: int, b: int, inner: list[tuple[int, int]]) -> None:
        """Outer region ``[a, b]`` recomputed with ``inner`` checkpointed (NOTE [ Nested regions ])."""
        nodes, preds, saves, caller = self.nodes, self.graph.preds, self.terms.saves, self.caller
        rec_hold, rg = self.rec_hold, self.rg
        step = self.meter.step
        in_inner = [False] * (b - a + 1)
        for x, y in inner:
            for k in range(x, y + 1):
                in_inner[k - a] = True
        last_x = inner[-1][0]
        tail_saves = any(rg[k] and (saves[k] or nodes[k].saved_bytes) for k in range(inner[-1][1] + 1, b + 1))
        stop = b + 1 if tail_saves else last_x  # early stop (NOTE [ Nested regions ])
        rem = [0] * (b - a + 1)
        for k in range(a, stop):
            for j in dict.fromkeys(preds[k]):
                if a <= j < stop:
                    rem[j - a] += 1
            if not in_inner[k - a]:
                for j in saves[k]:
                    if a <= j <= b:
                        rec_hold[j] += 1
                        self.rec_node_holds[k].append(j)
        for x, y in inner:
            if x > stop:
                break
            mine: list[int] = []
            for k in range(x, y + 1):
                for j in dict.fromkeys(preds[k]):
                    if a <= j < x and j not in mine:  # made by this recompute (earlier ones: the outer's inputs)
                        mine.append(j)
                        rec_hold[j] += 1
            self.inner_holds[(x, y)] = mine
        # read after the early stop too: a local of the call's Python until the stop unwinds it (holds included)
        later = {j for k in range(stop, b + 1) for j in preds[k] if a <= j < stop}
        outs = [caller[k] or self.terms.last_reader[k] > b or k in later for k in range(a, b + 1)]
        live = [False] * (b - a + 1)
        snapshot = sum(nodes[k].state_bytes for k in range(a, b + 1))
        snapshot += self.span_extra.get((a, b), 0)
        snapshot += self.rng_at.get(a, 0)
        self.act += snapshot
        inner_start = {x: (x, y) for x, y in inner}
        scalars = self.scalars
        for k in range(a, stop):
            nd = nodes[k]
            if scalars is not None and scalars[k]:  # held by this recompute's autograd nodes to its end
                snapshot += scalars[k]
                self.act += scalars[k]
            if k in inner_start:  # the inner checkpoint stores the generator state again, for its own recompute
                rng = self.inner_rng.get(inner_start[k], 0)
                self.inner_rng_held[inner_start[k]] = rng
                self.act += rng
            self.recompute_flops += nd.fwd_flops
            self.recompute_cost += self.costs[k]
            self.act += self.out_b[k] + nd.saved_bytes
            live[k - a] = True
            step(RECOMPUTE, k, self.act, self.agrad, self.pgrad, nd.workspace_bytes)
            if in_inner[k - a] or not rg[k]:
                self.act -= nd.saved_bytes
            for j in dict.fromkeys(preds[k]):
                if a <= j < stop:
                    rem[j - a] -= 1
                    if rem[j - a] == 0 and rec_hold[j] == 0 and not outs[j - a] and live[j - a]:
                        live[j - a] = False
                        self._drop_recomputed(j)
            if rem[k - a] == 0 and rec_hold[k] == 0 and not outs[k - a]:
                live[k - a] = False
                self._drop_recomputed(k)
        if stop == last_x and last_x in inner_start:  # stopped as it stored the last inner region's inputs
            rng = self.inner_rng.get(inner_start[last_x], 0)
            self.inner_rng_held[inner_start[last_x]] = rng
            self.act += rng
        for k in range(a, stop):
            if live[k - a] and rec_hold[k] == 0:
                self._drop_recomputed(k)
        self.act -= snapshot
