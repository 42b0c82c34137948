"""Which storages the model's return value holds: the graph's ``outputs`` (NOTE [ The user's loop ] in ``graphs.graph``).

NOTE [ Finding the model's outputs ]
    With ``loss=`` the traced module is ``loss(model(...))`` and its graph
    returns the loss alone: the model's own return value (logits, hidden
    states, a key/value cache) is an intermediate, and nothing in the graph
    says which intermediates it was. So the module is traced once as
    :class:`ExposedLoss`, which returns the loss *and* every tensor of the
    model's return value (:func:`tensor_leaves`: through pytree containers,
    ``ModelOutput``, and the attributes of other objects such as
    transformers' ``DynamicCache``), the fx nodes those come from are noted,
    and the graph's output is rewritten to return the loss alone
    (:func:`strip_exposed`): the graph module is then the one a plain
    :class:`~scheduler.tracing.capture.LossWrapper` gives, nodes that fed only
    the exposed values included (they run in the model too). Without
    ``loss=`` the graph's own outputs are the model's. The recorder maps each
    such node's value to the records owning its storages (a returned view
    holds its base), and ``build`` makes them outputs of their cost nodes.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn

from .capture import LossWrapper

__all__ = ["ExposedLoss", "tensor_leaves", "strip_exposed", "returned_nodes", "capture_exposed"]

log = logging.getLogger(__name__)

#: How deep :func:`tensor_leaves` looks into objects that are no pytree container. transformers' encoder-decoder
#: cache needs five hops from the output to a key (``Seq2SeqLMOutput`` -> ``EncoderDecoderCache`` -> ``DynamicCache``
#: -> ``layers`` -> ``DynamicLayer`` -> ``keys``); at 4, T5's held cache went uncounted and a plan for the held loop
#: measured 55,224 B over its budget (``tests/regressions/test_t5_cache_outputs.py``).
_DEPTH = 8


class ExposedLoss(LossWrapper):
    """:class:`LossWrapper` that also returns the tensors of the model's output (for tracing only)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.model(*args, **kwargs)
        return self.loss_fn(out), tuple(tensor_leaves(out))


def tensor_leaves(value: Any) -> list[Any]:
    """The tensors (or fx proxies) ``value`` holds, each once: through pytree containers, and the
    attributes of other objects (a cache object's key and value lists) up to a few levels deep."""
    out: dict[int, Any] = {}
    seen: set[int] = set()

    def walk(v: Any, depth: int) -> None:
        if isinstance(v, (torch.Tensor, torch.fx.Proxy)):
            out.setdefault(id(v), v)
            return
        if depth == 0 or id(v) in seen or isinstance(v, (str, bytes, int, float, bool, type, nn.Module)) or v is None:
            return
        seen.add(id(v))
        leaves = pytree.tree_leaves(v)
        if len(leaves) != 1 or leaves[0] is not v:  # a container pytree knows
            for x in leaves:
                walk(x, depth - 1)
        elif hasattr(v, "__dict__") and not callable(v):
            for x in list(vars(v).values()):
                walk(x, depth - 1)

    walk(value, _DEPTH)
    return list(out.values())


def strip_exposed(gm: torch.fx.GraphModule, method: str) -> tuple[str, ...]:
    """Make ``gm`` (traced from :class:`ExposedLoss`) return the loss alone; the fx node names of
    the model's output tensors it returned besides."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    if method == "export":
        info = gm.graph._codegen.pytree_info  # type: ignore[attr-defined]
        loss, exposed = pytree.tree_unflatten(list(out_node.args[0]), info.out_spec)
        out_node.args = ((loss,),)
        gm.graph._codegen.pytree_info = info._replace(out_spec=pytree.tree_structure(0))  # type: ignore[attr-defined]
    else:
        loss, exposed = out_node.args[0]
        out_node.args = (loss,)
    gm.recompile()
    return tuple(dict.fromkeys(a.name for a in pytree.tree_leaves(exposed) if isinstance(a, torch.fx.Node)))


def returned_nodes(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The fx nodes whose values ``gm`` returns (a model traced without ``loss=``)."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    return tuple(a.name for a in out_node.all_input_nodes)


def capture_exposed(model: nn.Module, loss: Callable[[Any], torch.Tensor], args: tuple, kwargs: dict, *,
                    method: str, capture: Callable[..., tuple[torch.fx.GraphModule, str]]
                    ) -> tuple[torch.fx.GraphModule, str, tuple[str, ...] | None]:
    """``(gm, method used, output node names)`` of ``loss(model(...))`` (NOTE [ Finding the model's outputs ]);
    the names are None (and the graph traced plainly) when the exposed trace fails."""
    try:
        gm, used = capture(ExposedLoss(model, loss), args, kwargs, method=method)
        return gm, used, strip_exposed(gm, used)
    except Exception as exc:  # noqa: BLE001  (the plain trace below raises what the user should see)
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
    gm, used = capture(LossWrapper(model, loss), args, kwargs, method=method)
    log.warning("could not trace %s with its outputs exposed (%s); its outputs are not known, so the graph plans as "
                "if the loop dropped them before the backward (loop='dropped')", type(model).__name__, why)
    return gm, used, None
