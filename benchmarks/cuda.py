"""On a CUDA GPU: the plan fits by the allocator, leaves gradients and BatchNorm unchanged, and is timed against theirs.

Everything else under ``benchmarks/results/`` is measured on this project's
CPU machine; a plan is for the card it is traced on or named for, and this
suite checks it there. Per model, fp32, one GPU:

* a warm-up step first (cuBLAS and cuDNN keep the workspaces they take on
  first use; what they keep is on the page);
* the plain step (no checkpointing) and theirs (transformers'
  ``gradient_checkpointing_enable()`` with its defaults on the LMs; every block
  of the model's block list under ``torch.utils.checkpoint`` on the vision
  models): peak by the allocator (``torch.cuda.max_memory_allocated`` over
  the step, plus what was allocated before it: parameters and inputs), the
  plain step's peak beside the prediction of the store-all plan;
* plans from a trace on the GPU (target: the card, workspaces measured on
  it): the pick at their peak (``ilp`` over the head and MLP chunk menus,
  as ``time_truth`` picks), and the least budget's plan; and a plan from the
  same model built on ``meta`` and traced for the card by name (planning
  with no GPU), at their peak;
* each plan applied onto the model: its allocator peak against its
  prediction, its gradients against the plain step's (the plain step against
  itself first: the noise of the card's non-deterministic kernels), BatchNorm
  running statistics after one step against the plain step's, and its step
  time against theirs and the plain step (alternated rounds, CUDA-synchronised
  wall clock, medians);
* the pick once more under ``torch.autocast("cuda", torch.bfloat16)`` on a
  trace in fp32: its peak against the fp32 prediction (a bound, not a
  prediction);
* ``benchmarks.generated``'s random modules x random plans (``--generated
  N`` modules) built, traced and stepped on the card: the allocator's peak
  and the bytes requested against the prediction, loss, gradients and
  buffers against the unplanned twin.

Writes ``benchmarks/results/cuda.md`` and ``cuda.json``. Run on a machine with
a CUDA GPU: ``python -m benchmarks.cuda`` (``--deadline S`` stops starting
models after S seconds; ``--device cpu --quick``: tiny models on the CPU, a
dry run of the suite's logic, written under ``results/quick/``).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

import scheduler
import solvers
from scheduler.measuring.steps import allocator_step_peak, grad_difference, grad_snapshot
from scheduler.measuring.storages import live_bytes_of
from scheduler.measuring.training import step_tensors
from scheduler.sizing.budget import format_bytes
from solvers.model.chunks import find_calls

from benchmarks.pages import out_dir, write_page

log = logging.getLogger(__name__)

#: Per ``ilp`` solve (the wall clock a user's limit keeps).
TIME_LIMIT_S = 10.0
ROUNDS, TIMED = 7, 2
CHUNKS = (1, 2, 4)
#: Random modules of ``benchmarks.generated`` stepped on the card (``--generated``), and with ``--quick``.
GENERATED, GENERATED_QUICK = 100, 2
#: No random module is started after this many seconds of them.
GENERATED_S = 150.0
#: Their gradients' difference from the unplanned twin's still counted as equal, relative to the largest gradient.
GENERATED_RTOL = 1e-5


# ---------------------------------------------------------------------------------------------- models
@dataclass
class Case:
    """A model to measure: how to build it on a device, its inputs there, its loss, and their checkpointing."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.device], tuple[tuple, dict]]
    loss: Callable[[Any], torch.Tensor]
    lm: bool
    what: str = ""
    extra: dict = field(default_factory=dict)


def _lm_loss(out: Any) -> torch.Tensor:
    return out.loss


def _same(out: Any) -> torch.Tensor:
    return out


def _lm_case(name: str, make_config: Callable[[], Any], cls: str, batch: int, seq: int, vocab: int, what: str
             ) -> Case:
    def build() -> nn.Module:
        import transformers

        return getattr(transformers, cls)(make_config())

    def inputs(device: torch.device) -> tuple[tuple, dict]:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        return (), {"input_ids": ids, "labels": ids}

    return Case(name, build, inputs, _lm_loss, True, what)


def _vision_case(name: str, build_net: Callable[[], nn.Module], logits: Callable[[Any], torch.Tensor] | None,
                 batch: int, side: int, classes: int, what: str, wrap: bool = True) -> Case:
    def inputs(device: torch.device) -> tuple[tuple, dict]:
        g = torch.Generator().manual_seed(0)
        images = torch.randn(batch, 3, side, side, generator=g).to(device)
        labels = torch.randint(0, classes, (batch,), generator=g).to(device)
        return (images, labels), {}

    from benchmarks.time_truth import _Loss  # a classifier returning its cross-entropy loss

    def build() -> nn.Module:
        return _Loss(build_net(), logits) if logits is not None else _Loss(build_net())

    return Case(name, build if wrap else build_net, inputs, _same, False, what)


