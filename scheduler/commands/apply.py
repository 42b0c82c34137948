"""``ckpt apply MODEL PLAN.json [--verify]``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from graphs import CkptError
from solvers import load_plan

from ..progress import phase
from ..report import table
from .common import nonneg_float, parse_options, positive_int

NAME = "apply"
HELP = "apply a plan to a model as checkpoint regions; --verify runs real steps with and without it"
DESCRIPTION = """Apply PLAN (from `ckpt solve`) to MODEL: the model is traced again on the
same input shapes, the plan's fingerprint is checked (a plan solved for another
model, shape or dtype is refused, saying which), and each region runs under
torch.utils.checkpoint(use_reentrant=False).

With --verify, warm-up plus --steps training steps run with and without the
plan, side by side: measured peak vs predicted (simulate) vs budget, step-time
ratio (median), predicted recompute ratio, max gradient and loss difference.
Exit status 1 if the plan does not fit its budget or the gradients differ.

MODEL is a built-in example (see `ckpt models`), hf:NAME, or
package.module:factory, built with the same options as when it was traced.

example:
  ckpt trace gpt --layers 4 --seq 256 --batch 2 -o graph.json
  ckpt solve graph.json --budget 0.5 -o plan.json
  ckpt apply gpt plan.json --layers 4 --seq 256 --batch 2 --verify"""


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Model-building flags shared by apply and demo."""
    p.add_argument("--batch", type=positive_int, help="batch size")
    p.add_argument("--seq", type=positive_int, help="sequence length (transformers)")
    p.add_argument("--image-size", type=positive_int, dest="image_size", help="image side (CNNs)")
    p.add_argument("--layers", type=positive_int, help="number of layers (transformers)")
    p.add_argument("--dtype", help="float32 (default), bfloat16, float16")
    p.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other option of the model's factory (repeatable), e.g. -O width=256")


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {k: getattr(args, k) for k in ("batch", "seq", "image_size", "layers", "dtype")}
    opts.update(parse_options(args.option, "-O"))
    return opts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="built-in model name, hf:NAME, or package.module:factory")
    p.add_argument("plan", help="plan JSON from `ckpt solve`")
    add_model_arguments(p)
    p.add_argument("--verify", action="store_true", help="run real steps with and without the plan and compare")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="measured steps of each kind for the time ratio (default 5)")
    p.add_argument("--atol", type=nonneg_float, default=0.0,
                   help="largest gradient difference accepted (default 0: bitwise)")
    p.add_argument("--no-check", action="store_true",
                   help="apply a plan that carries no fingerprint (its regions must still fit the model's graph)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..applier import apply
    from ..models import build
    from ..verify import verify

    plan = load_plan(args.plan)
    torch.manual_seed(0)
    ex = build(args.model, **model_options(args))
    name = args.model if plan.graph_name == args.model else None
    if not args.verify:
        with phase(f"applying the plan to {args.model}"):
            applied = apply(ex.model, plan, ex.args, dict(ex.kwargs), loss=ex.loss, name=name,
                            check=not args.no_check)
        rows = [(f"[{r.region[0]}, {r.region[1]}]", r.submodule, r.fx_nodes, "yes" if r.stateful else "")
                for r in applied.regions]
        print(f"applied {len(rows)} checkpoint regions of the {plan.solver} plan to {args.model}")
        print(table(rows, ["region", "submodule", "fx nodes", "buffers restored"]))
        return 0
    if args.no_check:
        raise CkptError("--verify checks the plan's fingerprint; drop --no-check, or solve the plan again")
    with phase(f"verifying on {args.model}: warm-up and {args.steps} steps with and without the plan"):
        v = verify(ex.model, plan, ex.args, dict(ex.kwargs), loss=ex.loss, steps=args.steps, name=name)
    print(f"{args.model}: {v.regions} regions ({plan.solver}), {args.steps} measured steps each")
    print(table(v.rows(), ["", "with the plan", "without"]))
    ok = v.fits and v.grads_equal(args.atol)
    if not v.fits:
        print("FAIL: the measured peak is over the budget", file=sys.stderr)
    if not v.grads_equal(args.atol):
        print("FAIL: gradients, loss or buffers differ from the un-checkpointed step", file=sys.stderr)
    return 0 if ok else 1
