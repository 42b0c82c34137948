"""``fit``: the largest batch or sequence that fits a card (``scheduler.sizing.search``), or a parallel layout's
stage plans and smallest card (``scheduler.distributed.fit``), the one entry of both.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..distributed.fit import fit_with_layout
from .budget import BudgetError
from .memory import dtype_name
from .search import FitResult, fit_graphs
from .sized import SizedModel, sized_model

__all__ = ["fit"]


def fit(model: Any, device_memory: int | str | None, *, search: str = "batch", batch: int = 1, seq: int | None = None,
        solvers: Sequence[str] | None = None, options: Mapping[str, Any] | None = None, target: str | None = None,
        loop: str = "held",
        layout: Any = None,
        **kwargs: Any) -> FitResult:
    """The largest batch or sequence of ``model`` that fits a card of ``device_memory``, per solver.

    Example:
        >>> r = scheduler.fit("gpt", "2GiB", search="batch", seq=256, optimizer="adam")
        >>> r.result("dp").size, r.result("store-all").size

    Args:
        model: a :class:`SizedModel`, or a model name understood by
            ``scheduler.models`` (built-in name, ``hf:NAME``, a ``config.json``
            path); hf configs too large for RAM are built on the meta device.
        device_memory: the card, ``"24GiB"`` or bytes.
        search: ``batch`` or ``seq`` (the other is held fixed).
        batch, seq: the fixed size of the dimension not searched.
        solvers: solver names to search with (default :data:`DEFAULT_SOLVERS`).
        options: the model's other options (``layers``, ``width``, ...), as
            ``ckpt trace`` takes them (:func:`~scheduler.sizing.sized.sized_model`).
        target: the device the traces plan for (``scheduler.trace``'s ``target``:
            ``cuda``, a GPU such as ``H100``, or ``cpu``; default: the model's
            device, ``cuda`` for the meta-device builds).
        loop: the training loop a model name is traced for (``scheduler.trace``'s ``loop``).
        layout: a :class:`scheduler.distributed.Layout`: the size searched is
            then the micro-batch (or sequence) one rank runs, ``device_memory``
            one rank's card (None: only the smallest card at ``batch`` and
            ``seq``), ``solvers`` at most one name (default ``ilp``), and the
            answer a :class:`scheduler.distributed.fit.LayoutFit` with the
            stage plans and the smallest card.
        **kwargs: as :func:`fit_graphs` (optimizer, dtype, mixed_precision,
            reserve, max_size, multiple_of, solver_options, progress).

    Raises:
        NothingFits: see :func:`fit_graphs`.
    """
    kwargs["dtype"] = dtype_name(kwargs.get("dtype", "fp32"))
    if not isinstance(model, SizedModel):
        model = sized_model(model, search=search, batch=batch, seq=seq, dtype=kwargs["dtype"], options=options,
                            target=target, loop=loop)
    if layout is not None:
        return fit_with_layout(model, device_memory, layout, solvers=solvers, **kwargs)  # type: ignore[return-value]
    if device_memory is None:
        raise BudgetError("fit needs the card's memory (device_memory); only a layout's smallest card is found "
                          "without one")
    return fit_graphs(model, device_memory, solver_names=solvers, **kwargs)
