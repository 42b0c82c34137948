"""What our region wrappers add to a step, beside torch's own checkpointing of the same block (issue 34).

One transformer block (transformers' ``ViTLayer``: hidden 256, 4 heads, MLP
1024, SDPA attention, fp32, train mode, dropout 0), its forward and backward at
batch 4 x 128 tokens (the issue's shape) and at 1 x 16 tokens (where the
wrappers' fixed cost is not hidden under the kernels), five ways in one process
on one torch thread:

* ``plain``: no checkpointing;
* ``torch ckpt``: ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``;
* ``ours``: ``scheduler.apply`` of a one-region plan (the block, no kept calls);
* ``torch SAC``: torch's ``create_selective_checkpoint_contexts`` with a policy
  keeping every ``addmm`` of the block (its six matrix products);
* ``ours SAC``: our region keeping the same calls (``Plan.save_ops``, NOTE
  [ Selective checkpoint policies ] in ``scheduler.applying.selective``).

Rounds alternate the five (each runs a few steps per round, the order
rotated every round); the page reports per variant the median step over
rounds (wall and CPU time, min-max), its extra time over ``plain``, that
extra per ATen call of the block's forward (what our dispatch modes see), and
ours against torch's for the same recompute. Gradients are checked against
``plain`` once (bitwise). Writes ``benchmarks/results/overhead.md``
(``--quick``: fewer rounds, under ``results/quick/``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from benchmarks.pages import write_page

log = logging.getLogger("benchmarks.overhead")

#: The block's size (the issue's: hidden 256), and the (batch, tokens) shapes measured with steps per round.
HIDDEN, HEADS, MLP = 256, 4, 1024
SHAPES = ((4, 128, 4), (1, 16, 24))
#: Overload the selective variants keep every call of.
KEEP = "aten.addmm.default"
#: Alternated rounds (median over them); a quick run's rounds and steps per round.
ROUNDS = 25
QUICK_ROUNDS, QUICK_STEPS = 5, 2
VARIANTS = ("plain", "torch ckpt", "ours", "torch SAC", "ours SAC")
#: The variants of ``--against CHECKOUT``: that checkout's plain and selective regions.
AGAINST = ("ours @against", "ours SAC @against")


class _Holder(nn.Module):
    """The block as the submodule ``block`` (what the one-region plan names)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def make_block() -> nn.Module:
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTLayer

    cfg = ViTConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=MLP, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return ViTLayer(cfg).train()


def forward_calls(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """ATen calls of one forward by overload, as our modes and torch's SAC count them (``SAC_IGNORED_OPS`` left out)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import SAC_IGNORED_OPS

    counts: dict[str, int] = {}

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func not in SAC_IGNORED_OPS:
                counts[str(func)] = counts.get(str(func), 0) + 1
            return func(*args, **(kwargs or {}))

    with _Count():
        model(x)
    return counts


def _plan(calls: dict[str, int], keep: bool) -> Any:
    from solvers import Plan

    save_ops = ((tuple((KEEP, k) for k in range(calls[KEEP])),) if keep else ())
    save_op_calls = (((KEEP, calls[KEEP]),),) if keep else ()
    return Plan(regions=((0, 0),), modules=("block",), stochastic=(False,), save_ops=save_ops,
                save_op_calls=save_op_calls)


def _keep_policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if func is torch.ops.aten.addmm.default else CheckpointPolicy.PREFER_RECOMPUTE


def _against(checkout: str) -> Any:
    """Another checkout's ``scheduler`` package, imported beside this one as ``scheduler_against`` (its
    imports inside the package are relative; ``solvers`` and ``graphs`` are this tree's)."""
    import importlib
    import shutil
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="overhead_against_"))
    shutil.copytree(Path(checkout) / "scheduler", root / "scheduler_against")
    sys.path.insert(0, str(root))
    return importlib.import_module("scheduler_against")