def cases(tiny: bool = False) -> list[Case]:
    """The models: sizes that train in a few GiB on a GPU, or ``tiny`` ones for a CPU dry run."""
    import transformers

    if tiny:
        gpt2 = lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=64)  # noqa: E731
        llama = lambda: transformers.LlamaConfig(  # noqa: E731
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=1000, max_position_embeddings=64)
        vit = lambda: transformers.ViTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3,  # noqa: E731
                                             intermediate_size=96, image_size=32, patch_size=8, num_labels=10)
        return [
            _lm_case("gpt2", gpt2, "GPT2LMHeadModel", 2, 64, 1000, "tiny GPT-2"),
            _lm_case("llama", llama, "LlamaForCausalLM", 2, 64, 1000, "tiny Llama"),
            _vision_case("vit", lambda: transformers.ViTForImageClassification(vit()), lambda o: o.logits, 2, 32, 10,
                         "tiny ViT"),
            _vision_case("resnet", _tiny_resnet, None, 4, 32, 10, "tiny ResNet (its forward returns the loss)",
                         wrap=False),
        ]
    llama = lambda: transformers.LlamaConfig(  # noqa: E731
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=2048)
    return [  # the vision models first: torchvision's traces with fx, transformers' with export
        _vision_case("resnet50", _resnet50, None, 64, 224, 1000,
                     "torchvision resnet50 (25.6M, BatchNorm), batch 64 x 224^2"),
        _lm_case("gpt2", transformers.GPT2Config, "GPT2LMHeadModel", 8, 1024, 50257,
                 "GPT2Config() as shipped (124M, use_cache on, dropout 0.1), batch 8 x 1024 tokens"),
        _lm_case("llama", llama, "LlamaForCausalLM", 4, 2048, 32000,
                 "Llama, hidden 1024, 8 layers, GQA 16/4, vocab 32,000 (156M), batch 4 x 2048 tokens"),
        _vision_case("vit-b16", lambda: transformers.ViTForImageClassification(transformers.ViTConfig(num_labels=1000)),
                     lambda o: o.logits, 64, 224, 1000, "ViTConfig() as shipped (ViT-B/16, 86M), batch 64 x 224^2"),
    ]


def _resnet50() -> nn.Module:
    import torchvision

    return torchvision.models.resnet50(weights=None)


def _tiny_resnet() -> nn.Module:
    from scheduler.models.cnn import build_resnet

    here = str(torch.empty(0).device)  # meta inside _meta_graph's torch.device("meta")
    net, _, _ = build_resnet(batch=1, depth=26, width=8, image_size=32, classes=10, device=here)
    return net


def _blocks(model: nn.Module) -> list[nn.Module]:
    """Theirs for a vision model: the children of its largest block lists (``nn.ModuleList``/``nn.Sequential`` of
    more than one module), as one checkpoint per block."""
    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1
             and all(len(list(c.parameters())) for c in m)]
    if not lists:
        return []
    best = max(len(m) for m in lists)
    if any(isinstance(m, nn.ModuleList) for m in lists if len(m) == best):
        return [c for m in lists if len(m) == best and isinstance(m, nn.ModuleList) for c in m]
    # torchvision ResNets: layer1..layer4, each a Sequential of blocks
    return [c for m in lists if all(type(c).__name__ in ("Bottleneck", "BasicBlock", "Block") for c in m) for c in m]


@dataclass(frozen=True)
class Side:
    name: str
    on: Callable[[], Any]
    off: Callable[[], Any]


def theirs_side(case: Case, model: nn.Module) -> Side:
    if case.lm:
        return Side("theirs", model.gradient_checkpointing_enable, model.gradient_checkpointing_disable)
    from benchmarks.time_truth import _per_block  # every block's call under non-reentrant checkpoint

    mods = _blocks(model)
    if not mods:
        raise RuntimeError(f"{case.name}: no block list found for per-block checkpointing")
    side = _per_block(lambda _: mods)(model)
    return Side("theirs", side.on, side.off)


def ours_side(name: str, model: nn.Module, plan: Any) -> Side:
    return Side(name, lambda: scheduler.apply(model, plan), lambda: scheduler.remove(model))


PLAIN = Side("plain", lambda: None, lambda: None)


