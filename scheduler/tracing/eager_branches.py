"""Make ``torch.export`` take the branches eager takes where a library branches on "am I being exported?".

NOTE [ Eager's attention masks under export ]
    transformers decides per call whether an attention mask can be left out
    (``masking_utils._ignore_causal_mask_sdpa`` and
    ``_ignore_bidirectional_mask_sdpa``): with no padding it passes no mask
    and ``is_causal=True`` (or nothing), so SDPA runs its fused kernel, which
    saves the query, key, value, output and a log-sum-exp. While exporting it
    never leaves the mask out (an exported program must stay right for any
    input, and the check reads the mask's values), so the exported graph
    builds a (batch, heads, q, k) mask and attention saves it too: the zoo's
    store-all predictions sat 7-11 % above the eager step's measured peak
    (a transformers ViT, 4 layers, width 128, 256 tokens, batch 8: +13 %).
    The same holds for packed sequences (``find_packed_sequence_indices``:
    position ids that restart inside a row): eager finds none in ordinary
    position ids and lets the mask go; exporting never looks, so every
    decoder-only model (Llama, Mistral...) exported with a
    (batch, 1, q, k) mask, and a CUDA target then ran the memory-efficient
    kernel with that mask where the user's step runs flash or cuDNN.
    Our graph plans *this* step of the user's *eager* model, so these
    decisions are recorded in one eager forward on the example inputs (no
    grad, RNG forked, buffers restored) and replayed, in call order, while
    exporting. Where eager cannot run (the meta device), a decision that
    reads no values is taken as eager takes it: no padding mask was passed
    (the usual training step on token ids and labels), or no position ids
    were (the model makes them with ``arange``: no packing); one that would
    read values keeps the mask (they are unknown). Where the calls do not
    line up, the library decides as it would. Which kernel then runs:
    NOTE [ Trace targets ] in ``scheduler.tracing.target``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn

__all__ = ["eager_mask_decisions"]

log = logging.getLogger(__name__)

#: transformers' functions that decide whether a mask can be left out -> what each returns when it can.
_SKIPPED: dict[str, Any] = {"_ignore_causal_mask_sdpa": True, "_ignore_bidirectional_mask_sdpa": True,
                            "find_packed_sequence_indices": None}
_DECIDERS = tuple(_SKIPPED)


def _skips(name: str, out: Any) -> bool:
    return out is None if _SKIPPED[name] is None else bool(out)


@contextlib.contextmanager
def _patched(module: Any, wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    originals = {name: getattr(module, name) for name in _DECIDERS if hasattr(module, name)}
    try:
        for name, fn in originals.items():
            setattr(module, name, wrap(name, fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def _on_meta(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> bool:
    import torch.utils._pytree as pytree

    leaves = list(module.parameters()) + pytree.tree_leaves((tuple(args), dict(kwargs)))
    return any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in leaves)


def _as_eager_without_values(masking: Any, user_positions: bool, name: str, fn: Callable[..., Any]
                             ) -> Callable[..., Any]:
    """``fn`` deciding as in eager where that reads no values (NOTE [ Eager's attention masks under
    export ]); elsewhere as the library decides while exporting (the mask stays)."""
    def wrapper(*a: Any, **k: Any) -> Any:
        if name == "find_packed_sequence_indices":
            return fn(*a, **k) if user_positions else None
        if (a[0] if a else k.get("padding_mask")) is not None:
            return fn(*a, **k)
        # what says "tracing" to the decision: transformers 5.2x asks is_torchdynamo_exporting(); 5.17 asks
        # is_tracing(padding_mask), true under export even for no mask (a meta Llama then kept its mask, repeated
        # its key/value heads, and was priced with the memory-efficient kernel where the GPU ran the math one)
        saved = {n: getattr(masking, n) for n in _TRACING_CHECKS if hasattr(masking, n)}
        for n in saved:
            setattr(masking, n, _not_tracing)
        try:
            return fn(*a, **k)
        finally:
            for n, f in saved.items():
                setattr(masking, n, f)
    return wrapper


#: The names ``transformers.masking_utils`` decides "tracing" by, across its versions.
_TRACING_CHECKS = ("is_torchdynamo_exporting", "is_tracing")


def _not_tracing(*args: Any, **kwargs: Any) -> bool:
    return False


@contextlib.contextmanager
def eager_mask_decisions(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """While the block runs, transformers' mask-skipping decisions replay those of an eager forward.

    A no-op when transformers is not loaded or nothing is decided; on the
    meta device, the decisions that read no values (NOTE [ Eager's attention
    masks under export ]).
    """
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None:
        yield
        return
    if _on_meta(module, args, kwargs):
        user_positions = kwargs.get("position_ids") is not None or len(args) > 2
        with _patched(masking, functools.partial(_as_eager_without_values, masking, user_positions)):
            yield
        return
    decided: list[tuple[str, bool]] = []  # (function, whether eager left the mask out)

    def record(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            out = fn(*a, **k)
            decided.append((name, _skips(name, out)))
            return out
        return wrapper

    buffers = list(module.buffers())
    saved = [b.detach().clone() for b in buffers]
    try:
        with _patched(masking, record), torch.random.fork_rng(devices=[]), torch.no_grad():
            module(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (the export that follows reports real failures)
        log.info("eager forward for the mask decisions failed (%s); export decides them itself", exc)
        decided.clear()
    finally:
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)
    if not decided:
        yield
        return
    queue = list(decided)

    def replay(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*a: Any, **k: Any) -> Any:
            if queue and queue[0][0] == name and queue.pop(0)[1]:
                return _SKIPPED[name]
            return fn(*a, **k)
        return wrapper

    log.info("export replays %d attention-mask decisions of the eager forward", len(decided))
    with _patched(masking, replay):
        yield
