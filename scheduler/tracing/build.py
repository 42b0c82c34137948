"""From measured fx nodes to cost-graph nodes, at a chosen granularity.

NOTE [ Merging nodes ]
    A cost node may stand for a contiguous run ``G`` of measured fx nodes (a
    module block, or an op with the free views that follow it). Its fields are
    chosen so that ``solvers.model.simulate`` keeps alive exactly what autograd keeps
    when ``G`` runs, with NOTE [ What a node saves ] read at the group level:

    * ``inputs``: the groups owning or producing tensors that members read from
      outside ``G``; ``saves_inputs``: those whose tensors some member saves;
    * the group's *outputs* are the members' outputs read after ``G``,
      returned by the graph or held by the model's return value (NOTE
      [ Finding the model's outputs ] in ``scheduler.tracing.outputs``);
      ``out_bytes`` is their size, and the node is one of the graph's
      ``outputs`` when a member's storage is the model's (then the caller
      holds all of ``out_bytes`` under a ``"held"`` loop: exact at op
      granularity, an upper bound where a merged node has other outputs);
    * ``saves_output`` is true when members save every output with bytes;
      when they save only some of them, those are added to ``saved_bytes``
      instead (kept to the backward; the others are freed after their last
      reader, as in the op-level graph);
    * internal tensors (read only inside ``G``) that a member saves become
      ``saved_bytes``, as do the members' own buffers (dropout masks...);
    * internal tensors nobody saves are temporaries: the most of them alive at
      once during ``G``'s forward (with, at each member, the workspace its
      calls measured above its end state, NOTE [ Op workspaces ]), or the
      bytes its backward holds beyond the gradients simulate allocates
      (measured per fx node, plus the largest internal gradient in a group),
      whichever is larger, is ``workspace_bytes``;
    * ``grad_views`` (the backward hands inputs views of the output's
      gradient, as ``cat`` does) only when the one member that creates
      storage has it, or, in a group that creates none, when every member
      with a backward that reads another record has it (views: NOTE [ View
      gradients through views ] in ``solvers.model.gradients``);
    * ``rows`` (the token rows a chunked call splits) are its last output's;
    * FLOPs and costs (``fwd_cost``) add up; flags are "any member"; ``param_bytes`` are the
      parameters whose last forward user is in ``G`` (their gradient is
      created when the backward reaches that user).

    An op-level graph is the same construction with one-node groups, so both
    go through one code path and are tested against each other.
"""

from __future__ import annotations

import logging
from typing import Sequence

from graphs import Node

from .costs import OpRecord

__all__ = ["group_records", "build_nodes", "output_names", "is_free", "GRANULARITIES"]

log = logging.getLogger(__name__)

#: Named granularities; an int ``d`` merges consecutive nodes of the same module path cut at depth ``d``.
GRANULARITIES = ("op", "fold", "auto")


def is_free(r: OpRecord) -> bool:
    """The record makes no storage, does no work and saves nothing (a view, ``getitem``, an in-place buffer update)."""
    return r.out_bytes == 0 and r.fwd_flops == 0 and r.bwd_flops == 0 and r.own_saved_bytes == 0 and not r.saves


def _reads(r: OpRecord, group: Sequence[int]) -> bool:
    """``r`` reads a record of ``group``, or reads none."""
    return not r.inputs or any(j in group for j in r.inputs)


def group_records(records: Sequence[OpRecord], granularity: str | int) -> list[list[int]]:
    """Partition record positions into contiguous groups.

    Args:
        records: measured fx nodes in graph order.
        granularity: ``"op"`` (one node per fx node), ``"fold"`` (free ops such
            as views, ``getitem`` and in-place buffer updates join the node
            before them), or an int depth ``d`` (fold, then merge consecutive
            nodes whose module paths agree on their first ``d`` components).

    A free op folds only into a node of the same submodule calls, so that
    every call's nodes stay whole cost nodes (NOTE [ Module-aligned regions ]);
    outside every call (the model's top-level code: the loss), only into a
    node it reads or when it reads nothing, so that a view of the logits
    stays apart from the labels' ops before it (a chunked head splits the
    logits' rows and shares the labels: NOTE [ Chunked head ] in
    ``solvers.model.chunks``).

    Returns:
        Lists of positions, contiguous and in order, covering every record.
    """
    n = len(records)
    calls = [frozenset(c for c, _ in r.calls) for r in records]
    if granularity == "op":
        return [[i] for i in range(n)]
    depth = None if granularity == "fold" else int(granularity)
    groups: list[list[int]] = []
    key_of: list[str] = []
    for i, r in enumerate(records):
        key = ""
        if depth is not None and depth > 0 and r.module:
            key = ".".join(r.module.split(".")[:depth])
        if groups and is_free(r) and calls[i] == calls[groups[-1][-1]] and (calls[i] or _reads(r, groups[-1])):
            groups[-1].append(i)
            continue
        if groups and key and key_of[-1] == key:
            groups[-1].append(i)
            continue
        groups.append([i])
        key_of.append(key)
    # A free first record folds into the next group.
    if len(groups) > 1 and all(is_free(records[i]) for i in groups[0]) and calls[groups[0][-1]] == calls[groups[1][0]]:
        groups[1] = groups[0] + groups[1]
        groups.pop(0)
    return groups