# ---------------------------------------------------------------------------------------------- measuring
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model: nn.Module, args: tuple, kwargs: dict, loss: Callable[[Any], torch.Tensor],
              device: torch.device, autocast: bool = False) -> Callable[[], None]:
    def step() -> None:  # the loop the trace plans for by default ("held": the output lives through backward)
        model.zero_grad(set_to_none=True)
        if autocast:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out = model(*args, **kwargs)
                value = loss(out)
        else:
            out = model(*args, **kwargs)
            value = loss(out)
        value.backward()
        del out, value
    return step


def peak_with(side: Side, model: nn.Module, args: tuple, kwargs: dict, loss: Callable, device: torch.device,
              autocast: bool = False) -> int:
    """The allocator's peak of one step with ``side`` installed (parameters, inputs and the step)."""
    return peaks_with(side, model, args, kwargs, loss, device, autocast)[0]


def peaks_with(side: Side, model: nn.Module, args: tuple, kwargs: dict, loss: Callable, device: torch.device,
               autocast: bool = False) -> tuple[int, int | None]:
    """``(allocated, requested)`` peaks of one step with ``side`` installed, each with the parameters, buffers and
    inputs: on CUDA as ``allocator_step_peak`` measures (the allocator's blocks), and the bytes the step's
    tensors asked for (``requested_bytes``: before the allocator rounds them up and hands out whole cached
    blocks); elsewhere ``allocator_step_peak``'s and None."""
    side.on()
    try:
        if device.type != "cuda":
            if autocast:
                return -1, None
            return allocator_step_peak(model, model, args, kwargs, loss), None
        step = make_step(model, args, kwargs, loss or _same, device, autocast=autocast)
        model.zero_grad(set_to_none=True)
        live = live_bytes_of(step_tensors(model, args, kwargs))
        _sync(device)
        base = torch.cuda.memory_allocated(device)
        base_req = torch.cuda.memory_stats(device).get("requested_bytes.all.current", 0)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        _sync(device)
        stats = torch.cuda.memory_stats(device)
        requested = stats.get("requested_bytes.all.peak")
        return (torch.cuda.max_memory_allocated(device) - base + live,
                None if requested is None else requested - base_req + live)
    finally:
        side.off()


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_buffers()}


