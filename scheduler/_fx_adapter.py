"""TEMPORARY stand-in for scheduler.trace.capture (symbolic_trace, rough costs). Removed once trace lands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp
from torch.utils._pytree import tree_flatten

from graphs import Graph, Node


@dataclass(frozen=True)
class Traced:
    gm: torch.fx.GraphModule
    graph: Graph
    members: tuple
    in_spec: Any
    out_spec: Any = None


def _nbytes(meta: Any) -> int:
    tm = meta.get("tensor_meta") if meta else None
    if tm is None or not hasattr(tm, "shape"):
        return 0
    return int(torch.Size(tm.shape).numel()) * torch.empty((), dtype=tm.dtype).element_size()


def capture(model: torch.nn.Module, args: Any, kwargs: Any = None) -> Traced:
    gm = torch.fx.symbolic_trace(model)
    flat, spec = tree_flatten((tuple(args) if isinstance(args, (tuple, list)) else (args,), kwargs or {}))
    ShapeProp(gm).propagate(*flat)
    nodes = []
    names = set()
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr", "output"):
            continue
        ins = tuple(dict.fromkeys(a.name for a in n.all_input_nodes if a.name in names))
        stateful = n.op == "call_module" and isinstance(gm.get_submodule(n.target), torch.nn.modules.batchnorm._NormBase)
        out = _nbytes(n.meta)
        nodes.append(Node(name=n.name, inputs=ins, saves_inputs=ins, out_bytes=out, fwd_flops=out,
                          bwd_flops=2 * out, stateful=stateful, op=str(n.target)))
        names.add(n.name)
    graph = Graph(nodes=tuple(nodes), param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
                  input_bytes=sum(_nbytes({"tensor_meta": t}) if False else t.numel() * t.element_size()
                                  for t in flat if isinstance(t, torch.Tensor)),
                  name=type(model).__name__, meta={"shapes": [list(t.shape) for t in flat if isinstance(t, torch.Tensor)],
                                                   "dtype": str(flat[0].dtype)})
    return Traced(gm=gm, graph=graph, members=tuple((n.name,) for n in nodes), in_spec=spec)