def variants(x: torch.Tensor, against: Any = None) -> tuple[dict[str, Callable[[], None]], dict[str, nn.Module],
                                                              dict[str, int]]:
    """The steps (each a forward and backward of its own copy of the block), the models, and the calls; with
    ``against`` (another checkout's scheduler package), its two regions beside ours."""
    import scheduler
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    base = _Holder(make_block())
    calls = forward_calls(base, x.detach())
    names = VARIANTS + (AGAINST if against is not None else ())
    models = {name: copy.deepcopy(base) for name in names}
    scheduler.apply(models["ours"], _plan(calls, keep=False), check=False)
    scheduler.apply(models["ours SAC"], _plan(calls, keep=True), check=False)
    if against is not None:
        against.apply(models[AGAINST[0]], _plan(calls, keep=False), check=False)
        against.apply(models[AGAINST[1]], _plan(calls, keep=True), check=False)
    sac = functools.partial(create_selective_checkpoint_contexts, _keep_policy)

    def call(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        m = models[name]
        if name == "torch ckpt":
            return lambda t: checkpoint(m, t, use_reentrant=False)
        if name == "torch SAC":
            return lambda t: checkpoint(m, t, use_reentrant=False, context_fn=sac)
        return m

    def step(name: str) -> Callable[[], None]:
        fn, m = call(name), models[name]

        def run() -> None:
            for p in m.parameters():
                p.grad = None
            x.grad = None
            fn(x).sum().backward()

        return run

    return {name: step(name) for name in names}, models, calls


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def measure(batch: int, seq: int, steps: int, rounds: int, against: Any = None) -> dict[str, Any]:
    """Every variant's per-step wall and CPU seconds, one entry per alternated round, and the block's calls."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(1)
        x = torch.randn(batch, seq, HIDDEN, requires_grad=True)
        runs, models, calls = variants(x, against)
        grads = {}
        for name, run in runs.items():  # warm-up, and gradients against plain
            for _ in range(2):
                run()
            grads[name] = _grads(models[name], x)
        bitwise = {name: all(torch.equal(a, b) for a, b in zip(grads["plain"], g)) for name, g in grads.items()}
        wall: dict[str, list[float]] = {n: [] for n in runs}
        cpu: dict[str, list[float]] = {n: [] for n in runs}
        order = list(runs)
        for r in range(rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                run = runs[name]
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    run()
                wall[name].append((time.perf_counter() - w0) / steps)
                cpu[name].append((time.process_time() - c0) / steps)
    finally:
        torch.set_num_threads(threads)
    return {"batch": batch, "seq": seq, "calls": calls, "rounds": rounds, "steps": steps, "wall": wall, "cpu": cpu,
            "bitwise": bitwise}


def _paired(doc: dict[str, Any], key: str, a: str, b: str) -> float:
    """The median over rounds of ``a``'s step less ``b``'s in the same round (seconds)."""
    return statistics.median(x - y for x, y in zip(doc[key][a], doc[key][b]))


def report(docs: list[dict[str, Any]], load: float | None) -> list[str]:
    lines = [
        f"transformers `ViTLayer` (hidden {HIDDEN}, {HEADS} heads, MLP {MLP}, SDPA), fp32, one torch thread; forward "
        f"and backward of the block. Both selective variants keep every `{KEEP}` of its forward. Rounds alternate "
        "the variants (the order rotated each round); a step's time is the median over rounds, and an extra time is "
        "the median over rounds of the difference to the plain step of the same round (CPU time: the process's, "
        "steadier than wall on a shared machine). Per ATen call is that extra divided by the calls of the block's "
        f"forward (`SAC_IGNORED_OPS` left out). Load average {'-' if load is None else f'{load:.2f}'} at the end.",
    ]
    us = 1e6
    for doc in docs:
        n = sum(doc["calls"].values())
        lines += [
            "",
            f"### batch {doc['batch']} x {doc['seq']} tokens: {n} ATen calls a forward ({doc['calls'].get(KEEP, 0)} "
            f"`{KEEP}`), {doc['rounds']} rounds of {doc['steps']} steps",
            "",
            "| variant | wall (median, min-max) | CPU (median) | extra over plain: wall | CPU | CPU per ATen call "
            "| gradients = plain |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in doc["wall"]:
            w, c = doc["wall"][name], doc["cpu"][name]
            extra_w, extra_c = _paired(doc, "wall", name, "plain"), _paired(doc, "cpu", name, "plain")
            lines.append(f"| {name} | {statistics.median(w) * 1e3:.3f} ms ({min(w) * 1e3:.3f}-{max(w) * 1e3:.3f}) | "
                         f"{statistics.median(c) * 1e3:.3f} ms | {extra_w * 1e3:+.3f} ms | {extra_c * 1e3:+.3f} ms | "
                         f"{extra_c / n * us:+.1f} us | {'bitwise' if doc['bitwise'][name] else 'NO'} |")
        gaps = {(ours, theirs): (_paired(doc, "cpu", ours, theirs), _paired(doc, "wall", ours, theirs))
                for ours, theirs in (("ours", "torch ckpt"), ("ours SAC", "torch SAC"))}
        (plain_c, plain_w), (sac_c, sac_w) = gaps.values()
        if AGAINST[0] in doc["wall"]:
            lines += ["", "This tree less the other checkout, in the same round (CPU; wall): " + "; ".join(
                f"{ours} {_paired(doc, 'cpu', ours, other) * us:+.0f} us; {_paired(doc, 'wall', ours, other) * us:+.0f} us"
                for ours, other in zip(("ours", "ours SAC"), AGAINST))]
        lines += [
            "",
            f"Ours less torch's in the same round, for the same recompute (CPU; wall): plain region "
            f"{plain_c * us:+.0f} us; {plain_w * us:+.0f} us a step ({plain_c / n * us:+.1f} us per call); selective "
            f"{sac_c * us:+.0f} us; {sac_w * us:+.0f} us a step ({sac_c / n * us:+.1f} us per call of the forward, "
            "which both modes see twice: forward and recompute).",
        ]
    return lines


TITLE = "Region overhead: our wrappers against torch's checkpointing of one block"


def main(quick: bool = False, against: str | None = None) -> None:
    """Measure and write the page (``against``: also another checkout's regions; written under ``quick/``)."""
    other = _against(against) if against else None
    docs = [measure(batch, seq, QUICK_STEPS if quick else steps, QUICK_ROUNDS if quick else ROUNDS, other)
            for batch, seq, steps in SHAPES]
    lines = report(docs, os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    if against:
        lines.insert(1, f"\nThe two `@against` rows are the regions of the checkout at `{against}`.")
    for line in lines:
        log.info("%s", line)
    path = write_page("overhead.md", TITLE, lines, quick=quick or bool(against))
    log.info("wrote %s", path)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--against", metavar="CHECKOUT", help="also measure that checkout's regions (its scheduler/) in "
                   "the same rounds; writes results/quick/overhead.md")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    opts = p.parse_args()
    main(quick=opts.quick, against=opts.against)