def _restore(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(state[k])


def grads_and_stats(side: Side, model: nn.Module, step: Callable[[], None], start: dict[str, torch.Tensor],
                    reference: list | None, ref_stats: dict | None) -> tuple[list, dict, float, float, float | None]:
    """One seeded step with ``side``: its gradients, buffers, the gradients' largest difference from
    ``reference`` (absolute and relative) and the buffers' from ``ref_stats`` (None when there are none)."""
    params = [p for p in model.parameters() if p.requires_grad]
    _restore(model, start)
    side.on()
    try:
        torch.manual_seed(0)
        step()
    finally:
        side.off()
    grads = grad_snapshot(params)
    stats = _state(model)
    diff = grad_difference(params, reference) if reference is not None else (0.0, 0.0)
    stat_diff = None
    if ref_stats is not None and stats:
        stat_diff = max(float((stats[k].double() - ref_stats[k].double()).abs().max()) for k in stats)
    _restore(model, start)
    return grads, stats, diff[0], diff[1], stat_diff


def rounds(step: Callable[[], None], sides: Sequence[Side], device: torch.device, n: int, timed: int = TIMED
           ) -> dict[str, list[float]]:
    """``n`` rounds over every side in turn, the order reversed every other round: per side and round the best of
    ``timed`` synchronised steps after a warm-up step."""
    out: dict[str, list[float]] = {s.name: [] for s in sides}
    for r in range(n):
        for side in (sides if r % 2 == 0 else list(reversed(sides))):
            side.on()
            try:
                step()
                best = float("inf")
                for _ in range(timed):
                    _sync(device)
                    t0 = time.perf_counter()
                    step()
                    _sync(device)
                    best = min(best, time.perf_counter() - t0)
                out[side.name].append(best)
            finally:
                side.off()
    return out


def dispatch_table(device: torch.device) -> list[tuple[str, str, str]]:
    """``(case, the card's SDPA kernel, ours)`` over dtypes, grouped heads, causality and head sizes."""
    from scheduler.tracing.attention import cuda_sdpa_backend

    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
    capability = torch.cuda.get_device_capability(device)
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for gqa in (False, True):
            for causal in (False, True):
                for d in (64, 128, 256):
                    q = torch.randn(2, 16, 256, d, device=device, dtype=dtype, requires_grad=True)
                    kv = torch.randn(2, 4 if gqa else 16, 256, d, device=device, dtype=dtype, requires_grad=True)
                    try:
                        card = names.get(int(torch.ops.aten._fused_sdp_choice(
                            q, kv, kv, None, 0.0, causal, scale=None, enable_gqa=gqa)), "?")
                    except Exception as exc:  # an older torch without enable_gqa
                        card = f"({type(exc).__name__})"
                    ours = cuda_sdpa_backend(capability, q, kv, kv, is_causal=causal, enable_gqa=gqa)
                    rows.append((f"{str(dtype).split('.')[-1]}, {'GQA 16/4' if gqa else '16 heads'}, "
                                 f"{'causal' if causal else 'full'}, D {d}", card, ours))
    return rows


# ---------------------------------------------------------------------------------------------- plans
def _menus(graph: Any, lm: bool) -> dict:
    if not lm:
        return {}
    return dict(chunks=CHUNKS, mlp_chunks=CHUNKS if find_calls(graph) else None)


def _least(graph: Any, lm: bool) -> int | None:
    try:
        scheduler.solve(graph, 1, "ilp", time_limit_s=TIME_LIMIT_S, **_menus(graph, lm))
    except solvers.InfeasibleBudget as exc:
        return exc.min_feasible_bytes
    return None


def _what(plan: Any) -> str:
    chunks = ", ".join(f"{m} x{k}" for m, (_, _, k) in zip(plan.chunk_modules, plan.chunks)) if plan.chunks else ""
    parts = [f"{len(plan.regions)} regions", f"{len(plan.saved)} kept" if plan.saved else "", chunks]
    return "; ".join(p for p in parts if p)


def _meta_graph(case: Case, device: torch.device, card: str) -> Any:
    """The model built on ``meta`` and traced for ``card`` by name: a plan made with no GPU."""
    with torch.device("meta"):
        torch.manual_seed(0)
        model = case.build().train()
    args, kwargs = case.inputs(torch.device("meta"))
    return scheduler.trace(model, args, kwargs, loss=case.loss if case.lm else None, target=card)


def _on_card(plan: Any, mgraph: Any, graph: Any) -> int | str:
    """The card trace's prediction for the meta trace's plan (carried over by :func:`carry_plan`): where it differs
    from the meta trace's own, the two graphs differ in what the plan adds."""
    try:
        return scheduler.simulate(graph, carry_plan(plan, mgraph, graph)).peak_bytes
    except Exception as exc:  # a call of the meta trace the card's has not: said on the page
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


def carry_plan(plan: Any, src: Any, dst: Any) -> Any:
    """``plan`` (solved on ``src``) as a plan of ``dst``, a trace of the same model: its chunked calls, regions and
    inner regions by module path (a region that is no call by its end nodes' names), its kept nodes by name.
    The graphs may differ in nodes the plan does not name (a meta trace has forward holds a card's has not)."""
    from solvers.model.chunks import LOSS_SUFFIX, expand, find_tail
    from solvers.model.plan import Plan

    chunks = []
    for (_, _, k), path in zip(plan.chunks, plan.chunk_modules):
        if path.endswith(LOSS_SUFFIX):
            chunks.append((find_tail(dst).first, len(dst) - 1, k))
        else:
            (sp,) = [s for s in dst.spans if s.module == path]
            chunks.append((sp.first, sp.last, k))
    mine, theirs = expand(src, plan.chunks), expand(dst, tuple(chunks))
    calls: dict[str, tuple[int, int]] = {}
    for sp in theirs.spans:
        calls.setdefault(sp.module, (sp.first, sp.last))
    at = {nd.name: i for i, nd in enumerate(theirs.nodes)}

    def carried(regions: Any) -> list[tuple[int, int]]:
        out = []
        for a, b in regions:
            path = mine.span_module((a, b))
            out.append(calls[path] if path else (at[mine.nodes[a].name], at[mine.nodes[b].name]))
        return out

    saved = tuple(sorted(at[mine.nodes[i].name] for i in plan.saved))
    return Plan.from_regions(dst, carried(plan.regions), chunks=tuple(chunks), saved=saved,
                             inner=tuple(carried(plan.inner)))


def run_case(case: Case, device: torch.device, n_rounds: int) -> dict:
    res: dict[str, Any] = dict(model=case.name, what=case.what, plans=[], errors=[])
    torch.manual_seed(0)
    model = case.build().to(device).train()
    args, kwargs = case.inputs(device)
    loss = case.loss if case.lm else None
    loss_fn = case.loss
    step = make_step(model, args, kwargs, loss_fn, device)
    theirs = theirs_side(case, model)
    res["params"] = sum(p.numel() for p in model.parameters())
    # a warm-up step: cuBLAS and cuDNN take their workspaces from the caching allocator on first use and keep
    # them (on the H200, the first plain step measured 24-65 MB above the prediction, the next ones at or under it)
    step()
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        _sync(device)
        res["library_bytes"] = torch.cuda.memory_allocated(device) - live_bytes_of(step_tensors(model, args, kwargs))
    res["plain_peak"], res["plain_requested"] = peaks_with(PLAIN, model, args, kwargs, loss, device)
    res["their_peak"], res["their_requested"] = peaks_with(theirs, model, args, kwargs, loss, device)

    t0 = time.perf_counter()
    graph = scheduler.trace(model, args, kwargs, loss=loss)
    res["trace_s"] = time.perf_counter() - t0
    res["target"] = graph.meta.get("target", {}).get("device")
    res["attention"] = graph.meta.get("target", {}).get("attention")
    if device.type == "cuda":
        res["dispatch"] = dispatch_table(device)
    res["plain_predicted"] = scheduler.simulate(graph).peak_bytes

    plans: list[tuple[str, Any]] = []
    t0 = time.perf_counter()
    try:
        plans.append(("pick at their peak", scheduler.solve(graph, res["their_peak"], "ilp",
                                                            time_limit_s=TIME_LIMIT_S, **_menus(graph, case.lm))))
    except Exception as exc:
        res["errors"].append(f"pick: {type(exc).__name__}: {exc}")
    res["solve_s"] = time.perf_counter() - t0
    least = _least(graph, case.lm)
    res["least"] = least
    if least is not None:
        try:
            plans.append(("least budget", scheduler.solve(graph, least, "ilp", time_limit_s=TIME_LIMIT_S,
                                                          **_menus(graph, case.lm))))
        except Exception as exc:
            res["errors"].append(f"least: {type(exc).__name__}: {exc}")
    try:
        card = torch.cuda.get_device_name(device) if device.type == "cuda" else "H100"
        t0 = time.perf_counter()
        mgraph = _meta_graph(case, device, card)
        res["meta_plain_predicted"] = scheduler.simulate(mgraph).peak_bytes
        res["meta_attention"] = mgraph.meta.get("target", {}).get("attention")
        mplan = scheduler.solve(mgraph, res["their_peak"], "ilp", time_limit_s=TIME_LIMIT_S, **_menus(mgraph, case.lm))
        plans.append(("meta trace for the card, at their peak", mplan))
        res["meta_s"] = time.perf_counter() - t0
        res["meta_on_card"] = _on_card(mplan, mgraph, graph)
    except Exception as exc:
        res["errors"].append(f"meta: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    # gradients and BatchNorm statistics: the plain step against itself (noise), theirs and every plan
    start = _state(model)
    ref, ref_stats, _, _, _ = grads_and_stats(PLAIN, model, step, start, None, None)
    _, _, noise, noise_rel, noise_stats = grads_and_stats(PLAIN, model, step, start, ref, ref_stats)
    _, _, their_abs, their_rel, their_stats = grads_and_stats(theirs, model, step, start, ref, ref_stats)
    res.update(noise=noise_rel, noise_stats=noise_stats, their_grad=their_rel, their_stats=their_stats)
    sides = [PLAIN, theirs]
    for label, plan in plans:
        side = ours_side(label, model, plan)
        row: dict[str, Any] = dict(label=label, plan=_what(plan), predicted=plan.peak_bytes,
                                   extra_predicted=plan.findings.get("extra_time_s"))
        try:
            row["measured"], row["requested"] = peaks_with(side, model, args, kwargs, loss, device)
            _, _, _, row["grad"], row["stats"] = grads_and_stats(side, model, step, start, ref, ref_stats)
            sides.append(side)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("%s %s failed", case.name, label, exc_info=True)
        res["plans"].append(row)
    pick = next(((lbl, p) for lbl, p in plans if lbl.startswith("pick")), None)
    if pick is not None and device.type == "cuda":
        try:
            res["autocast_peak"] = peak_with(ours_side("pick", model, pick[1]), model, args, kwargs, loss_fn, device,
                                             autocast=True)
            res["autocast_plain_peak"] = peak_with(PLAIN, model, args, kwargs, loss_fn, device, autocast=True)
            res["autocast_their_peak"] = peak_with(theirs, model, args, kwargs, loss_fn, device, autocast=True)
        except Exception as exc:
            res["errors"].append(f"autocast: {type(exc).__name__}: {exc}")
    _restore(model, start)
    times = rounds(step, sides, device, n_rounds)
    res["times"] = times
    res["rounds"] = n_rounds
    return res


# ---------------------------------------------------------------------------------------------- page
def _ms(s: float | None) -> str:
    return "-" if s is None else f"{1e3 * s:.1f}"


def _over(x: int | None, predicted: int) -> str:
    return "-" if x is None else f"{x / predicted:.3f}"


def _e(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _ratio(a: list[float], b: list[float]) -> str:
    r = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})" if r else "-"


def page(results: Sequence[dict], failed: Sequence[str], device: str, wall_s: float) -> list[str]:
    out = [f"Plans on {device}, fp32, checked by the allocator there (`torch.cuda.max_memory_allocated` over the "
           "step plus what was allocated before it: parameters and inputs). Gradients: the largest difference from "
           "the plain step's, relative to the largest gradient; the plain step against itself gives the noise of "
           "the card's non-deterministic kernels. Buffers (BatchNorm's running statistics and step count): the largest "
           "difference of any buffer after one step from the plain step's. Requested: the peak of the bytes the "
           "step's tensors asked for (`requested_bytes`), before the allocator rounds each up to 512 B and hands "
           "out whole cached blocks. Step times: wall clock between CUDA synchronisations, the best of "
           f"{TIMED} steps after a warm-up per turn, {max((r['rounds'] for r in results), default=ROUNDS)} rounds over "
           "every side in turn (order reversed each "
           f"round); ratios are medians of the rounds' ratios (min-max). `ilp` solves keep a {TIME_LIMIT_S:.0f} s "
           f"limit. Suite wall time {wall_s:.0f} s.", "", "## Models", ""]
    for r in results:
        out.append(f"- {r['model']}: {r['what']}; traced on the card in {r['trace_s']:.1f} s (target "
                   f"{r['target']}), pick solved in {r['solve_s']:.1f} s"
                   + (f", meta trace and solve {r['meta_s']:.1f} s" if r.get("meta_s") else ""))
    metas = [r for r in results if r.get("meta_plain_predicted")]
    if metas:
        out += ["", "## Planned with no GPU", "",
                "The model built on `meta` and traced for the card by name, against the trace on the card (which "
                "also measures each op's workspace there) and the plain step measured after a warm-up step.", "",
                "| model | attention (meta) | attention (card) | store-all predicted on meta | on the card | "
                "meta / card | plain measured / meta |", "|---|---|---|---|---|---|---|"]
        for r in metas:
            m, g = r["meta_plain_predicted"], r["plain_predicted"]
            out.append(f"| {r['model']} | {r.get('meta_attention') or '-'} | {r.get('attention') or '-'} | "
                       f"{format_bytes(m)} | {format_bytes(g)} | {m / g:.4f} | {r['plain_peak'] / m:.4f} |")
    if any(r.get("dispatch") for r in results):
        rows = next(r["dispatch"] for r in results if r.get("dispatch"))
        agree = sum(a == b for _, a, b in rows)
        out += ["", "## Attention dispatch", "",
                f"`torch.ops.aten._fused_sdp_choice` on the card against `cuda_sdpa_backend` for its capability "
                f"(q [2, 16, 256, D], no mask, no dropout): {agree} of {len(rows)} agree.", "",
                "| case | card | ours |", "|---|---|---|"] + [f"| {c} | {a} | {b} |" for c, a, b in rows]
    kept = [r for r in results if r.get("library_bytes") is not None]
    if kept:
        out += ["", "Kept by libraries across steps after a warm-up step (cuBLAS and cuDNN workspaces: allocated "
                "before every measured step, so outside both the measured peaks and the predictions below; the "
                "card holds them too): " + ", ".join(f"{r['model']} {format_bytes(r['library_bytes'])}"
                                                     for r in kept) + "."]
    out += ["", "## Fit: predicted against the allocator", "",
            "| model | plan | what | predicted | measured | measured / predicted | fits | requested / predicted | "
            "grads (rel.) | buffers |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['model']} | plain (store all) | - | {format_bytes(r['plain_predicted'])} | "
                   f"{format_bytes(r['plain_peak'])} | {r['plain_peak'] / r['plain_predicted']:.3f} | "
                   f"{'yes' if r['plain_peak'] <= r['plain_predicted'] else 'NO'} | "
                   f"{_over(r.get('plain_requested'), r['plain_predicted'])} | {r['noise']:.1e} (noise) | "
                   f"{_e(r['noise_stats'])} |")
        out.append(f"| {r['model']} | theirs | library checkpointing | - | {format_bytes(r['their_peak'])} | - | - | - | "
                   f"{r['their_grad']:.1e} | {_e(r['their_stats'])} |")
        for p in r["plans"]:
            if "error" in p:
                out.append(f"| {r['model']} | {p['label']} | {p['plan']} | {format_bytes(p['predicted'])} | "
                           f"failed: {p['error']} | | | | | |")
                continue
            out.append(f"| {r['model']} | {p['label']} | {p['plan']} | {format_bytes(p['predicted'])} | "
                       f"{format_bytes(p['measured'])} | {p['measured'] / p['predicted']:.3f} | "
                       f"{'yes' if p['measured'] <= p['predicted'] else 'NO'} | "
                       f"{_over(p.get('requested'), p['predicted'])} | {p['grad']:.1e} | "
                       f"{_e(p['stats'])} |")
    moved = [r for r in results if r.get("meta_on_card") is not None]
    if moved:
        out += ["", "The meta trace's plan predicted by the card's trace (regions and head chunks carried over by "
                "node name; kept ops not): " + "; ".join(
                    f"{r['model']} " + (format_bytes(r['meta_on_card']) if isinstance(r['meta_on_card'], int)
                                        else r['meta_on_card']) for r in moved) + "."]
    out += ["", "## Time", "",
            "Extra time: the side's least step over the rounds less the plain step's least; predicted: the plan's "
            "`extra_time_s` (recompute on the card's roofline plus the plan's overheads).", "",
            "| model | side | step ms (median) | / theirs | / plain | extra ms measured | extra ms predicted |",
            "|---|---|---|---|---|---|---|"]
    for r in results:
        t = r["times"]
        plain_least = min(t["plain"])
        preds = {p["label"]: p.get("extra_predicted") for p in r["plans"]}
        for name, series in t.items():
            out.append(f"| {r['model']} | {name} | {_ms(statistics.median(series))} | "
                       f"{_ratio(series, t['theirs'])} | {_ratio(series, t['plain'])} | "
                       f"{_ms(min(series) - plain_least) if name != 'plain' else '-'} | {_ms(preds.get(name))} |")
    ac = [r for r in results if r.get("autocast_peak")]
    if ac:
        out += ["", "## Under bf16 autocast (the fp32 trace's plan)", "",
                "| model | plain | theirs | pick | pick's fp32 prediction | pick under it |", "|---|---|---|---|---|---|"]
        for r in ac:
            pred = next((p["predicted"] for p in r["plans"] if p["label"].startswith("pick")), None)
            out.append(f"| {r['model']} | {format_bytes(r['autocast_plain_peak'])} | "
                       f"{format_bytes(r['autocast_their_peak'])} | {format_bytes(r['autocast_peak'])} | "
                       f"{format_bytes(pred) if pred else '-'} | "
                       f"{'yes' if pred and r['autocast_peak'] <= pred else 'NO'} |")
    errors = [f"{r['model']}: {e}" for r in results for e in r["errors"]] + list(failed)
    if errors:
        out += ["", "## Not measured", ""] + [f"- {e}" for e in errors]
    return out


def _run_isolated(name: str, device: str, quick: bool, timeout_s: float, n_rounds: int, generated: int = 0) -> dict:
    """``run_case`` of the model ``name`` (or ``run_generated``: "generated") in a child process (``-X
    faulthandler``): a crash there (a segfault in a tracer) costs one model, and its Python stack is on the page."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        part = f"{tmp}/part.json"
        cmd = [sys.executable, "-X", "faulthandler", "-m", "benchmarks.cuda", "--device", device, "--only", name,
               "--part", part, "--rounds", str(n_rounds), "--generated", str(generated)] + (["--quick"] if quick else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"did not finish in {timeout_s:.0f} s") from None
        sys.stderr.write(proc.stderr[-20000:])
        sys.stdout.write(proc.stdout)
        try:
            with open(part, encoding="utf-8") as fh:
                return json.load(fh)
        except OSError:
            stack = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith(("File", "Fatal", "Current"))]
            raise RuntimeError(f"exit status {proc.returncode}: " + " / ".join(stack[:12])) from None


def run_generated(device: torch.device, seeds: int) -> dict:
    """``benchmarks.generated``'s random modules x random plans, built, traced and stepped on ``device``."""
    from benchmarks.generated import failures, run, table

    t0 = time.perf_counter()
    rows, untraced = run(range(seeds), device, rtol=GENERATED_RTOL, stop_after_s=GENERATED_S)
    done = len({r.module for r in rows}) + len(untraced)
    return dict(seeds=done, pairs=len(rows), seconds=time.perf_counter() - t0, table=table(rows),
                failures=failures(rows), untraced=untraced)


def _generated_section(gen: dict) -> list[str]:
    return ["", "## Random modules on the card", "",
            f"`benchmarks.generated` on the card: {gen['seeds']} random modules (seeds 0..{gen['seeds'] - 1} of "
            f"`benchmarks/random_modules.py`), {gen['pairs']} (module, plan) pairs in {gen['seconds']:.0f} s, each "
            "module built, traced (workspaces measured on the card) and stepped there, each plan applied onto a fresh "
            "copy and stepped once against its unplanned twin. Allocator: `torch.cuda.max_memory_allocated` over "
            "the step (each block rounded up to 512 B, and these modules' tensors are a few KiB); requested: the "
            "bytes asked for (`requested_bytes`), what the prediction models. Matched: loss, gradients and buffers "
            f"within {GENERATED_RTOL:g} of the largest gradient (the card's non-deterministic kernels; a chunked "
            f"plan's sums over rows are reassociated). Listed below: pairs whose requested bytes were over the "
            "prediction, that did not match, or failed.", "", *gen["table"], "", *gen["failures"]] + (
        ["", "Not traced: " + "; ".join(gen["untraced"])] if gen["untraced"] else [])


def main(quick: bool = False, device: str = "cuda", deadline_s: float | None = None,
         only: Sequence[str] | None = None, part: str | None = None, isolate: bool = False,
         n_rounds: int = ROUNDS, generated: int = GENERATED) -> None:
    t0 = time.perf_counter()
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks.cuda measures on a CUDA GPU and this machine has none (torch.cuda.is_available() "
                         "is False); --device cpu --quick runs a dry run of its logic on tiny models")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "the CPU (dry run)"
    tiny = quick or dev.type != "cuda"
    if part is not None:  # one model, in a child process of an isolated run
        if list(only or ()) == ["generated"]:
            res = run_generated(dev, generated)
        else:
            (case,) = [c for c in cases(tiny) if c.name in (only or ())]
            res = run_case(case, dev, 2 if quick else n_rounds)
        with open(part, "w", encoding="utf-8") as fh:
            json.dump(res, fh, default=str)
        return
    results, failed = [], []
    data_path = out_dir(tiny) / "cuda.json"
    for case in cases(tiny):
        if only and case.name not in only:
            continue
        spent = time.perf_counter() - t0
        if deadline_s is not None and spent > deadline_s:
            failed.append(f"{case.name}: not started, past the {deadline_s:.0f} s deadline")
            continue
        try:
            if isolate:
                res = _run_isolated(case.name, device, quick, max(60.0, (deadline_s or 3600.0) + 120.0 - spent), n_rounds)
            else:
                res = run_case(case, dev, 2 if quick else n_rounds)
        except Exception as exc:  # a model that fails is on the page with its error, the others still run
            log.warning("%s failed", case.name, exc_info=True)
            failed.append(f"{case.name} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        finally:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        results.append(res)
        data_path.write_text(json.dumps(dict(device=name, results=results, failed=failed), indent=1, default=str))
        print(f"{case.name}: plain {format_bytes(res['plain_peak'])} (predicted {format_bytes(res['plain_predicted'])})"
              f", theirs {format_bytes(res['their_peak'])}; "
              + "; ".join(f"{p['label']}: {format_bytes(p.get('measured', 0))} / {format_bytes(p['predicted'])}"
                          for p in res["plans"]), flush=True)
    gen = None
    if generated and (not only or "generated" in only):
        spent = time.perf_counter() - t0
        if deadline_s is not None and spent > deadline_s:
            failed.append(f"generated: not started, past the {deadline_s:.0f} s deadline")
        else:
            try:
                gen = (_run_isolated("generated", device, quick, max(60.0, (deadline_s or 3600.0) + 120.0 - spent),
                                     n_rounds, generated) if isolate else run_generated(dev, generated))
            except Exception as exc:
                log.warning("generated failed", exc_info=True)
                failed.append(f"generated failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    data_path.write_text(json.dumps(dict(device=name, results=results, failed=failed, generated=gen), indent=1,
                                    default=str))
    lines = page(results, failed, name, time.perf_counter() - t0) + (_generated_section(gen) if gen else [])
    path = write_page("cuda.md", f"Plans on a CUDA GPU ({name})", lines, quick=tiny)
    print(f"wrote {path}")


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    cli.add_argument("--quick", action="store_true", help="tiny models, two rounds, written under results/quick/")
    cli.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run on tiny models)")
    cli.add_argument("--deadline", type=float, default=None, help="start no model after this many seconds")
    cli.add_argument("--only", nargs="*", default=None, help="models (default: all)")
    cli.add_argument("--isolate", action="store_true", help="each model in a child process (a crash costs one model)")
    cli.add_argument("--rounds", type=int, default=ROUNDS, help=f"timing rounds (default {ROUNDS})")
    cli.add_argument("--generated", type=int, default=None,
                     help=f"random modules of benchmarks.generated to step on the card (default {GENERATED}, "
                          f"{GENERATED_QUICK} with --quick; 0: none)")
    cli.add_argument("--part", default=None, help=argparse.SUPPRESS)  # a child of --isolate: write one model's JSON
    ns = cli.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    main(ns.quick, ns.device, ns.deadline, ns.only, ns.part, ns.isolate, ns.rounds,
         ns.generated if ns.generated is not None else (GENERATED_QUICK if ns.quick or ns.device == "cpu" else GENERATED))