def build_nodes(records: Sequence[OpRecord], groups: Sequence[Sequence[int]],
                param_bytes_of: dict[int, int] | None = None) -> list[Node]:
    """Cost nodes for ``groups`` of ``records`` (NOTE [ Merging nodes ])."""
    _PARAM_BYTES.clear()
    _LAST_USER.clear()
    _PARAM_BYTES.update(param_bytes_of or {})
    for j, r in enumerate(records):
        for k in r.param_keys:
            _LAST_USER[k] = j
    group_of = [0] * len(records)
    for g, members in enumerate(groups):
        for m in members:
            group_of[m] = g
    read_after = [False] * len(records)  # read by a later group
    for j, r in enumerate(records):
        for i in r.inputs:
            if group_of[i] != group_of[j]:
                read_after[i] = True
    names = [_group_name(records, g) for g in groups]
    pinned = _views_written_later(records, group_of)
    written = {o for r in records for o in r.writes}
    nodes: list[Node] = []
    for g, members in enumerate(groups):
        gset = set(members)
        rs = [records[m] for m in members]
        rg = any(r.requires_grad for r in rs)
        ext_in: dict[int, None] = {}
        saved_ext: dict[int, None] = {}
        internal_saved: set[int] = set()
        own = 0
        for r in rs:
            for i in r.inputs:
                if i not in gset:
                    ext_in[group_of[i]] = None
            if r.requires_grad:
                own += r.own_saved_bytes
                for i in r.saves:
                    if i in gset:
                        internal_saved.add(i)
                    else:
                        saved_ext[group_of[i]] = None
        outs = [m for m in members if (read_after[m] or records[m].returned or records[m].output)
                and records[m].out_bytes > 0]
        out_bytes = sum(records[m].out_bytes for m in outs)
        kept = [m for m in internal_saved if m not in outs and records[m].out_bytes > 0]
        saved_outs = [m for m in outs if m in internal_saved]
        saves_output = bool(outs) and len(saved_outs) == len(outs)
        saved_bytes = own + sum(records[m].out_bytes for m in kept)
        if not saves_output:
            saved_bytes += sum(records[m].out_bytes for m in saved_outs)
        workspace = max(_temporaries_peak(records, members, set(outs) | internal_saved),
                        _backward_transient(records, members, set(outs)))
        dispatch, sac_op = _policy_call(records, members, written)
        nodes.append(Node(
            name=names[g],
            inputs=tuple(names[k] for k in ext_in),
            out_bytes=out_bytes,
            fwd_flops=sum(r.fwd_flops for r in rs),
            fwd_cost=sum(r.cost for r in rs),
            bwd_flops=sum(r.bwd_flops for r in rs) if rg else 0,
            op=rs[0].op if len(rs) == 1 else _group_op(rs),
            saves_inputs=tuple(names[k] for k in saved_ext) if rg else (),
            saves_output=saves_output and rg,
            saved_bytes=saved_bytes if rg else 0,
            workspace_bytes=workspace,
            module=_common_module(rs),
            stochastic=any(r.stochastic for r in rs),
            stateful=any(r.stateful for r in rs),
            state_bytes=sum(r.state_bytes for r in rs),
            requires_grad=rg,
            recomputable=not any(m in pinned for m in members),
            grad_views=rg and _grad_views(rs),
            members=tuple(name for r in rs for name in r.members),
            dispatch=dispatch,
            sac_op=sac_op,
            rows=_rows(records, outs or members),
        ))
    return nodes


def _rows(records: Sequence[OpRecord], members: Sequence[int]) -> int:
    """The token rows of a group: those of its last output member that returned a tensor (``Node.rows``)."""
    return next((records[m].rows for m in reversed(members) if records[m].rows), 0)


