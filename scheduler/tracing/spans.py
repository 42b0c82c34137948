"""Which runs of cost nodes are one submodule call: the regions a plan can hook.

NOTE [ Module-aligned regions ] (``graphs.graph``) says why plans are
restricted to submodule calls. Here the tracer's per-node module stacks
(``OpRecord.calls``, from ``nn_module_stack``) become :class:`graphs.Span` s:

* a call is a candidate when its module is called exactly once in the traced
  step (a module called twice, such as a ReLU reused in a block, would be
  checkpointed at every call by a hook) and its fx nodes are contiguous;
* a run of consecutive children ``i..j`` (``j > i``) of an ``nn.Sequential``
  whose ``forward`` is torch's own is a candidate too: the applier runs the
  children in order under one checkpoint, as ``checkpoint_sequential`` does;
* a call that writes in place a tensor made before it (``ReLU(inplace=True)``
  on its input, ``x += ...``, stochastic depth's ``mul_``), or whose input is
  written in place after it, is no candidate: checkpoint keeps a region's
  inputs for the recompute and refuses them once modified ("one of the
  variables needed for gradient computation has been modified by an inplace
  operation"; torchvision, timm, monai and smp models did this);
* a call starts at the views its caller made for it alone and that no op
  reads (NOTE [ A call's unread arguments ]);
* a candidate becomes a span of the cost graph when its first fx node starts
  a cost node and its last one ends one (``tracing.build.group_records``
  folds no free op across a call boundary).

NOTE [ A call's unread arguments ]
    Checkpoint keeps a region's call arguments (the closure that recomputes
    it) from the region's forward to its backward, read or not, and a view
    keeps all of the storage it views. ``self.embed_positions(inputs_embeds[:,
    :, -1])`` (transformers' BART encoder: "needed for the shape only") reads
    no element of its argument, so no op of the call reads ``inputs_embeds``
    and the graph, which keeps a tensor alive for its readers, let it go after
    the encoder's add: a plan checkpointing ``embed_positions`` measured
    130,808 B over its prediction by the allocator (``inputs_embeds``, a
    [4, 128, 64] fp32 tensor of 131,072 B).
    The view is in the graph (a zero-byte node read by nobody, right before
    the call, made in the caller's frame), so the call's span starts at it:
    a region equal to the span then reads the view's owner from outside and
    holds it to the region's backward, as checkpoint does, in ``simulate``
    and every solver alike (they all take a region's inputs from its nodes'
    inputs), and no solver changes. The views taken are the free records
    (``tracing.build.is_free``) just before the call's first node that view
    a storage, that nothing reads, returns or writes through, and that run in
    exactly the calls enclosing the call (the caller's frame); the call is
    the outermost starting at that node. They run outside the checkpoint in
    eager (before the call), costing nothing and creating no storage. An
    unread argument made earlier than right before the call, or one that is
    no view (a tensor other ops read too, or none), gets a node of its own
    before the call when nothing saves it (NOTE [ A call's held arguments ]
    in ``scheduler.tracing.held_arguments``).

Spans carry the module path (``h.3``, ``layer1[0:2]`` for a Sequential run);
the graph's meta records each span module's class name, so a plan applied to
a model whose module at that path is another class is refused.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Mapping, Sequence

from torch import nn

from graphs import Span

from .build import is_free
from .costs import OpRecord

__all__ = ["lm_heads", "module_spans", "sequential_children", "MODULES_META", "TREE_META", "module_tree", "run_path",
           "parse_run_path"]

log = logging.getLogger(__name__)

#: ``Graph.meta`` key: ``{module path: class name}`` for every span's module.
MODULES_META = "modules"

#: ``Graph.meta`` key: ``{module path: class name}`` for every submodule of the traced model, so that
#: ``apply`` can compare what runs inside each region (NOTE [ What a region holds ] in
#: ``scheduler.applying.modules``).
TREE_META = "module_tree"

def lm_heads(model: nn.Module) -> dict[str, str]:
    """``{path: "causal" | "masked"}``: ``model`` and its submodules that are transformers causal-LM or masked-LM
    models by class (NOTE [ Which heads run in chunks ] in ``solvers.model.chunks``); empty without transformers."""
    if "transformers" not in sys.modules:  # no module of the model can be one: do not import it
        return {}
    try:
        from transformers.models.auto import modeling_auto as auto
    except ImportError:
        return {}
    kinds = {"causal": set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()),
             "masked": set(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES.values())}
    found: dict[str, str] = {}
    for path, module in model.named_modules():
        names = {c.__name__ for c in type(module).__mro__}
        kind = next((k for k, classes in kinds.items() if names & classes), None)
        if kind is not None:
            found[path] = kind
    return found


def fused_heads(model: nn.Module) -> list[str]:
    """The module paths of the output layers of ``model``'s LMs (:func:`lm_heads`) that run fused with their loss
    (``scheduler.tracing.chunk_loop.fusable``: NOTE [ Fused head ] in ``solvers.model.fused``)."""
    from .chunk_loop import fusable

    paths = {id(m): p for p, m in model.named_modules()}
    found = []
    for path in lm_heads(model):
        getter = getattr(model.get_submodule(path), "get_output_embeddings", None)
        head = getter() if callable(getter) else None
        if isinstance(head, nn.Module) and id(head) in paths and fusable(head):
            found.append(paths[id(head)])
    return sorted(set(found))


_RUN = re.compile(r"^(.*)\[(\d+):(\d+)\]$")


def run_path(parent: str, i: int, j: int) -> str:
    """The name of the run of children ``i..j`` (inclusive) of the Sequential at ``parent``."""
    return f"{parent}[{i}:{j + 1}]"


def parse_run_path(path: str) -> tuple[str, int, int] | None:
    """``"layer1[0:2]"`` -> ``("layer1", 0, 1)`` (inclusive); None for a plain module path."""
    m = _RUN.match(path)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3)) - 1


def module_tree(model: nn.Module) -> dict[str, str]:
    """``{path: class name}`` of every submodule of ``model`` (the root excluded)."""
    return {path: type(m).__name__ for path, m in model.named_modules(remove_duplicate=False) if path}


def sequential_children(model: nn.Module) -> dict[str, int]:
    """``{path: number of children}`` of every ``nn.Sequential`` in ``model`` that runs torch's own forward."""
    return {path: len(m) for path, m in model.named_modules()
            if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward and len(m) > 1}


