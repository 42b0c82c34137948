"""The models ``ckpt compare`` and ``benchmarks/compare.py`` run, at sizes a 2-core CPU measures.

Built on ``scheduler.models.build``: a name there plus the options used for
``--quick`` (seconds per model, for tests) and for the benchmark (steps of
roughly 0.1 to 0.5 s, so time ratios are not noise). Any other name of the
registry runs with its own defaults.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .run import Workload

log = logging.getLogger(__name__)

__all__ = ["workload", "BENCH_MODELS", "QUICK_MODELS", "SIZES"]

#: The benchmark's models (``benchmarks/compare.py``), in run order.
BENCH_MODELS = ("gpt", "resnet", "unet", "vgg19", "hf:gpt2")
QUICK_MODELS = ("gpt",)

#: name -> (quick options, benchmark options). Shapes keep the model's family
#: (GPT-2 blocks with dropout, ResNet-50's bottleneck stages, ...) at CPU sizes.
SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gpt": (dict(layers=2, width=128, heads=4, vocab=512, batch=4, seq=64),
            dict(layers=4, width=128, heads=4, vocab=2048, batch=4, seq=128)),
    "resnet": (dict(depth=26, width=8, classes=10, batch=2, image_size=32),
               dict(depth=50, width=16, classes=100, batch=8, image_size=64)),
    "unet": (dict(levels=2, width=8, batch=2, image_size=32),
             dict(levels=3, width=16, batch=4, image_size=64)),
    "vgg19": (dict(width=8, hidden=64, classes=10, batch=2, image_size=32),
              dict(width=16, hidden=512, classes=100, batch=8, image_size=64)),
    "hf:gpt2": (dict(n_layer=1, n_embd=64, n_head=2, vocab_size=512, batch=2, seq=32),
                dict(n_layer=4, n_embd=256, n_head=4, vocab_size=4096, batch=2, seq=128)),
}
#: transformers models run from their config with these fields reduced (GPT-2's
#: 50k-token head would otherwise hold the peak whatever is checkpointed, and a
#: CPU step would take seconds): still ``GPT2LMHeadModel``, with HF's own
#: ``gradient_checkpointing_enable()`` as the per-block peer.


def workload(name: str, *, quick: bool = False, bench: bool = False, batch: int | None = None,
             options: dict[str, Any] | None = None) -> Workload:
    """The workload ``name`` (a ``scheduler.models`` name) at the quick or benchmark size.

    Args:
        name: ``gpt``, ``resnet``, ``unet``, ``vgg19``, ``hf:gpt2``, or any
            other name ``scheduler.models.build`` knows (its defaults).
        quick: the small size (tests).
        bench: the benchmark size (otherwise the benchmark size too, unless
            ``quick``; kept for symmetry with the suite).
        batch: override the batch size.
        options: model options (``ckpt trace``'s flags) over the size's own.

    Raises:
        UnknownModel: the name is not known (the message lists those that are).
    """
    from ..models import build

    opts = dict(SIZES[name][0 if quick else 1]) if name in SIZES else {}
    opts.update({k: v for k, v in (options or {}).items() if v is not None})
    if batch is not None:
        opts["batch"] = batch
    torch.manual_seed(0)
    if name.startswith("hf:") and name in SIZES:
        return _hf_workload(name, opts)
    ex = build(name, **opts)
    ex.model.train()
    return Workload(name=name, model=ex.model, args=tuple(ex.args), kwargs=dict(ex.kwargs), loss=ex.loss,
                    trace_loss=ex.loss, meta={k: v for k, v in opts.items() if not isinstance(v, torch.dtype)})


def _hf_workload(name: str, opts: dict[str, Any]) -> Workload:
    """A transformers causal LM from its config with reduced fields, random weights, token ids as labels."""
    from ..models import hf_configs as hf

    fields = {k: v for k, v in opts.items() if k not in ("batch", "seq")}
    config = hf.hf_config(name[3:], **fields)
    model = hf.build_hf_model(config, device="cpu")
    args, kwargs = hf.hf_inputs(config, opts["batch"], opts["seq"], device="cpu")
    return Workload(name=name, model=model, args=tuple(args), kwargs=kwargs, loss=hf.hf_loss, trace_loss=hf.hf_loss,
                    meta={"model": type(model).__name__, **opts})
