"""How long the user's Python keeps each tensor in the forward: a node that reads it until then.

NOTE [ Forward holds ]
    The graph frees a tensor after its last reader; eager frees it when
    Python lets go of it. A local, an argument or a container keeps a tensor
    referenced until the function returns or the name is rebound:
    torchvision's ViT encoder keeps ``input`` (patches plus position
    embedding) through every layer to its final norm, SegFormer its encoder's
    hidden states to the end of its forward, every transformer block its
    residual to the add after its MLP. When autograd saves the tensor anyway
    nothing changes; when nothing saves it (its readers lie in regions, or do
    not save their inputs) the forward holds it longer than ``simulate`` did:
    plans whose peak lies in the forward measured up to 29,648 B (a small
    torchvision ViT) and 26,612 B (SegFormer) over their prediction, 15 of 250
    plans of a third-party sweep.

    The tracer's eager run (``eager_lifetimes.measure_call_extras``) records
    every op it dispatches and, per storage, the op that made it and the last
    op before Python let it go (autograd keeps none of what it saves in that
    run: only Python's references count). :func:`eager_holds` lines those ops
    up with the traced records' ``dispatch`` (the same ATen calls in the same
    order, but for a few the fx graph does not run, such as ``detach``) and
    names, per storage, the record that made it and the one after which it
    died. :func:`add_forward_holds` then puts, after each node ``u`` where
    tensors die later than their last reader, one node ``<u>.holds`` that
    reads them: no bytes, no cost, no gradient, saved by nobody. A reader is
    what every solver already understands, so no solver changes: in the
    forward each such tensor lives to ``u``, as in eager; a region's
    recompute re-runs the hold when the region contains it (the call that
    holds the tensor runs again) and reads the tensor from outside otherwise
    (it is then the region's input or output, held anyway). The node goes
    after ``u``, outside every span that ends at ``u`` and inside those that
    go on, so a span keeps the calls it had. A tensor Python holds to the
    step's last node (the loss computed inside the model's forward) is held
    by a node just before the loss (the graph ends at its loss) that carries
    the loss's forward step as its workspace (its output, saved buffers and
    forward workspace; a node without gradient has no backward step, so the
    figure counts in the forward only): SegFormer's step peaks in its loss's forward
    with its encoder's hidden states still referenced, and measured 16,372 B
    over store-all's prediction until then (8 B under with it).

    The storages placed so are left out of the spans' ``extra_bytes`` (NOTE
    [ Eager lifetimes in a recompute ]): the graph has their lifetimes now.
    Where no Python runs, nothing holds: ``Graph.unaligned()`` (the graph-level
    applier runs the fx graph) and a pipeline stage's graph (for what the stage
    receives, which its buffers hold) drop the holds' reads. A tensor read by
    holds alone stays what nobody consumes (``solvers.model.terms``: held by the
    caller to the step's end, as before). The chain solvers cut and plan
    without the holds and check their answers with them (NOTE [ Chains and
    forward holds ] in ``solvers.model.stages``). A model whose eager forward
    cannot run on ``meta`` (transformers' masks read a value) gets no holds there.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from graphs import HOLDS_OP, Node, Span

from .records import OpRecord

__all__ = ["eager_holds", "add_forward_holds", "HOLDS_SUFFIX"]

#: Added to a node's name to name the node that holds tensors past it.
HOLDS_SUFFIX = ".holds"

#: How many ops (of both runs together) the alignment skips at most to find the two runs agreeing again.
_LOOKAHEAD = 48
#: How many ops in a row must agree for the alignment to resume there.
_AGREE = 6


def align(eager: Sequence[str], traced: Sequence[str]) -> list[int]:
    """For each op of ``eager``, the position of the same op in ``traced``, or -1.

    The two runs are the same calls in the same order but for a few ops that one of them runs and the other
    does not (``detach``; a kernel the target runs as one op and this device as several), so the walk goes on
    together and, where they differ, resumes at the nearest point (fewest ops skipped, of either run, up to
    ``_LOOKAHEAD``) where the next ``_AGREE`` ops agree; where none does, the rest stays unmatched. Linear in
    the runs' length."""
    out = [-1] * len(eager)
    i = j = 0
    n, m = len(eager), len(traced)

    def agree(a: int, b: int) -> bool:
        k = min(_AGREE, n - a, m - b)
        return k > 0 and all(eager[a + t] == traced[b + t] for t in range(k))

    while i < n and j < m:
        if eager[i] == traced[j]:
            out[i] = j
            i += 1
            j += 1
            continue
        for skip in range(1, _LOOKAHEAD + 1):
            found = next(((i + d, j + skip - d) for d in range(skip + 1) if agree(i + d, j + skip - d)), None)
            if found is not None:
                i, j = found
                break
        else:
            break
    return out