def _grad_views(rs: Sequence[OpRecord]) -> bool:
    """A group hands its inputs views of its output's gradient: ``cat``-like when the one member creating
    storage does (one op, or folded views); a group creating none (views) when every member with a backward
    does (NOTE [ View gradients through views ] in ``solvers.model.gradients``). A member that reads no record
    (torchvision ViT's ``class_token.expand``: a parameter in, its gradient summed into a new tensor for the
    parameter alone) hands no activation a gradient, and has no say."""
    owning = [r.grad_views for r in rs if r.out_bytes > 0]
    if owning:
        return owning == [True]
    backward = [r.grad_views for r in rs if r.requires_grad and r.inputs]
    return bool(backward) and all(backward)


def output_names(records: Sequence[OpRecord], groups: Sequence[Sequence[int]], nodes: Sequence[Node]) -> tuple[str, ...]:
    """Names of the cost nodes one of whose members owns storage of the model's return value
    (``Graph.outputs``, NOTE [ The user's loop ] in ``graphs.graph``)."""
    return tuple(nd.name for nd, members in zip(nodes, groups)
                 if any(records[m].output and records[m].out_bytes > 0 for m in members))


def _policy_call(records: Sequence[OpRecord], members: Sequence[int], written: set[int]) -> tuple[tuple[str, ...], int]:
    """``(dispatch, sac_op)`` of a group: its members' calls in order, and the keeper's call when
    exactly one member does work, is keepable, and no node writes its storage in place afterwards
    (NOTE [ Which op a policy keeps ] in ``scheduler.tracing.recorder``)."""
    dispatch: list[str] = []
    sac_op = -1
    working = [m for m in members if not records[m].free_calls]
    for m in members:
        r = records[m]
        if working == [m] and r.sac_op >= 0 and m not in written:
            sac_op = len(dispatch) + r.sac_op
        dispatch.extend(r.dispatch)
    return tuple(dispatch), sac_op


def _views_written_later(records: Sequence[OpRecord], group_of: Sequence[int]) -> set[int]:
    """Records whose output views a storage that a later group writes in place
    while the storage's own value is still read after the view.

    NOTE [ Views of written storages ]: T5 builds its decoder inputs as
    ``shifted = input_ids.new_zeros(...)``; ``shifted[..., 1:]`` (a view)
    ``.copy_(...)``; then reads ``shifted``: the write goes through the view.
    A region holding the view's op reads its input as a copy when the graph
    writes that input after the region (NOTE [ Inputs written after a region ]
    in ``scheduler.applying.graph``), so its output would view the copy and the
    write would miss ``shifted``: the decoder read zeros, and the gradients
    moved by 0.06. Such views are marked not recomputable (they create no
    storage: keeping them out of regions costs nothing). A view whose writes
    only flow on through its own value (a residual ``out += identity`` then
    ``relu_``) stays recomputable: the copy is all anyone reads.
    """
    writers: dict[int, list[int]] = {}  # storage owner -> positions writing it
    readers: dict[int, list[int]] = {}  # record -> positions taking its value as an argument
    for j, r in enumerate(records):
        for o in r.writes:
            writers.setdefault(o, []).append(j)
        for i in r.direct:
            readers.setdefault(i, []).append(j)
    pinned: set[int] = set()
    for j, r in enumerate(records):
        for base in r.aliases:
            if base == j:
                continue
            written = any(w > j and group_of[w] != group_of[j] for w in writers.get(base, ()))
            if written and any(u > j and group_of[u] != group_of[j] for u in readers.get(base, ())):
                pinned.add(j)
    return pinned


def attribute_params(nodes: list[Node], records: Sequence[OpRecord], groups: Sequence[Sequence[int]],
                     param_bytes_of: dict[int, int]) -> list[Node]:
    """Give each trainable parameter's bytes to the node whose backward creates its gradient.

    That is the *last* node using it in the forward (the first reached by the
    backward); for a parameter used once it is the node that uses it. A shared
    parameter (tied embedding and output weights) gets a second gradient in
    the backward of each earlier user, which the engine adds out of place
    into the pending one: that contribution and the sum are part of the
    earlier user's measured backward peak (``OpRecord.bwd_peak_bytes``), hence
    of its ``workspace_bytes`` (NOTE [ Shared parameter gradients ] in
    ``scheduler.tracing.costs``). A model input that requires grad is given
    to its last user the same way (NOTE [ Gradients of model inputs ]).
    """
    import dataclasses

    group_of = {m: g for g, ms in enumerate(groups) for m in ms}
    users: dict[int, list[int]] = {}
    for j, r in enumerate(records):
        for k in r.param_keys:
            if k in param_bytes_of and group_of[j] not in users.setdefault(k, []):
                users[k].append(group_of[j])
    extra = [0] * len(nodes)
    for k, gs in users.items():
        extra[gs[-1]] += param_bytes_of[k]
    return [dataclasses.replace(nd, param_bytes=extra[g]) if extra[g] else nd for g, nd in enumerate(nodes)]


