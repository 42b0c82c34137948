"""Measure every fx node: FLOPs, output bytes, what autograd saves, flags.

The graph module is run node by node (``torch.fx.Interpreter``) on *fake*
tensors (``FakeTensorMode``): shapes, dtypes, storages and the autograd graph
are real, the data is not, so a 7B-parameter model built on the ``meta``
device costs nothing to measure. Per node:

* forward FLOPs: ``FlopCounterMode`` around the node;
* backward FLOPs: the autograd nodes a node creates are claimed by it; one
  backward from the outputs runs under ``FlopCounterMode`` with hooks on those
  autograd nodes, so each fx node gets the FLOPs of its own backward;
* bytes: tensors are identified by *storage*. A node *owns* the storages it
  creates (its ``out_bytes`` is their size); an output sharing an existing
  storage (a view, an in-place op, ``getitem``) is an alias and owns nothing;
  parameters, buffers, constants and the model's inputs belong to nobody;
* saves: ``saved_tensors_hooks`` record what autograd packs while the node
  runs; each saved tensor is resolved to its storage's owner: an earlier node
  (``saves`` lists it), the node itself (its output), nobody (parameters and
  inputs: not activations), or a storage that is neither (a buffer of the op
  itself: dropout's mask, layer norm's mean/rstd: ``own_saved_bytes``);
* stochastic: an op tagged ``nondeterministic_seeded`` ran; stateful: an op
  wrote into a parameter or buffer.

NOTE [ Ops without a FLOP formula ]
    ``FlopCounterMode`` counts matmuls, convolutions and attention, and
    nothing for elementwise ops, reductions, normalisations, softmax or
    dropout. Costed at zero, their recompute would look free and a solver
    would recompute any number of them to save a byte. So a node whose
    forward counts zero FLOPs but creates new storage is charged one FLOP per
    element it creates, and an autograd node whose backward counts zero is
    charged one per element of the gradients it produces. These estimates are
    kept apart in ``OpRecord.estimated_fwd_flops`` / ``estimated_bwd_flops`` (and their total in the graph's
    ``meta["estimated_flops"]``), so the counted part can still be compared
    with ``FlopCounterMode``.

NOTE [ Shared parameter gradients ]
    A node's backward is measured from its autograd nodes' pre-hook to their
    post-hook. The engine adds what a node returns into the gradients pending
    for the next autograd nodes only *after* the post-hook. For a parameter
    used by several nodes (tied input and output embeddings, an embedding
    read by an encoder and a decoder) every contribution after the first is
    added there into the pending one: out of place when that one is a view
    (a linear's weight gradient is a transpose of what its matmul made), so
    that the pending gradient, the contribution and their sum are alive at
    once; in place otherwise, and so every time after an out-of-place sum
    (its result is a plain tensor). In a T5 the first sum (the size of the
    vocabulary embedding) was missed at the backward of
    ``decoder.embed_tokens`` and a real step peaked above ``simulate``. So
    when a node hands a gradient to an ``AccumulateGrad`` whose pending
    gradient is a view, its measuring window stays open until the next
    autograd node starts (or the backward ends): the sum lands in the node's
    ``bwd_peak_bytes``, hence its ``workspace_bytes``, while the pending
    gradient is the parameter gradient ``simulate`` already holds since the
    backward of the parameter's last user. On fake tensors the engine adds
    out of place every time, so a window must not take in a sum it makes
    otherwise: not the later ones, and none made between two autograd
    functions of one node (each function's window starts at its own
    pre-hook). The parameter's ``AccumulateGrad`` is claimed by its first
    user in the forward and runs right after that user's backward, once
    every contribution is in; its window used to go on from the user's, so
    it took in the sum made just before it. Counting those sums charged
    T5's ``encoder.embed_tokens`` (the third user of the shared embedding)
    a sum that the allocator never sees, and set a floor 62.75 MiB (one
    ``[32128, 512]`` gradient) above the real one: 475.1 MiB where
    transformers' own checkpointing ran the step in 437.1 (allocator peaks,
    4 + 4 layers at t5-small widths, batch 4, 128 / 64 tokens;
    ``tests/regressions/test_t5_shared_embedding.py``). Under a dispatch
    mode the real engine adds out of place every time too (NOTE [ Counting
    like simulate ] in ``scheduler.measuring.storages``): the allocator's
    peak (``scheduler.measuring.profiler``) is the one to compare with.

NOTE [ Saved Python scalars ]
    A Python number passed where an op takes a tensor (``q * self.scaling``
    in an attention, ``x / 8.0``) becomes a 0-dim *wrapped number* tensor
    (``float64`` or ``int64``: 8 bytes) before dispatch, and an autograd
    node that saves that argument (``MulBackward0`` saves ``other``) saves it
    *without* the saved-tensor hooks: autograd never packs wrapped numbers.
    So the pack hook above does not see it, and neither does checkpoint's:
    inside a checkpointed region it stays held by the autograd graph from the
    node's forward to its backward, whatever the plan. On OPT (three
    regions, one ``q_proj(h) * scaling`` each) these were 24 bytes the graph
    did not hold, and a plan at its least feasible budget measured 20 bytes
    over it (4 bytes of the loss's ``total_weight`` eager frees inside the
    merged loss node's backward, before the peak, offset the rest). The
    recorder finds them on the autograd nodes a node claims: the real
    (non-fake) 0-dim tensors among their ``_saved_*`` attributes, once per
    storage; ``totals["scalar_bytes"]`` is their sum. ``build`` adds it to
    the graph's always-live ``input_bytes`` (and names it in
    ``meta["saved_scalar_bytes"]``): exact from the last forward through the
    first backward steps, where a step's peak usually is, and an
    overestimate by at most that sum (tens of bytes) before the forward
    creates them and after the backward frees them; every solver counts it
    without a term of its own. Each node's share is in
    ``meta["saved_scalars"]`` (by node name; not in the fingerprint): a
    pipeline stage holds its own nodes' once per micro-batch in flight
    (NOTE [ What a rank holds ] in ``scheduler.distributed.ranks``). A
    recompute that runs such a node makes its copy again, held by the
    recompute's autograd graph until the recompute ends: ``simulate``
    charges those in the recomputes of a nested region (NOTE [ Nested
    regions ] in ``solvers.model.nested``), not yet in a one-level
    recompute, whose term would have to enter ``dp``'s, CP-SAT's and the
    frontier program's tables as well (no one-level pair of the generator's
    100 seeds measured over for it).

NOTE [ Gradients of model inputs ]
    A model input that requires grad (a leaf the caller made with
    ``requires_grad=True``) gets its ``.grad`` in the backward of the first of
    its users the backward reaches, and keeps it to the end of the step, as a
    parameter does. Counted only as that node's workspace (or, when the node
    passes its output gradient on unchanged, as a residual ``add`` does, as
    that gradient, freed once the view chain after it copied it), it was
    missing from the later steps: a block ``x + fc(norm(x))`` whose branch
    ends in a window-merge view chain measured its ``x.grad`` above
    ``simulate`` at the branch's backward. So such an input's storage is
    watched and attributed like a trainable parameter's: the node that last
    touches it in the forward gets its bytes as ``param_bytes`` (a gradient
    kept from its backward on), and they leave its ``workspace_bytes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Sequence

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils import stateless
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from .layouts import layouts_for
from .opclasses import time_calls
from .recorder import Recorder, module_calls, module_path
from .records import OpRecord, fake_copy, storage_bytes, storage_key
from .roofline import op_class
from .watch import OpWatch

__all__ = ["OpRecord", "measure_ops", "storage_key", "storage_bytes", "module_path", "module_calls"]

log = logging.getLogger(__name__)


def _cpu_flash_flops(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_flash_backward_flops(grad: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None,
                              **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad.shape, query.shape, key.shape, value.shape)


_cpu_flash_flops._get_raw = True  # type: ignore[attr-defined]
_cpu_flash_backward_flops._get_raw = True  # type: ignore[attr-defined]
#: FLOP formulas ``FlopCounterMode`` lacks: SDPA's CPU flash kernel counts what the CUDA kernels count.
CPU_ATTENTION_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops}


def measure_ops(gm: torch.fx.GraphModule, flat_inputs: Sequence[Any], *, strip_module: str = "",
                workspaces: torch.device | None = None, device: torch.device | None = None,
                kernels: Any = None, outputs: Sequence[str] = (), time_classes: Sequence[str] = (),
                target_kind: str | None = None) -> tuple[list[OpRecord], dict[str, int]]:
    """Run ``gm`` on fake copies of its state and inputs and measure every node.

    Args:
        gm: a normalised graph module (see ``capture.capture_graph_module``).
        flat_inputs: one value per placeholder, real or meta tensors.
        strip_module: prefix removed from module paths (a wrapper's child name).
        workspaces: a device to measure the ops' workspaces on (NOTE [ Op
            workspaces ] in ``scheduler.tracing.workspaces``); None: not measured.
        device: the device the fake copies of ``meta`` tensors live on, or None
            (where they are); kernels: a ``TorchFunctionMode`` the forward runs
            under (NOTE [ Trace targets ] in ``scheduler.tracing.target``).
        outputs: names of the fx nodes whose values the model returns; the
            records owning their storages are marked ``output`` (NOTE
            [ Finding the model's outputs ] in ``scheduler.tracing.outputs``).
        time_classes: op classes whose forward calls are timed at their shapes
            on the ``workspaces`` device (NOTE [ Measured op classes ] in
            ``scheduler.tracing.opclasses``; ``OpRecord.class_times``).
        target_kind: the kind of device the trace plans for ("cpu",
            "cuda"); outputs whose fake layout differs from that device's
            kernel are laid out as the kernel does (NOTE [ Kernel layouts ]
            in ``scheduler.tracing.layouts``). None: the fake tensors' device.

    Returns:
        ``(records, totals)``: one :class:`OpRecord` per compute node in graph
        order, and graph-level byte counts ``param_bytes`` (unique parameter
        storages), ``buffer_bytes``, ``input_bytes``, ``trainable_param_bytes``
        and ``trainable`` (fake storage key -> bytes of each trainable parameter; ``frozen``: of each other one),
        ``scalar_bytes`` (NOTE [ Saved Python scalars ]) and ``scalar_at`` (record position -> its share).
    """
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    param_keys: set[int] = set()
    state_keys: set[int] = set()
    totals = {"param_bytes": 0, "trainable_param_bytes": 0, "buffer_bytes": 0, "input_bytes": 0}
    seen_real: set[int] = set()
    seen_frozen: set[int] = set()
    trainable: dict[int, int] = {}  # fake storage key -> bytes, trainable parameters
    frozen: dict[int, int] = {}  # fake storage key -> bytes, parameters without grad
    with fake:
        for kind, items in (("param", gm.named_parameters(remove_duplicate=False)),
                            ("buffer", gm.named_buffers(remove_duplicate=False))):
            for name, t in items:
                if id(t) not in memo:
                    f = fake_copy(fake, t, device)
                    if kind == "param":
                        f.requires_grad_(t.requires_grad)
                        # The fake copy carries the real ``.grad`` when one is set (after a step):
                        # the measured backward would then accumulate into it and differ.
                        f.grad = None
                    memo[id(t)] = f
                f = memo[id(t)]
                state[name] = f
                k = storage_key(f)
                state_keys.add(k)
                rk = storage_key(t) if t.device.type != "meta" else id(t)
                if rk not in seen_real:
                    seen_real.add(rk)
                    nbytes = storage_bytes(t)
                    if kind == "param":
                        totals["param_bytes"] += nbytes
                        totals["trainable_param_bytes"] += nbytes if t.requires_grad else 0
                    else:
                        totals["buffer_bytes"] += nbytes
                if kind == "param":
                    param_keys.add(k)
                    if t.requires_grad:
                        trainable[k] = storage_bytes(t)
                    elif rk not in seen_frozen:
                        seen_frozen.add(rk)
                        frozen[k] = storage_bytes(t)
        fake_inputs = []
        input_keys: set[int] = set()
        for v in flat_inputs:
            if isinstance(v, torch.Tensor):
                f = fake_copy(fake, v, device)
                k = storage_key(f)
                if k not in input_keys:
                    input_keys.add(k)
                    totals["input_bytes"] += storage_bytes(v)
                    if v.requires_grad and k not in param_keys:  # NOTE [ Gradients of model inputs ]
                        trainable[k] = storage_bytes(v)
                fake_inputs.append(f)
            else:
                fake_inputs.append(v)
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    probe = None
    if workspaces is not None:
        from .workspaces import WorkspaceProbe

        probe = WorkspaceProbe()
    watch = OpWatch(param_keys | set(trainable), state_keys, counter, probe)
    rec = Recorder(gm, fake, counter, watch, set(state_keys) | input_keys, strip_module, device)
    fake_kind = device.type if device is not None else next(
        (v.device.type for v in flat_inputs if isinstance(v, torch.Tensor)), "cpu")
    layouts = layouts_for(target_kind or fake_kind)
    with stateless._reparametrize_module(gm, state, tie_weights=True), torch.enable_grad():
        with fake, layouts if layouts is not None else contextlib.nullcontext(), counter, watch:
            with kernels if kernels is not None else contextlib.nullcontext():
                result = rec.run(*fake_inputs)
            rec.run_backward(result)
    fwd_ws: dict[int, int] = {}
    if probe is not None and watch.calls:  # NOTE [ Op workspaces ]: each call's real peak, at its place
        deltas = probe.measure(workspaces)
        fwd_reach: dict[int, tuple[int, int]] = {}
        for (kind, pos, base), sig, before in watch.calls:
            reach = before - base + deltas.get(sig, 0)
            if kind == "f":
                fwd_reach[pos] = (max(fwd_reach.get(pos, (0, base))[0], reach), base)
            else:
                rec.bwd_peak[pos] = max(rec.bwd_peak.get(pos, 0), reach)
        for pos, (reach, base) in fwd_reach.items():
            fwd_ws[pos] = max(0, reach - (rec.fwd_end.get(pos, base) - base))
    timed: dict[int, dict[str, float]] = {}
    if probe is not None and time_classes and watch.calls:  # NOTE [ Measured op classes ]
        forward = [(pos, sig) for (kind, pos, _), sig, _ in watch.calls if kind == "f"]
        times = time_calls(probe, (sig for _, sig in forward), time_classes, torch.device("cpu") if workspaces.type == "meta" else workspaces)
        for pos, sig in forward:
            if sig in times:
                at = timed.setdefault(pos, {})
                cls = op_class(sig[0][0]) or ""
                at[cls] = at.get(cls, 0.0) + times[sig]
    records = [dataclasses.replace(r, bwd_flops=int(rec.bwd_flops.get(i, 0)), bwd_peak_bytes=int(rec.bwd_peak.get(i, 0)),
                                   fwd_workspace_bytes=fwd_ws.get(i, 0),
                                   class_times=tuple(sorted(timed.get(i, {}).items())),
                        estimated_bwd_flops=int(rec.bwd_estimated.get(i, 0)),
                        grad_views=i in rec.grad_views)
               for i, r in enumerate(rec.records)]
    # Mark what the graph returns; attach trailing get_attr nodes to the last record.
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    returned = {rec.record_of[a.name] for a in out_node.all_input_nodes if a.name in rec.record_of}
    tail = tuple(rec.pending_attrs)
    for i in returned:
        records[i] = dataclasses.replace(records[i], returned=True)
    for i in rec.owners_of(outputs):
        records[i] = dataclasses.replace(records[i], output=True)
    if tail and records:
        records[-1] = dataclasses.replace(records[-1], members=records[-1].members + tail)
    totals["trainable"] = trainable  # type: ignore[assignment]
    totals["frozen"] = frozen  # type: ignore[assignment]
    totals["scalar_bytes"] = rec.scalar_bytes  # NOTE [ Saved Python scalars ]
    totals["scalar_at"] = dict(rec.scalar_at)  # type: ignore[assignment]
    return records, totals

