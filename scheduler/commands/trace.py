"""``ckpt trace MODEL -o graph.json``."""

from __future__ import annotations

import argparse
from typing import Any

from graphs import BUILD_META, save

from ..report import describe_target, format_seconds
from ..sizing.budget import format_bytes
from .common import add_loop_flag, add_model_arguments, add_target_flag, check_outputs, granularity, model_files, model_options

NAME = "trace"
HELP = "trace a model into a cost graph (recompute costs, bytes autograd saves) and write it as JSON"
DESCRIPTION = """Trace MODEL on example inputs into a cost graph: FLOPs per node
(FlopCounterMode), a recompute cost per node (--costs), output bytes, the bytes
autograd saves (saved_tensors_hooks), stochastic/stateful flags. The model's
training step (forward + loss) is traced.

MODEL: a built-in example (see `ckpt models`), hf:NAME, or package.module:factory.
With --device meta nothing is allocated: plan for a GPU you do not have
(--target: cuda by default, with the attention kernel that GPU would run).

example:
  ckpt trace gpt --layers 2 --width 256 --heads 4 --seq 128 -o graph.json
  ckpt trace hf:llama-7b --device meta --seq 4096 --dtype bfloat16 -o llama.json"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--granularity", default="auto", type=granularity,
                   help="op, fold, auto, or a module depth (int); default auto")
    p.add_argument("--method", default="auto", choices=["auto", "fx", "export"], help="tracer (default: fx, then export)")
    p.add_argument("--costs", choices=["roofline", "time", "flops"], default="roofline",
                   help="what the solvers minimise per node: roofline (default) prices each kernel's FLOPs and "
                        "bytes moved on the device; time measures the forward on this machine (not on meta); "
                        "flops counts FLOPs only")
    add_target_flag(p, "--cost-device")
    p.add_argument("--workspaces", choices=["auto", "none", "measure"], default="auto",
                   help="run each distinct ATen call that may hold buffers inside the op (convolutions, "
                        "attention, normalisations...), forward and backward, once on real kernels of the target and "
                        "count what it allocates beyond the tensors the trace sees; default auto: where the target's "
                        "kernels run here (a cpu target; a CUDA target on its GPU)")
    add_loop_flag(p)
    p.add_argument("-o", "--output", help="write the graph here (JSON)")


def run(args: argparse.Namespace) -> int:
    from ..models import build
    from ..progress import phase
    from .. import applying  # noqa: F401  (NOTE [ Recompute timed in the step ])
    from ..tracing.tracer import capture

    check_outputs([("-o", args.output)], inputs=model_files(args.model))
    ex = build(args.model, **model_options(args))
    with phase(f"tracing {args.model}"):
        traced = capture(ex.model, ex.args, ex.kwargs, loss=ex.loss, granularity=args.granularity,
                         method=args.method, name=args.model, costs=args.costs, target=args.target,
                         workspaces=args.workspaces, loop=args.loop)
    g = traced.graph
    g = g.with_nodes(g.nodes, meta={**g.meta, BUILD_META: {"model": args.model, "options": _json_safe(model_options(args))}})
    print(f"{args.model}: traced with {traced.method}, {len(traced.records)} fx nodes -> {len(g)} graph nodes "
          f"(granularity {traced.granularity})")
    print(f"planned for: {describe_target(g.meta.get('target'))}")
    print(f"parameters {format_bytes(g.param_bytes)}, inputs {format_bytes(g.input_bytes)}, "
          f"forward {g.total_fwd_flops():.3e} FLOPs, backward {g.total_bwd_flops():.3e} FLOPs")
    from solvers import store_all_peak

    held = sum(g.nodes[k].out_bytes for k in g.held_outputs())
    print(f"store-all peak (simulated): {format_bytes(store_all_peak(g).peak_bytes)}, loop {g.loop}"
          + (f" (the model's outputs, {format_bytes(held)}, held through backward)" if held else ""))
    costs = g.meta.get("costs", {})
    if costs.get("flops_per_s"):
        forward_s = sum(g.recompute_costs()) / costs["flops_per_s"]
        print(f"recompute costs: {costs['model']} on {costs.get('device', '?')}, whole forward {format_seconds(forward_s)}")
    if args.output:
        save(g, args.output)
        print(f"graph written to {args.output}")
    return 0


def _json_safe(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in options.items()}
