"""``ckpt apply MODEL PLAN.json [--verify]``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from graphs import BUILD_META, CkptError
from solvers import load_plan

from ..progress import phase
from ..report import table
from .common import add_loop_flag, add_model_arguments, model_options, nonneg_float, positive_int

#: The gradient and loss difference ``--verify`` accepts by default for a chunked plan (sums over rows reassociated).
CHUNKED_ATOL = 1e-5

NAME = "apply"
HELP = "apply a plan to a model as checkpoint regions; --verify runs real steps with and without it"
DESCRIPTION = """Apply PLAN (from `ckpt solve`) onto MODEL itself: each region is one submodule
call (a block, its attention or MLP, a run of nn.Sequential children), whose
forward runs under torch.utils.checkpoint(use_reentrant=False); the model's own
forward, loss and training loop stay as they are. A plan for another model is
refused, naming the first missing or mismatched module path.

MODEL and its options default to those the plan's graph was traced with
(`ckpt trace` records them); give them to apply the plan to another build.

With --verify, the model is traced once for the prediction (and the plan's
fingerprint checked), then warm-up plus --steps training steps run with and
without the plan, side by side: measured peak vs predicted (simulate) vs
budget, step-time ratio (median), predicted recompute ratio, max gradient and
loss difference. Exit status 1 if the plan does not fit its budget or the
gradients differ.

example:
  ckpt trace gpt --layers 4 --seq 256 --batch 2 -o gpt-graph.json
  ckpt solve gpt-graph.json --budget 0.5 -o gpt-plan.json
  ckpt apply gpt-plan.json --verify"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="+", metavar="[MODEL] PLAN",
                   help="plan JSON from `ckpt solve`, optionally preceded by the model (built-in name, hf:NAME or "
                        "package.module:factory; default: the one the plan's graph was traced with)")
    add_model_arguments(p, positional=False)
    p.add_argument("--verify", action="store_true", help="run real steps with and without the plan and compare")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="measured steps of each kind for the time ratio (default 5)")
    p.add_argument("--atol", type=nonneg_float, default=0.0,
                   help=f"largest gradient difference accepted (default 0: bitwise; {CHUNKED_ATOL:g} for a plan with "
                        "chunked calls, whose sums over token rows are reassociated)")
    add_loop_flag(p, default=None, what="run with --verify (default: the plan's)")
    p.add_argument("--no-check", action="store_true",
                   help="apply a plan that carries no fingerprint (its regions must still fit the model's graph)")


def _model_and_options(args: argparse.Namespace, plan: Any) -> tuple[str, dict[str, Any]]:
    recorded = plan.graph_meta.get(BUILD_META) or {}
    if len(args.target) > 2:
        raise CkptError(f"ckpt apply takes [MODEL] PLAN, got {len(args.target)} arguments")
    given = model_options(args)
    if len(args.target) == 2:
        model = args.target[0]
        options = given if model != recorded.get("model") else {**recorded.get("options", {}), **given}
        return model, options
    if not recorded:
        raise CkptError(f"{args.target[0]}: the plan does not record which model it was traced from (a graph not "
                        "written by `ckpt trace`); name it: ckpt apply MODEL PLAN [model options]")
    return str(recorded["model"]), {**recorded.get("options", {}), **given}


def _check_target(plan: Any, model: Any, path: str) -> None:
    """Refuse a plan solved for another kind of device than the one the model runs on here (issue 33: ``ckpt fit``'s
    H100 plan went onto this CPU's model without a word): what it keeps and its peak are that device's."""
    from ..report import describe_target

    target = plan.graph_meta.get("target") or {}
    kind = str(target.get("kind") or "")
    here = next((p.device.type for p in model.parameters()), "cpu")
    if kind and kind != here:
        raise CkptError(f"{path} was solved for {describe_target(target)}, and the model runs on {here} here: what it "
                        f"keeps and its peak are that device's; solve it for this one (ckpt fit ... --target {here}, "
                        f"ckpt trace ... --target {here}), or apply it on a {kind} device")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..applying import apply
    from ..models import build
    from ..measuring.verification import verify

    plan = load_plan(args.target[-1])
    model_name, options = _model_and_options(args, plan)
    torch.manual_seed(0)
    ex = build(model_name, **options)
    _check_target(plan, ex.model, args.target[-1])
    name = model_name if plan.graph_name == model_name else None
    if not args.verify:
        with phase(f"applying the plan to {model_name}"):
            apply(ex.model, plan, check=not args.no_check)
        rows = [(f"[{a}, {b}]", path) for (a, b), path in zip(plan.regions, plan.modules)]
        print(f"applied {len(rows)} checkpoint regions of the {plan.solver} plan to {model_name}")
        print(table(rows, ["region", "submodule call"]))
        return 0
    if args.no_check:
        raise CkptError("--verify checks the plan's fingerprint; drop --no-check, or solve the plan again")
    with phase(f"verifying on {model_name}: warm-up and {args.steps} steps with and without the plan"):
        v = verify(ex.model, plan, ex.args, dict(ex.kwargs), loss=ex.loss, steps=args.steps, name=name, loop=args.loop)
    print(f"{model_name}: {v.regions} regions ({plan.solver}), {args.steps} measured steps each")
    print(table(v.rows(), ["", "with the plan", "without"]))
    atol = args.atol
    if plan.chunks and not atol:  # NOTE [ Chunked head ]: sums over token rows reassociated
        atol = CHUNKED_ATOL
        print(f"chunked calls reassociate sums over token rows: gradients and loss compared within {atol:g}")
    ok = v.fits and v.grads_equal(atol)
    if not v.fits:
        print(f"FAIL: the measured peak, {v.measured_peak_bytes:,} B, is {v.over_budget_bytes:,} B over the budget "
              f"({v.budget_bytes:,} B); predicted {v.predicted_peak_bytes:,} B", file=sys.stderr)
    if not v.grads_equal(atol):
        print("FAIL: gradients, loss or buffers differ from the un-checkpointed step", file=sys.stderr)
    return 0 if ok else 1
