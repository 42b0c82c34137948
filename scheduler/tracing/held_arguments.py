"""A call's tensor arguments that it never reads, held by checkpoint all the same: a node for them in the graph.

NOTE [ A call's held arguments ]
    Checkpoint keeps every tensor a region's call receives (the closure that
    recomputes it: NOTE [ Every tensor a region receives is a checkpoint
    input ] in ``scheduler.applying.regions``) from the region's forward to
    its backward, read or not. transformers' GPT-2 makes ``position_ids``
    (``arange(seq)``, int64) at the top of its forward and passes it to every
    block and attention call, which never read it (no rotary embedding). When
    the position embedding is trained, its backward saves the ids and they
    live to the end of the step anyway; when it is frozen (peft's LoRA leaves
    the base frozen) nothing saves them, the graph frees them after the
    embedding, and a region around a block held them: peft's LoRA GPT-2 with
    its head in 8 chunks measured 256 B (``[1, 32]`` int64) over its
    prediction, and every plan with a block region held them uncounted (the
    prediction hid it where it over-counts the loss's backward by more).

    NOTE [ A call's unread arguments ] (``scheduler.tracing.spans``) covers a
    view made right before the call for it alone; this covers the others. The
    tracer's eager run (``eager_lifetimes.measure_call_extras``) records, per
    submodule call, the storages of the tensors it receives (positional and
    keyword arguments, in containers too) that were made before the call, that
    no op of the call reads, and that autograd saves nowhere; their bytes are
    the call's *held* bytes. :func:`add_held_arguments` puts a node
    ``<call>.args`` of that many bytes just before the call's span (outside
    it), read by the span's first node and saved by nobody: no cost, no
    gradient. A region equal to the span then holds it to its backward, as
    checkpoint does, in ``simulate`` and every solver alike (they take a
    region's inputs from its nodes' inputs), and no solver changes; without
    a region it lives from just before the call to the call's first node,
    while the caller's frame holds the real tensor anyway. Spans starting at
    the same node nest: an enclosing call's node comes first and lies outside
    it, an inner call's lies inside the enclosing span. Upper bounds: several
    calls receiving one tensor each get a node (the run holds one storage),
    and a tensor saved only by an op after the call is not counted (its
    saver's backward runs before the region's). A span that already starts
    at an unread view (NOTE [ A call's unread arguments ]) gets no node: it
    holds the view's storage already. Nothing is measured on the ``meta``
    device (no eager run).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from graphs import Node, Span

__all__ = ["add_held_arguments", "HELD_SUFFIX"]

#: Added to a call's module path to name the node of its held arguments.
HELD_SUFFIX = ".args"


def add_held_arguments(nodes: Sequence[Node], spans: Sequence[Span], held: Mapping[str, int]
                       ) -> tuple[list[Node], list[Span]]:
    """``nodes`` and ``spans`` with a node of held arguments before each span ``held`` names (NOTE [ A call's held
    arguments ])."""
    readers: set[str] = {x for nd in nodes for x in nd.inputs}
    order = sorted(range(len(spans)), key=lambda s: (spans[s].first, -(spans[s].last - spans[s].first), s))
    before: dict[int, list[int]] = {}  # original node position -> spans whose node goes before it, outermost first
    for s in order:
        sp = spans[s]
        size = int(held.get(sp.module, 0))
        first = nodes[sp.first]
        unread_view = first.out_bytes == 0 and first.name not in readers and first.inputs
        if size <= 0 or unread_view or f"{sp.module}{HELD_SUFFIX}" in {nd.name for nd in nodes}:
            continue
        before.setdefault(sp.first, []).append(s)
    if not before:
        return list(nodes), list(spans)
    out: list[Node] = []
    new_pos: list[int] = []
    at: dict[int, int] = {}  # span -> position of its node
    for p, nd in enumerate(nodes):
        for s in before.get(p, ()):
            sp = spans[s]
            at[s] = len(out)
            out.append(Node(name=f"{sp.module}{HELD_SUFFIX}", out_bytes=int(held[sp.module]), op="call arguments",
                            module=sp.module.rpartition(".")[0], requires_grad=False, saves_inputs=()))
        new_pos.append(len(out))
        out.append(nd)
    for p, group in before.items():
        q = new_pos[p]
        names = tuple(out[at[s]].name for s in group)
        out[q] = dataclasses.replace(out[q], inputs=out[q].inputs + names, saves_inputs=out[q].saves_inputs)
    rank = {s: r for r, s in enumerate(order)}
    moved: list[Span] = []
    for s, sp in enumerate(spans):
        group = before.get(sp.first, [])
        if s in at:
            first = at[s] + 1
        else:  # after the nodes of the calls around it, before those of the calls inside it
            outer = [t for t in group if rank[t] < rank[s]]
            first = at[outer[-1]] + 1 if outer else (at[group[0]] if group else new_pos[sp.first])
        moved.append(dataclasses.replace(sp, first=first, last=new_pos[sp.last]))
    return out, moved
