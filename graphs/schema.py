"""The graph's JSON form: its keys and limits, and the strict checks every field passes.

The node's and the graph's readers (``Node.from_dict`` in ``graphs.node``,
``Graph.from_dict`` in ``graphs.graph``) sit beside their types and check with
these; ``Plan.from_dict`` does too.

NOTE [ Strict loading ]
    A misspelt field that is silently dropped gives a silently wrong answer
    (``"param_byte"`` ignored: the predicted peak falls by the parameters'
    size), and a number no solver can add up (NaN, 1e30) gives a traceback in
    every solver. So an unknown key is an error that names the nearest known
    one, and every byte or FLOP count must be a finite integer in
    ``[0, 2**62)`` (:data:`MAX_COUNT`), and so must the graph's totals
    (``Graph.validate``), so that every sum the solvers form stays exact in
    int64 numpy arrays and CP-SAT's integer model. ``Plan.from_dict`` follows
    the same rules (``solvers.model.plan``).
"""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, Iterable, Mapping

from .errors import CkptError, GraphError

__all__ = ["FORMAT_VERSION", "COSTS_META", "MAX_COUNT", "WORKSPACES_META", "TARGET_META", "BUILD_META", "SCALARS_META",
           "FROZEN_META", "LM_HEADS_META", "FUSED_HEADS_META", "CALL_RETURNS_META", "LOOPS", "HOLDS_OP", "CUDA_BLOCK", "storage_unit", "GRAPH_KEYS", "count", "is_count", "reject_unknown", "short_repr"]

#: Version of the JSON format written by :meth:`Graph.to_dict`.
FORMAT_VERSION = 1
#: ``Graph.meta`` key describing how ``fwd_flops`` were obtained when they are
#: not counted FLOPs (e.g. measured times, ``scheduler.tracing.timing``).
COSTS_META = "costs"
#: Exclusive upper limit of every byte and FLOP count (NOTE [ Strict loading ]).
MAX_COUNT = 1 << 62
#: ``meta`` key naming the device op workspaces were measured on (when they were).
WORKSPACES_META = "workspaces"
#: ``meta`` key: the device and kernels a trace plans for (``scheduler.tracing.target``); the bytes they
#: change are in the fingerprint, the name is not (an H100 and an H200 trace are one graph).
TARGET_META = "target"
#: The CUDA caching allocator's unit: every block it hands out is a multiple of it (NOTE [ CUDA blocks ] in
#: ``scheduler.tracing.records``). A graph traced for a CUDA target counts its storages in it.
CUDA_BLOCK = 512
#: ``meta`` key: how the CLI built the model (``{"model": NAME, "options": {...}}``), so that
#: ``ckpt apply PLAN`` rebuilds it without retyping; provenance, not part of the fingerprint.
BUILD_META = "build"
#: ``meta`` key: the saved Python scalars' bytes (``meta["saved_scalar_bytes"]``) per node that saves them
#: (NOTE [ Saved Python scalars ] in ``scheduler.tracing.costs``); memory accounting, not part of the
#: fingerprint (a pipeline stage holds its own per micro-batch in flight, ``scheduler.distributed.stages``).
SCALARS_META = "saved_scalars"
#: ``meta`` key: the bytes of frozen parameters (``frozen_param_bytes``) per node that first uses them; memory
#: accounting for a pipeline stage (its own frozen weights, ``scheduler.distributed.stages``), not part of the
#: fingerprint. Present only when some parameters are frozen.
FROZEN_META = "frozen_params"
#: ``meta`` key: ``{module path: "causal" | "masked"}``, the traced model's submodules whose loss a chunked head
#: knows (NOTE [ Which heads run in chunks ] in ``solvers/model/chunks.py``); which plans a menu may make, not what
#: a plan does: not part of the fingerprint.
LM_HEADS_META = "lm_heads"
#: ``meta`` key: the module paths of the LM heads that run fused with their loss (a plain ``nn.Linear`` with no
#: hooks, the output layer of a model ``LM_HEADS_META`` names: NOTE [ Fused head ] in ``solvers/model/fused.py``).
#: Absent in graphs traced before it; not part of the fingerprint (plans made before it still load).
FUSED_HEADS_META = "fused_heads"
#: ``meta`` key: ``{module path: type name}``, the span calls whose eager run returned something other than one
#: tensor (a body returning ``(hidden, caches)``): no row-wise call a chunk menu may offer (NOTE [ Chunked head ] in
#: ``solvers/model/chunks.py``). Absent when no call did, or when the trace ran no eager pass (a ``meta`` model);
#: which plans a menu may make, not what a plan does: not part of the fingerprint.
CALL_RETURNS_META = "call_returns"
#: The training loops a graph can be planned for (NOTE [ The user's loop ]).
LOOPS = ("held", "dropped")
#: The ``op`` of a node that only reads tensors the user's Python holds past their last reader
#: (NOTE [ Forward holds ] in ``scheduler/tracing/forward_holds.py``): no bytes, no cost, no gradient.
HOLDS_OP = "holds"


#: Top-level keys of a graph's JSON form.
GRAPH_KEYS = ("format", "name", "param_bytes", "input_bytes", "rng_state_bytes", "frozen_param_bytes", "meta", "nodes",
              "spans", "outputs", "loop")


def count(value: Any, key: str, where: str, error: type[CkptError] = GraphError) -> int:
    """``value`` as a byte or FLOP count: a finite integer in ``[0, MAX_COUNT)``.

    Integral floats (``4096.0``) are accepted.

    Raises:
        error: naming ``where`` and ``key``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{where}: field {key!r} must be an integer, got {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise error(f"{where}: field {key!r} must be a finite integer, got {value!r}")
    if value < 0:
        raise error(f"{where}: field {key!r} is negative ({value}); sizes and FLOPs are >= 0")
    if value >= MAX_COUNT:
        raise error(f"{where}: field {key!r} is {value:.4g}, not below 2**62; no real step holds that many "
                    "bytes or FLOPs (a unit mix-up?)")
    return int(value)


def reject_unknown(data: Mapping[str, Any], known: Iterable[str], where: str,
                   error: type[CkptError] = GraphError) -> None:
    """Raise ``error`` for the first key of ``data`` not in ``known``, naming the nearest known key."""
    known = list(known)
    for key in data:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"known fields: {', '.join(known)}"
            raise error(f"{where}: unknown field {key!r}; {hint}")


def short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def is_count(v: Any) -> bool:
    """A byte or FLOP count: an integral number in ``[0, MAX_COUNT)`` (numpy integers too)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return False
    return 0 <= v < MAX_COUNT and v == int(v)


def storage_unit(meta: Mapping[str, Any]) -> int:
    """What a graph with this ``meta`` counts each storage up to a multiple of: :data:`CUDA_BLOCK` when it was traced
    for a CUDA target (``meta[TARGET_META]["kind"] == "cuda"``), 1 otherwise. A tensor a plan makes that the trace
    did not (a chunk's share of a call, ``solvers.model.chunks``) is rounded so too."""
    target = meta.get(TARGET_META)
    return CUDA_BLOCK if isinstance(target, Mapping) and target.get("kind") == "cuda" else 1