def eager_holds(records: Sequence[OpRecord], ops: Sequence[str], lifetimes: Sequence[tuple[int, int | None]]
                ) -> tuple[list[tuple[str, str]], set[int]]:
    """``(holds, placed)``: per storage of the eager run whose making and death both line up with a record,
    ``(record that made it, record after which it died)`` by fx name, when they differ; and the positions in
    ``lifetimes`` of every storage lined up so (NOTE [ Forward holds ]).

    ``ops`` are the eager run's overloads (op ``i`` at ``ops[i - 1]``); ``lifetimes`` per storage ``(made,
    freed)`` in those op numbers, ``freed`` the last op before it died (``None``: alive at the end)."""
    traced: list[str] = []
    owner: list[int] = []
    for r, rec in enumerate(records):
        traced.extend(rec.dispatch)
        owner.extend([r] * len(rec.dispatch))
    at = align(ops, traced)
    # eager op number -> record, the ops that line up; an op that does not is the nearest one's before it
    record_of: list[int] = [-1] * (len(ops) + 1)
    last = -1
    for i, j in enumerate(at):
        if j >= 0:
            last = owner[j]
        record_of[i + 1] = last
    made_at = [owner[j] if j >= 0 else -1 for j in at]
    holds: dict[tuple[str, str], None] = {}
    placed: set[int] = set()
    for s, (made, freed) in enumerate(lifetimes):
        if freed is None or not 1 <= made <= len(ops) or not 1 <= freed <= len(ops):
            continue
        a, b = made_at[made - 1], record_of[freed]
        if a < 0 or b < 0:
            continue
        placed.add(s)
        if b > a:
            holds[(records[a].name, records[b].name)] = None
    return list(holds), placed


def add_forward_holds(nodes: Sequence[Node], spans: Sequence[Span], holds: Sequence[tuple[str, str]],
                      loss_workspace: int = 0) -> tuple[list[Node], list[Span]]:
    """``nodes`` and ``spans`` with a ``<u>.holds`` node after each node ``u`` at which tensors die later than their
    last reader, reading them (NOTE [ Forward holds ]). ``holds`` are ``(maker, end)`` fx names: a node's own
    name or one of its members. ``loss_workspace``: the last node's forward workspace (its ``workspace_bytes``
    is the larger of its forward's and its backward's)."""
    n = len(nodes)
    pos: dict[str, int] = {}
    for p, nd in enumerate(nodes):
        for name in (nd.members or (nd.name,)):
            pos.setdefault(name, p)
        pos.setdefault(nd.name, p)
    last_read = list(range(n))
    for p, nd in enumerate(nodes):
        for x in nd.inputs:
            q = pos.get(x)
            if q is not None:
                last_read[q] = max(last_read[q], p)
    ends: dict[int, list[int]] = {}  # u -> producers held past their last reader to u
    for maker, end in holds:
        a, u = pos.get(maker), pos.get(end)
        if a is None or u is None:
            continue
        u = min(u, n - 2)  # the graph ends at its loss (NOTE [ Forward holds ])
        if u >= last_read[a] and u == n - 2 and pos.get(end) == n - 1 and nodes[a].out_bytes > 0:
            ends.setdefault(u, [])  # held through the loss: by the node before it, with the loss's step
            if a not in ends[u]:
                ends[u].append(a)
        elif u > last_read[a] and nodes[a].out_bytes > 0:
            ends.setdefault(u, [])
            if a not in ends[u]:
                ends[u].append(a)
    if not ends:
        return list(nodes), list(spans)
    taken = {nd.name for nd in nodes}
    out: list[Node] = []
    new_pos = [0] * n
    for p, nd in enumerate(nodes):
        new_pos[p] = len(out)
        out.append(nd)
        if p in ends:
            name = f"{nd.name}{HOLDS_SUFFIX}"
            while name in taken:
                name += "+"
            taken.add(name)
            after = nodes[p + 1].module if p + 1 < n else ""
            loss = nodes[-1] if p == n - 2 else None  # its forward step, with the held tensors still there
            out.append(Node(name=name, inputs=tuple(nodes[a].name for a in sorted(ends[p])), op=HOLDS_OP,
                            module=_common(nd.module, after), requires_grad=False, saves_inputs=(),
                            workspace_bytes=loss.out_bytes + loss.saved_bytes + loss_workspace if loss else 0))
    moved = [dataclasses.replace(sp, first=new_pos[sp.first], last=new_pos[sp.last]) for sp in spans]
    return out, moved


def _common(a: str, b: str) -> str:
    """The longest common dotted prefix of two module paths."""
    pa, pb = a.split("."), b.split(".")
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
        k += 1
    return ".".join(pa[:k])
