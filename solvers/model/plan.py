"""The plan: which intervals of the topological order run as checkpoint regions."""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from graphs import LOOPS, TARGET_META, Graph
from graphs.files import read_json, write_text_atomic
from graphs.schema import count, reject_unknown, short_repr

from .chunks import chunk_paths, normalise_chunks
from ..errors import PlanError, PlanMismatch
from .parts import expand_chunks, normalise_inner, normalise_regions, normalise_saved, save_op_calls_of, save_ops_of
from .selective import recompute_reach

__all__ = ["PLAN_FORMAT_VERSION", "Plan", "Status", "load_plan"]

#: Version of the JSON format written by :meth:`Plan.to_dict`.
PLAN_FORMAT_VERSION = 1


class Status:
    """Values of :attr:`Plan.status`."""

    OPTIMAL = "optimal"  #: proven least recompute among interval plans that fit
    FEASIBLE = "feasible"  #: fits; not proven optimal (``gap`` says how far at most, when known)
    MANUAL = "manual"  #: built by hand with :meth:`Plan.from_regions`

    ALL = (OPTIMAL, FEASIBLE, MANUAL)


@dataclass(frozen=True)
class Plan:
    """A set of disjoint checkpoint regions over one graph.

    A region ``(first, last)`` is an inclusive interval of node positions in
    the graph's topological order. Nodes outside every region run under normal
    autograd; a region keeps only its inputs and is recomputed once during the
    backward (``torch.utils.checkpoint(use_reentrant=False)`` semantics; see
    ``solvers.model.simulate``).

    Attributes:
        regions: sorted, disjoint ``(first, last)`` pairs.
        fingerprint: :meth:`graphs.Graph.fingerprint` of the graph solved for.
        solver: name of the solver that produced the plan.
        options: the solver options as the caller asked them (checked:
            NOTE [ Solver options ] in ``solvers.options``); defaults left out.
        status: one of :class:`Status`.
        budget_bytes: the budget asked for (whole step), or None.
        peak_bytes: the simulated peak of the plan (whole step).
        recompute_flops: FLOPs recomputed by the plan.
        recompute_cost: the solvers' objective recomputed by the plan
            (``Graph.recompute_costs``; equals ``recompute_flops`` on a graph
            costed in FLOPs).
        recompute_time_s: the predicted recompute time: ``recompute_cost`` at
            the graph's rate (``solvers.model.walk.cost_seconds``); None when
            the graph has none.
        bound: a proven lower bound on ``recompute_cost`` (None if unknown).
        gap: ``(recompute_cost - bound) / max(recompute_cost, 1)`` when known.
        solve_time_s: wall time of the solver.
        graph_name: name of the graph solved for (for error messages).
        graph_meta: meta of the graph solved for (model, shapes, dtype).
        node_names: names of the graph's nodes at each region's ends, so a
            human can read the JSON (informative only).
        modules: per region, the module path of the submodule call it is
            (NOTE [ Module-aligned regions ] in ``graphs.graph``), or "" where
            the region is no single call; what ``scheduler.apply`` hooks.
        stochastic: per region, whether a node in it draws random numbers
            (its recompute must replay the RNG state; empty: unknown, replay all).
        saved: sorted positions of nodes inside regions whose outputs are kept
            from the forward instead of recomputed (selective recompute, NOTE
            [ Selective recompute ] in ``solvers.model.simulate``); empty: every
            region recomputes everything inside it.
        findings: what the solver found, by name, each a JSON scalar: the
            method it used (``method``), the work done (``frontier_states``,
            ``blocks_composed``, ``cp_sat_status``, ``cp_sat_work``), the warm
            start it kept (``incumbent``), the parameter it chose (``k`` of
            ``uniform``). Informative: nothing reads it to apply the plan.
        save_ops: per region, the ``(ATen overload, occurrence)`` pairs the
            region's selective-checkpoint policy saves, counting occurrences of
            each overload from 0 in the order the region's forward runs them
            (what ``scheduler.apply`` lowers ``saved`` to; filled by
            :meth:`labelled` from the graph's ``dispatch``/``sac_op``).
        save_op_calls: per region with ``save_ops``, ``(ATen overload,
            calls)``: how many times the traced region calls each overload
            it keeps a call of, so the applier can tell a shifted count from
            the traced one (NOTE [ Selective checkpoint policies ] in
            ``scheduler.applying.selective``); empty when unknown.
        loop: the training loop the plan's peak was predicted for (NOTE
            [ The user's loop ] in ``graphs.graph``): ``"held"``, ``"dropped"``,
            or ``""`` when the graph recorded no outputs (then both are one).
            A plan for ``"held"`` fits a loop that drops the output too;
            ``scheduler.verify`` measures the loop the plan names.
        chunks: the chunked calls ``(first, last, k)`` (NOTE [ Chunked head ]
            in ``solvers.model.chunks``); positions above are the expanded graph's.
        chunk_modules: per chunked call, its module path.
        inner: sorted, disjoint ``(first, last)`` regions each strictly inside
            one region of ``regions``: that region's recompute runs with them
            checkpointed, and each is recomputed once more just before its
            own backward (NOTE [ Nested regions ] in ``solvers.model.nested``).
            Empty: one level, as before.
        inner_modules: per inner region, its module path (like ``modules``).
        inner_stochastic: per inner region, whether a node in it draws random
            numbers (like ``stochastic``).
    """

    regions: tuple[tuple[int, int], ...]
    fingerprint: str = ""
    solver: str = "manual"
    options: Mapping[str, Any] = field(default_factory=dict)
    status: str = Status.MANUAL
    budget_bytes: int | None = None
    peak_bytes: int | None = None
    recompute_flops: int | None = None
    recompute_cost: int | None = None
    recompute_time_s: float | None = None
    bound: float | None = None
    gap: float | None = None
    solve_time_s: float = 0.0
    graph_name: str = ""
    graph_meta: Mapping[str, Any] = field(default_factory=dict)
    node_names: tuple[tuple[str, str], ...] = ()
    modules: tuple[str, ...] = ()
    stochastic: tuple[bool, ...] = ()
    saved: tuple[int, ...] = ()
    save_ops: tuple[tuple[tuple[str, int], ...], ...] = ()
    save_op_calls: tuple[tuple[tuple[str, int], ...], ...] = ()
    findings: Mapping[str, Any] = field(default_factory=dict)
    loop: str = ""
    chunks: tuple[tuple[int, int, int], ...] = ()
    chunk_modules: tuple[str, ...] = ()
    inner: tuple[tuple[int, int], ...] = ()
    inner_modules: tuple[str, ...] = ()
    inner_stochastic: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        regions = normalise_regions(self.regions)
        object.__setattr__(self, "chunks", normalise_chunks(self.chunks, self.graph_meta))
        object.__setattr__(self, "chunk_modules", tuple(self.chunk_modules))
        if self.chunk_modules and len(self.chunk_modules) != len(self.chunks):
            raise PlanError(f"plan lists {len(self.chunk_modules)} chunk_modules for {len(self.chunks)} chunked calls")
        object.__setattr__(self, "regions", regions)
        object.__setattr__(self, "options", dict(self.options))
        object.__setattr__(self, "graph_meta", dict(self.graph_meta))
        object.__setattr__(self, "findings", dict(self.findings))
        for key, value in self.findings.items():
            if not isinstance(key, str) or not isinstance(value, (str, int, float, bool, type(None))) or (
                    isinstance(value, float) and not math.isfinite(value)):
                raise PlanError(f"plan findings must map names to JSON scalars (text, numbers, true/false, null); "
                                f"got {key!r}: {short_repr(value)}")
        object.__setattr__(self, "node_names", tuple(tuple(p) for p in self.node_names))
        object.__setattr__(self, "modules", tuple(self.modules))
        object.__setattr__(self, "stochastic", tuple(bool(x) for x in self.stochastic))
        object.__setattr__(self, "saved", normalise_saved(self.saved, regions))
        object.__setattr__(self, "inner", normalise_inner(self.inner, regions, self.saved))
        object.__setattr__(self, "inner_modules", tuple(self.inner_modules))
        object.__setattr__(self, "inner_stochastic", tuple(bool(x) for x in self.inner_stochastic))
        if self.inner_modules and len(self.inner_modules) != len(self.inner):
            raise PlanError(f"plan lists {len(self.inner_modules)} inner_modules for {len(self.inner)} inner regions")
        if self.inner_stochastic and len(self.inner_stochastic) != len(self.inner):
            raise PlanError(f"plan lists {len(self.inner_stochastic)} inner_stochastic flags for "
                            f"{len(self.inner)} inner regions")
        object.__setattr__(self, "save_ops", tuple(tuple((str(op), int(k)) for op, k in r) for r in self.save_ops))
        if self.save_ops and len(self.save_ops) != len(self.regions):
            raise PlanError(f"plan lists {len(self.save_ops)} save_ops entries for {len(self.regions)} regions")
        object.__setattr__(self, "save_op_calls",
                           tuple(tuple((str(op), int(k)) for op, k in r) for r in self.save_op_calls))
        if self.save_op_calls and len(self.save_op_calls) != len(self.regions):
            raise PlanError(f"plan lists {len(self.save_op_calls)} save_op_calls entries for {len(self.regions)} regions")
        if self.stochastic and len(self.stochastic) != len(self.regions):
            raise PlanError(f"plan lists {len(self.stochastic)} stochastic flags for {len(self.regions)} regions")
        if self.modules and len(self.modules) != len(self.regions):
            raise PlanError(f"plan lists {len(self.modules)} module paths for {len(self.regions)} regions")
        named = [m for m in self.modules if m]
        if len(set(named)) != len(named):
            twice = next(m for m in named if named.count(m) > 1)
            raise PlanError(f"plan names module {twice!r} for {named.count(twice)} regions; a submodule call is one "
                            "region (an edited plan? keep one entry per module, or solve again)")
        if self.status not in Status.ALL:
            raise PlanError(f"plan status {self.status!r} is not one of {Status.ALL}")
        if self.loop not in LOOPS + ("",):
            raise PlanError(f"plan loop {self.loop!r} is not one of {', '.join(map(repr, LOOPS))} (or empty: unknown)")

    # ---------------------------------------------------------------- building
    @classmethod
    def from_regions(cls, graph: Graph, regions: Iterable[Sequence[int]], **fields: Any) -> "Plan":
        """A plan over ``graph`` with the given regions, checked against it.

        Example:
            >>> plan = Plan.from_regions(graph, [(0, 3), (4, 7)])

        Raises:
            PlanError: a region is out of range, reversed, overlaps another, or
                contains a node marked ``recomputable=False``.
        """
        plan = cls(
            regions=tuple(tuple(r) for r in regions),
            fingerprint=graph.fingerprint(),
            graph_name=graph.name,
            graph_meta=graph.meta,
            **{"loop": graph.loop if graph.outputs else "", **fields},
        )
        plan.validate(graph)
        return plan.labelled(graph)

    def labelled(self, graph: Graph) -> "Plan":
        """A copy naming each region's end nodes and module call in ``graph``."""
        expanded = expand_chunks(graph, self.chunks)  # refuses entries that are no chunkable call of graph
        chunk_modules = chunk_paths(graph, self.chunks)
        graph = expanded
        names = tuple((graph.nodes[a].name, graph.nodes[b].name) for a, b in self.regions)
        modules = tuple(graph.span_module(r) for r in self.regions) if graph.spans else ()
        stochastic = tuple(any(graph.nodes[i].stochastic for i in range(a, b + 1)) for a, b in self.regions)
        save_ops = save_ops_of(graph, self.regions, self.saved) if self.saved else ()
        calls = save_op_calls_of(graph, self.regions, save_ops) if save_ops else ()
        inner_modules = tuple(graph.span_module(r) for r in self.inner) if graph.spans else ()
        inner_stochastic = tuple(any(graph.nodes[i].stochastic for i in range(a, b + 1)) for a, b in self.inner)
        return dataclasses.replace(self, node_names=names, modules=modules, stochastic=stochastic,
                                   save_ops=save_ops, save_op_calls=calls, chunk_modules=chunk_modules,
                                   inner_modules=inner_modules, inner_stochastic=inner_stochastic)

    def unaligned_regions(self, graph: Graph) -> list[tuple[int, int]]:
        """The regions that are no submodule call of ``graph`` (NOTE [ Module-aligned regions ])."""
        allowed = graph.allowed_regions()
        if allowed is None:
            return []
        return [r for r in self.regions + self.inner if r not in allowed]

    def validate(self, graph: Graph) -> None:
        """Check the regions fit ``graph`` (indices, recomputable flags).

        Raises:
            PlanError: naming the region and node at fault.
        """
        graph = expand_chunks(graph, self.chunks)
        n = len(graph)
        for a, b in self.regions:
            if b >= n:
                raise PlanError(f"region ({a}, {b}) ends past the last node (the graph has {n} nodes: 0..{n - 1})")
            for i in range(a, b + 1):
                if not graph.nodes[i].recomputable:
                    raise PlanError(
                        f"region ({a}, {b}) contains node {graph.nodes[i].name!r}, which is marked not recomputable"
                    )
        for i in self.saved:
            if i >= n or graph.nodes[i].sac_op < 0:
                what = f"node {graph.nodes[i].name!r}" if i < n else f"position {i}"
                raise PlanError(f"the plan keeps the output of {what}, which a selective-checkpoint policy cannot "
                                "keep (no single op creates what it owns: graph node field sac_op is -1)")
        if self.saved:
            reach = recompute_reach(graph)
            starts = [a for a, _ in self.regions]
            for i in self.saved:
                a, b = self.regions[bisect.bisect_right(starts, i) - 1]  # saved nodes lie in regions (__post_init__)
                if i > reach[b]:
                    raise PlanError(
                        f"the plan keeps the output of node {graph.nodes[i].name!r}, which the recompute of region "
                        f"({a}, {b}) never reaches (it stops once the region's last saved tensor is saved again), so the "
                        "kept copy would stay held to the region's backward and save nothing "
                        "(NOTE [ The menu of kept sets ] in solvers.model.selective); solve again, or drop it from the plan's "
                        "saved nodes")

    def check_graph(self, graph: Graph, *, check: bool = True) -> None:
        """Refuse a plan that was solved for another graph, or that cannot say which graph it was solved for.

        NOTE [ Plans carry their graph ]
            Every entry point that takes a plan (``scheduler.simulate``,
            ``scheduler.apply``, ``ckpt simulate``, ``ckpt apply``) calls this.
            A plan whose ``fingerprint`` was deleted would otherwise apply to
            any model, so a plan with regions and no fingerprint is refused
            unless the caller passes ``check=False``; the empty plan
            (store-all) changes nothing and is accepted everywhere.

        Args:
            check: False skips the fingerprint (the regions are still
                checked against ``graph``).

        Raises:
            PlanMismatch: with what differs (model, input shape, dtype, or the
                graph's structure), or that the plan has no fingerprint.
            PlanError: a region does not fit ``graph``.
        """
        if not check or self.fingerprint == graph.fingerprint() or (not self.fingerprint and not self.regions):
            self.validate(graph)
            return
        if not self.fingerprint:
            raise PlanMismatch(
                "this plan carries no fingerprint of the graph it was solved for, so nothing shows it belongs to "
                f"this one ({graph.name or 'unnamed'}); solve again, build it with Plan.from_regions(graph, regions), "
                "or pass check=False (ckpt: --no-check) to use it anyway")
        mine, theirs = self.graph_meta.get(TARGET_META), graph.meta.get(TARGET_META)
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping) and mine.get("kind") != theirs.get("kind"):
            raise PlanMismatch(  # NOTE [ Trace targets ] in scheduler.tracing.target
                f"this plan was solved for {mine.get('device')} and this graph is traced for {theirs.get('device')}: "
                "their kernels save different tensors (attention, dropout masks). Trace and solve for the device "
                f"the plan runs on (ckpt trace/fit --target {theirs.get('device')})")
        diffs = []
        if self.graph_name != graph.name:
            diffs.append(f"model {self.graph_name!r} vs {graph.name!r}")
        keys = sorted(set(self.graph_meta) | set(graph.meta))
        for k in keys:
            a, b = self.graph_meta.get(k), graph.meta.get(k)
            if a != b:
                diffs.append(f"{k} {a!r} vs {b!r}")
        what = "; ".join(diffs) if diffs else "the graphs' nodes or sizes differ (same name and meta)"
        raise PlanMismatch(
            f"this plan was solved for another graph (plan fingerprint {self.fingerprint}, graph {graph.fingerprint()}): "
            f"{what}. Solve again for this model and input (ckpt solve ...)."
        )

    # ------------------------------------------------------------------ helpers
    def region_of(self, n: int) -> list[int]:
        """For each of ``n`` nodes, the index of its region or -1."""
        out = [-1] * n
        for r, (a, b) in enumerate(self.regions):
            for i in range(a, min(b, n - 1) + 1):
                out[i] = r
        return out

    # --------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["regions"] = [list(r) for r in self.regions]
        d["node_names"] = [list(p) for p in self.node_names]
        d["modules"] = list(self.modules)
        d["stochastic"] = list(self.stochastic)
        d["saved"] = list(self.saved)
        d["save_ops"] = [[[op, k] for op, k in r] for r in self.save_ops]
        d["save_op_calls"] = [[[op, k] for op, k in r] for r in self.save_op_calls]
        if not self.save_op_calls:
            del d["save_op_calls"]  # plans without kept calls read as before
        if not self.loop:
            del d["loop"]  # likewise plans of graphs without outputs
        d["inner"] = [list(r) for r in self.inner]
        d["inner_modules"] = list(self.inner_modules)
        d["inner_stochastic"] = list(self.inner_stochastic)
        if not self.inner:
            del d["inner"], d["inner_modules"], d["inner_stochastic"]  # one-level plans read as before
        d["chunks"] = [list(c) for c in self.chunks]
        d["chunk_modules"] = list(self.chunk_modules)
        if not self.chunks:
            del d["chunks"], d["chunk_modules"]  # plans without chunked calls read as before
        return {"format": PLAN_FORMAT_VERSION, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        """Parse a plan from its JSON form, strictly (NOTE [ Strict loading ] in ``graphs.schema``).

        Raises:
            PlanError: wrong format version, an unknown field (naming the
                nearest known one), or a field of the wrong type or range.
        """
        if not isinstance(d, Mapping):
            raise PlanError("a plan must be a JSON object with a 'regions' list")
        d = dict(d)
        fmt = d.pop("format", PLAN_FORMAT_VERSION)
        if fmt != PLAN_FORMAT_VERSION or isinstance(fmt, bool):
            raise PlanError(
                f"plan format version {fmt!r} is not supported (this version reads format {PLAN_FORMAT_VERSION})"
            )
        if "regions" not in d:
            raise PlanError("plan is missing the required field 'regions'")
        reject_unknown(d, [f.name for f in dataclasses.fields(cls)], "plan", PlanError)
        regions = d.pop("regions")
        if not isinstance(regions, list) or not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in regions):
            raise PlanError(f"plan field 'regions' must be a list of [first, last] pairs, got {short_repr(regions)}")
        kw: dict[str, Any] = {"regions": tuple(tuple(count(v, "regions", "plan", PlanError) for v in r)
                                                for r in regions)}
        for key in ("fingerprint", "solver", "status", "graph_name", "loop"):
            if key in d:
                if not isinstance(d[key], str):
                    raise PlanError(f"plan field {key!r} must be a string, got {short_repr(d[key])}")
                kw[key] = d[key]
        for key in ("budget_bytes", "peak_bytes", "recompute_flops", "recompute_cost"):
            if d.get(key) is not None:
                kw[key] = count(d[key], key, "plan", PlanError)
        for key in ("bound", "gap", "solve_time_s", "recompute_time_s"):
            if d.get(key) is not None:
                v = d[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise PlanError(f"plan field {key!r} must be a finite number >= 0, got {short_repr(v)}")
                kw[key] = float(v)
        for key in ("options", "graph_meta", "findings"):
            if key in d:
                if not isinstance(d[key], Mapping):
                    raise PlanError(f"plan field {key!r} must be an object, got {short_repr(d[key])}")
                kw[key] = d[key]
        node_names = d.get("node_names", ())
        if not isinstance(node_names, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in node_names):
            raise PlanError(f"plan field 'node_names' must be a list of [first, last] node names, got {short_repr(node_names)}")
        modules = d.get("modules", ())
        if not isinstance(modules, (list, tuple)) or not all(isinstance(m, str) for m in modules):
            raise PlanError(f"plan field 'modules' must be a list of module paths, got {short_repr(modules)}")
        stochastic = d.get("stochastic", ())
        if not isinstance(stochastic, (list, tuple)) or not all(isinstance(x, bool) for x in stochastic):
            raise PlanError(f"plan field 'stochastic' must be a list of true/false, got {short_repr(stochastic)}")
        saved = d.get("saved", ())
        if not isinstance(saved, (list, tuple)):
            raise PlanError(f"plan field 'saved' must be a list of node positions, got {short_repr(saved)}")
        saved = tuple(count(v, "saved", "plan", PlanError) for v in saved)
        pairs = {}
        for key, what in (("save_ops", "[ATen op, occurrence]"), ("save_op_calls", "[ATen op, calls]")):
            value = d.get(key, ())
            if not isinstance(value, (list, tuple)) or not all(
                    isinstance(r, (list, tuple)) and all(
                        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str)
                        and isinstance(p[1], int) and not isinstance(p[1], bool) and p[1] >= 0 for p in r)
                    for r in value):
                raise PlanError(f"plan field {key!r} must list, per region, {what} pairs, got {short_repr(value)}")
            pairs[key] = tuple(tuple((p[0], p[1]) for p in r) for r in value)
        chunks = d.get("chunks", ())
        if not isinstance(chunks, (list, tuple)) or not all(isinstance(c, (list, tuple)) and len(c) == 3 for c in chunks):
            raise PlanError(f"plan field 'chunks' must be a list of [first, last, k] triples, got {short_repr(chunks)}")
        kw["chunks"] = tuple(tuple(count(v, "chunks", "plan", PlanError) for v in c) for c in chunks)
        kw["chunk_modules"] = _list_field(d, "chunk_modules", str, "module paths")
        inner = d.get("inner", ())
        if not isinstance(inner, (list, tuple)) or not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in inner):
            raise PlanError(f"plan field 'inner' must be a list of [first, last] pairs, got {short_repr(inner)}")
        kw["inner"] = tuple(tuple(count(v, "inner", "plan", PlanError) for v in r) for r in inner)
        kw["inner_modules"] = _list_field(d, "inner_modules", str, "module paths")
        kw["inner_stochastic"] = _list_field(d, "inner_stochastic", bool, "true/false")
        return cls(node_names=tuple(tuple(p) for p in node_names), modules=tuple(modules),
                   stochastic=tuple(stochastic), saved=saved, **pairs, **kw)

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as JSON, atomically (NOTE [ Output files ] in ``graphs.files``).

        Raises:
            OutputPathError: the file cannot be written (the previous one is untouched).
        """
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan written by :meth:`Plan.save`.

    Raises:
        PlanError: missing, unreadable or non-UTF-8 file, a directory,
            invalid JSON, or a malformed plan.
    """
    where = os.fspath(path)
    data = read_json(where, what="plan", error=PlanError)
    try:
        return Plan.from_dict(data)
    except PlanError as exc:
        raise PlanError(f"plan file {where!r}: {exc}") from None


def _list_field(d: Mapping[str, Any], key: str, kind: type, what: str) -> tuple:
    """Plan field ``key`` of ``d``: a list of ``kind`` values (empty when absent), else PlanError."""
    value = d.get(key, ())
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, kind) for v in value):
        raise PlanError(f"plan field {key!r} must be a list of {what}, got {short_repr(value)}")
    return tuple(value)
