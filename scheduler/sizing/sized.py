"""A model seen as ``size -> graph`` along one dimension: what ``fit`` searches.

:func:`sized_model` builds the model once (on the ``meta`` device: shapes
only, so a 70B model is sized on a laptop) and traces it at each size the
search asks for. Each graph records how it was built (``graphs.BUILD_META``:
the model name and its options at that size), so a plan solved on it is
applied with ``ckpt apply plan.json`` as a plan from ``ckpt trace`` is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from graphs import BUILD_META, CkptError, Graph

from .budget import BudgetError

__all__ = ["SizedModel", "sized_model"]


@dataclass(frozen=True)
class SizedModel:
    """A model seen as ``size -> graph`` along one dimension.

    Attributes:
        graph_at: traces the model at a size (called once per size; cached).
        dimension: ``batch`` or ``seq``.
        fixed: the other sizes held fixed (for the report).
        params: parameter count (None: derived from the graph's ``param_bytes``).
        trainable: trainable parameter count (None: all).
        max_size: the largest size the model accepts (e.g. its positions).
        name: a label.
    """

    graph_at: Callable[[int], Graph]
    dimension: str = "batch"
    fixed: Mapping[str, int] = field(default_factory=dict)
    params: int | None = None
    trainable: int | None = None
    max_size: int | None = None
    name: str = ""


def sized_model(spec: str, *, search: str = "batch", batch: int = 1, seq: int | None = None, dtype: str = "fp32",
                granularity: Any = None, options: Mapping[str, Any] | None = None, target: str | None = None,
                loop: str = "held") -> SizedModel:
    """``spec`` (a model name) as ``size -> graph`` along ``search``, re-traced at each size.

    hf models (``hf:NAME``, a ``config.json`` path) are built once on the meta
    device (no weights allocated) and traced at each size with token ids and
    labels (the model computes its loss). Built-in names and factories go
    through ``scheduler.models``. The default sequence is the model's (capped at 4096).

    Args:
        options: the model's other options, as ``ckpt trace`` takes them (``layers``, ``width``, ...; for hf
            models ``layers`` and ``attn``), checked the same way.
        target: the device the traces plan for (``scheduler.trace``'s ``target``; default ``cuda``, as
            for any model on ``meta``).
        loop: the training loop each size is traced for (``scheduler.trace``'s ``loop``).

    Raises:
        BudgetError: ``search`` is neither ``batch`` nor ``seq``.
        HFConfigError: an unknown hf name or unreadable config.
        CkptError: an option the model does not take, or a device (fit builds on ``meta``).
    """
    from .. import models
    from ..models import hf_configs as hf

    if search not in ("batch", "seq"):
        raise BudgetError(f"search must be 'batch' or 'seq', got {search!r}")
    options = {k: v for k, v in (options or {}).items() if v is not None}
    taken = sorted(set(options) & {"batch", "seq", "dtype", "device"})
    if taken:
        raise CkptError(f"ckpt fit sets {', '.join(taken)} itself (the sizes it searches or holds, the dtype, and "
                        "the meta device it builds on); give batch and seq as --batch/--seq, the dtype as --dtype")
    is_hf = spec.startswith("hf:") or spec.endswith(".json") or os.path.isdir(spec)
    if is_hf:
        key = spec[3:] if spec.startswith("hf:") else spec
        models.check_options(spec, hf.build, options)
        config = hf.model_config(key, **options)
        module = hf.build_hf_model(config, dtype=dtype, device="meta")
        limit = hf.max_positions(config)
        seq = seq or min(limit or 1024, 4096)
        recorded = spec if key in hf.HF_CONFIGS else None  # what `ckpt apply` can build again by name

        def example(b: int, s: int) -> tuple[Any, tuple, dict, Any, dict]:
            args, kwargs = hf.hf_inputs(config, b, s, device="meta")
            return module, args, kwargs, hf.hf_loss, {**options, "batch": b, "seq": s, "dtype": dtype}
    else:
        build, extra = _builtin(spec, dtype, options)
        limit = None
        first = build(batch=1, **({"seq": seq} if seq else {}))
        module = first.model
        seq = seq or first.options.get("seq")
        recorded = spec

        def example(b: int, s: int | None) -> tuple[Any, tuple, dict, Any, dict]:
            sizes = {k: v for k, v in {"batch": b, "seq": s}.items() if v is not None}
            ex = build(**sizes)
            return ex.model, ex.args, ex.kwargs, ex.loss, {**options, **extra, **sizes}

    def graph_at(size: int) -> Graph:
        from .. import applying  # noqa: F401  (NOTE [ Recompute timed in the step ]: a trace measures plans as they run)
        from ..tracing.tracer import trace

        b, s = (size, seq) if search == "batch" else (batch, size)
        model, args, kwargs, loss, built = example(b, s)
        opts = {k: v for k, v in (("granularity", granularity), ("target", target)) if v is not None}
        opts["loop"] = loop
        g = trace(model, args, kwargs, loss=loss, name=spec, **opts)
        if recorded is None:
            return g
        built = {k: v for k, v in built.items() if k != "device"}
        return g.with_nodes(g.nodes, meta={**g.meta, BUILD_META: {"model": recorded, "options": built}})

    params = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    fixed = {k: v for k, v in ({"seq": seq} if search == "batch" else {"batch": batch}).items() if v is not None}
    return SizedModel(graph_at=graph_at, dimension=search, fixed=fixed, params=params, trainable=trainable,
                      max_size=limit if search == "seq" else None, name=spec)


def _builtin(name: str, dtype: str, options: Mapping[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """``(**sizes) -> Example`` (``scheduler.models``) built on the meta device (shapes only, nothing
    allocated), and the options it adds (``dtype``) that a rebuild needs."""
    import torch

    from .. import models

    factory = models.factory_of(name)
    takes = models.options_of(factory)
    if "dtype" not in takes and dtype not in ("fp32", "float32"):
        raise CkptError(f"model {name} takes no dtype option, so it cannot be sized in {dtype}; give its factory a "
                        "`dtype` keyword, or fit in fp32")
    extra = {"dtype": dtype} if "dtype" in takes else {}
    device = {"device": "meta"} if "device" in takes else {}

    def build(**sizes: Any) -> Any:
        # A factory without a device option builds under torch.device("meta"): shapes only, if it
        # creates its tensors without naming a device.
        with torch.device("meta"):
            return models.build(name, **options, **extra, **device, **sizes)

    return build, extra
