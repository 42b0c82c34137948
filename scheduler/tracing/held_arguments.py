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
    Measured after: that plan at its prediction to the byte.

    NOTE [ A call's unread arguments ] (``scheduler.tracing.spans``) covers a
    view made right before the call for it alone; this covers the others. The
    tracer's eager run (``eager_lifetimes.measure_call_extras``) records, per
    submodule call, the storages of the tensors it receives (positional and
    keyword arguments, in containers too) that were made before the call, that
    no op of the call reads, and that autograd saves nowhere; their bytes are
    the storages *held* by the calls. :func:`add_held_arguments` puts one
    node ``<call>.args`` per such storage, of its bytes, just before the span
    of the first call receiving it (outside it), read by the first node of
    every call receiving it and saved by nobody: no cost, no gradient. A
    region equal to such a span then holds it to its backward, as checkpoint
    does, in ``simulate`` and every solver alike (they take a region's inputs
    from its nodes' inputs), and no solver changes; several regions holding
    it hold one storage. Without a region it lives from just before the first
    call to the last one's first node, while the caller's frame holds the
    real tensor anyway. Spans starting at the same node nest: an enclosing
    call's node comes first and lies outside it, an inner call's lies inside
    the enclosing span. Over by its bytes while the graph's own node of the
    tensor is alive too (an op after the call reads it). Not counted: a
    tensor saved only by an op after the call (its saver's backward runs
    before the region's). A span that already starts
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


def add_held_arguments(nodes: Sequence[Node], spans: Sequence[Span], held: Sequence[tuple[int, Sequence[str]]]
                       ) -> tuple[list[Node], list[Span]]:
    """``nodes`` and ``spans`` with a node per held storage of ``held`` (``(bytes, paths of the calls receiving
    it)``) before the first of those calls' spans, read by each one's first node (NOTE [ A call's held
    arguments ])."""
    readers: set[str] = {x for nd in nodes for x in nd.inputs}
    order = sorted(range(len(spans)), key=lambda s: (spans[s].first, -(spans[s].last - spans[s].first), s))
    rank = {s: r for r, s in enumerate(order)}
    by_path: dict[str, int] = {}
    for s in order:
        by_path.setdefault(spans[s].module, s)
    taken: set[str] = {nd.name for nd in nodes}
    made: list[tuple[int, int, str, list[int]]] = []  # (owner span, bytes, name, reading spans)
    for size, paths in held:
        calls = []
        for path in paths:
            s = by_path.get(path)
            first = nodes[spans[s].first] if s is not None else None
            if first is None or (first.out_bytes == 0 and first.name not in readers and first.inputs):
                continue  # no span, or one that starts at an unread view: it holds that storage already
            calls.append(s)
        if size <= 0 or not calls:
            continue
        owner = min(calls, key=rank.__getitem__)
        name = f"{spans[owner].module}{HELD_SUFFIX}"
        while name in taken:
            name += "+"
        taken.add(name)
        made.append((owner, int(size), name, calls))
    if not made:
        return list(nodes), list(spans)
    before: dict[int, list[tuple[int, int, str]]] = {}  # original position -> (owner rank, bytes, name)
    for owner, size, name, _ in made:
        before.setdefault(spans[owner].first, []).append((rank[owner], size, name))
    out: list[Node] = []
    new_pos: list[int] = []
    where: dict[str, int] = {}
    for p, nd in enumerate(nodes):
        for _, size, name in sorted(before.get(p, ())):  # the outermost call's first
            where[name] = len(out)
            out.append(Node(name=name, out_bytes=size, op="call arguments", module=nd.module.rpartition(".")[0],
                            requires_grad=False, saves_inputs=()))
        new_pos.append(len(out))
        out.append(nd)
    reads: dict[int, list[str]] = {}
    for _, _, name, calls in made:
        for s in calls:
            reads.setdefault(new_pos[spans[s].first], []).append(name)
    for q, names in reads.items():
        fresh = tuple(x for x in dict.fromkeys(names) if x not in out[q].inputs)
        out[q] = dataclasses.replace(out[q], inputs=out[q].inputs + fresh, saves_inputs=out[q].saves_inputs)
    moved: list[Span] = []
    for s, sp in enumerate(spans):
        here = sorted(before.get(sp.first, ()))
        # after the nodes of the calls around it (and its own), before those of the calls inside it
        outer = [name for r, _, name in here if r <= rank[s]]
        first = where[outer[-1]] + 1 if outer else (where[here[0][2]] if here else new_pos[sp.first])
        moved.append(dataclasses.replace(sp, first=first, last=new_pos[sp.last]))
    return out, moved