def frozen_by_node(nodes: Sequence[Node], records: Sequence[OpRecord], groups: Sequence[Sequence[int]],
                   frozen_bytes_of: dict[int, int]) -> dict[str, int]:
    """Node name -> bytes of the frozen parameters it is the first to use (``graphs.FROZEN_META``): the
    stage that runs that node holds them (NOTE [ A stage's graph ] in ``scheduler.distributed.stages``)."""
    group_of = {m: g for g, ms in enumerate(groups) for m in ms}
    first: dict[int, int] = {}
    for j, r in enumerate(records):
        for k in r.param_keys:
            if k in frozen_bytes_of and k not in first:
                first[k] = group_of[j]
    out: dict[str, int] = {}
    for k, g in first.items():
        out[nodes[g].name] = out.get(nodes[g].name, 0) + frozen_bytes_of[k]
    return out


def _temporaries_peak(records: Sequence[OpRecord], members: Sequence[int], kept: set[int]) -> int:
    pos = {m: k for k, m in enumerate(members)}
    last_use = {m: pos[m] for m in members}
    for m in members:
        for i in records[m].inputs:
            if i in pos:
                last_use[i] = max(last_use[i], pos[m])
        for i in records[m].owners:
            if i in pos:
                last_use[i] = max(last_use[i], pos[m])
    alive = peak = 0
    dying: dict[int, int] = {}
    for k, m in enumerate(members):
        if m not in kept and records[m].out_bytes:
            alive += records[m].out_bytes
            dying[last_use[m]] = dying.get(last_use[m], 0) + records[m].out_bytes
        peak = max(peak, alive + records[m].fwd_workspace_bytes)  # NOTE [ Op workspaces ]
        alive -= dying.pop(k, 0)
    return peak


def _backward_transient(records: Sequence[OpRecord], members: Sequence[int], outs: set[int]) -> int:
    """Bytes a group's backward holds beyond what simulate allocates (input and parameter gradients).

    Per member: its measured backward peak minus the gradients of the tensors
    it reads and of the parameters it uses (those simulate counts); plus, in a
    group, the gradient of the largest internal tensor, alive meanwhile.
    """
    gset = set(members)
    best = 0
    for m in members:
        r = records[m]
        if not r.requires_grad:
            continue
        counted = sum(records[i].out_bytes for i in r.owners if records[i].requires_grad)
        best = max(best, r.bwd_peak_bytes - counted - _param_grad_bytes(r, m))
    internal = [records[m].out_bytes for m in members if m not in outs and records[m].requires_grad]
    if len(gset) > 1 and internal:
        best += max(internal)
    return max(best, 0)


_PARAM_BYTES: dict[int, int] = {}  # parameter storage key -> bytes (trainable ones), for the build in progress
_LAST_USER: dict[int, int] = {}  # parameter storage key -> last record using it


def _param_grad_bytes(r: OpRecord, pos: int) -> int:
    """Gradient bytes simulate creates in this record's backward: parameters it is the last user of."""
    return sum(_PARAM_BYTES.get(k, 0) for k in r.param_keys if _LAST_USER.get(k) == pos)


def _group_name(records: Sequence[OpRecord], members: Sequence[int]) -> str:
    return records[members[0]].name


def _group_op(rs: Sequence[OpRecord]) -> str:
    heavy = max(rs, key=lambda r: r.fwd_flops)
    return f"{len(rs)} ops ({heavy.op}...)" if heavy.fwd_flops else f"{len(rs)} ops"


def _common_module(rs: Sequence[OpRecord]) -> str:
    paths = [r.module.split(".") for r in rs if r.module]
    if not paths:
        return ""
    common = paths[0]
    for p in paths[1:]:
        k = 0
        while k < min(len(common), len(p)) and common[k] == p[k]:
            k += 1
        common = common[:k]
    return ".".join(common)