def module_spans(records: Sequence[OpRecord], groups: Sequence[Sequence[int]],
                 sequentials: Mapping[str, int]) -> tuple[list[Span], dict[str, str]]:
    """The spans of the cost graph whose nodes are ``groups`` of ``records``.

    Args:
        records: the measured fx nodes, in order.
        groups: the cost nodes, as contiguous lists of record positions.
        sequentials: module path -> number of children, for every
            ``nn.Sequential`` of the model whose ``forward`` is torch's own.

    Returns:
        The spans (outermost first where several cover the same nodes) and
        ``{module path: class name}`` of their modules.
    """
    where: dict[str, list[int]] = {}
    cls: dict[str, str] = {}
    repeated: set[str] = set()
    for pos, r in enumerate(records):
        for call, name in r.calls:
            where.setdefault(call, []).append(pos)
            path = call.split("@", 1)[0]
            cls.setdefault(path, name)
            if "@" in call:
                repeated.add(path)
    calls: dict[str, tuple[int, int]] = {}
    for call, positions in where.items():
        if "@" in call or call in repeated:
            continue
        a, b = positions[0], positions[-1]
        if b - a + 1 == len(positions):
            calls[call] = (a, b)
    unread = _UnreadArguments(records, where)
    calls = {call: (unread.start(call, a, b), b) for call, (a, b) in calls.items()}
    # Runs of consecutive children of a plain nn.Sequential.
    candidates: list[tuple[str, int, int]] = [(p, a, b) for p, (a, b) in calls.items()]
    for parent, count in sequentials.items():
        if parent not in calls and parent != "":
            continue
        kids = [calls.get(f"{parent}.{i}" if parent else str(i)) for i in range(count)]
        for i in range(count):
            if kids[i] is None:
                continue
            for j in range(i + 1, count):
                if kids[j] is None or kids[j][0] != kids[j - 1][1] + 1:
                    break
                candidates.append((run_path(parent, i, j), kids[i][0], kids[j][1]))
    writes = _Writes(records)
    candidates = [c for c in candidates if not writes.across(c[1], c[2])]
    start = {g[0]: k for k, g in enumerate(groups)}
    end = {g[-1]: k for k, g in enumerate(groups)}
    spans = []
    for path, a, b in candidates:
        if a in start and b in end:
            spans.append(Span(start[a], end[b], path))
    # Outermost first among equal intervals: shorter paths are outer modules.
    spans.sort(key=lambda sp: (sp.first, -sp.last, sp.module.count("."), len(sp.module)))
    kept: dict[tuple[int, int], Span] = {}
    for sp in spans:
        kept.setdefault((sp.first, sp.last), sp)
    modules = {}
    for sp in kept.values():
        run = parse_run_path(sp.module)
        if run is None:
            modules[sp.module] = cls.get(sp.module, "")
        else:
            modules[run[0]] = "Sequential"
    log.info("%d submodule calls, %d of them spans of the cost graph", len(candidates), len(kept))
    return list(kept.values()), modules


class _UnreadArguments:
    """Where a call's span starts: at the views made for it alone that no op reads (NOTE [ A call's unread
    arguments ])."""

    def __init__(self, records: Sequence[OpRecord], where: Mapping[str, list[int]]) -> None:
        self.records = records
        self.where = where
        self.read = {i for r in records for i in r.inputs}
        self.written = {w for r in records for w in r.writes}

    def start(self, call: str, a: int, b: int) -> int:
        recs = self.records
        starting = [c for c, _ in recs[a].calls if self.where[c][0] == a]
        outermost = max(starting, key=lambda c: (self.where[c][-1], -c.count(".")))
        if outermost != call:
            return a
        caller = {c for c, _ in recs[a].calls} - set(starting)
        p = a
        while p > 0:
            r = recs[p - 1]
            if not (is_free(r) and r.aliases and p - 1 not in self.read and not r.returned and not r.output
                    and not r.writes and not set(r.aliases) & self.written and {c for c, _ in r.calls} == caller):
                break
            p -= 1
        if p < a:
            log.debug("%s starts at its unread argument %s (NOTE [ A call's unread arguments ])", call, recs[p].name)
        return p


class _Writes:
    """In-place writes per record, indexed so each candidate is checked in time linear in its length."""

    def __init__(self, records: Sequence[OpRecord]) -> None:
        self.records = records
        self.last_write: dict[int, int] = {}  # storage owner -> last record writing it
        for pos, r in enumerate(records):
            for w in r.writes:
                self.last_write[w] = pos

    def across(self, a: int, b: int) -> bool:
        """Records ``a..b`` write in place a storage made before ``a``, or one they read is written after ``b``."""
        for r in self.records[a:b + 1]:
            if any(w < a for w in r.writes):
                return True
            if any(o < a and self.last_write.get(o, -1) > b for o in r.inputs):
                return True
        return False
