"""``hf:NAME``: the one table of transformers model shapes, usable offline.

Nothing here downloads: each entry is the architecture part of a model's
published ``config.json`` on the Hugging Face hub (sizes, heads, vocabulary,
positions), or a small shape written here for tests (``llama-tiny``),
enough to build the model with random weights, or on the ``meta`` device
without allocating them, and size a fine-tune for a card this machine does
not have. ``scheduler.models.build("hf:NAME")`` (``ckpt trace``, ``ckpt
apply``), ``ckpt fit`` and ``ckpt compare`` all read it.

``hf_config("llama-2-7b")`` gives a ``transformers`` config;
``hf_config("path/to/config.json")`` (or a folder holding one) reads a
local file; any other name is tried as a ``transformers`` model type with its
defaults (``gpt2`` is GPT-2 small). ``build_hf_model(config, device="meta")``
builds the causal-LM model; :func:`build` gives a model, example inputs and its loss.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from graphs import CkptError

__all__ = ["HFShape", "HF_CONFIGS", "HFConfigError", "hf_config", "build_hf_model", "hf_param_count", "describe",
           "max_positions", "hf_inputs", "hf_loss", "model_config", "build"]

log = logging.getLogger(__name__)


class HFConfigError(CkptError, ValueError):
    """A named config or a config.json could not be read; the message says which and what is known."""


@dataclass(frozen=True)
class HFShape:
    """One published model shape.

    Attributes:
        name: the name used after ``hf:`` (``llama-2-7b``).
        source: the hub repository whose ``config.json`` the fields come from.
        params: the parameter count, for the table (checked by the tests).
        config: ``model_type`` and the architecture fields of that config.json.
        description: the line ``ckpt models`` shows (default: size and source).
        build_fields: config fields :func:`build` adds. The names ``ckpt trace``
            knew first (``gpt2``, ``llama-tiny``, ``llama-7b``) build without
            the key/value cache, as they always did, so graphs and plans saved
            from them keep their fingerprints.
    """

    name: str
    source: str
    params: int
    config: Mapping[str, Any]
    description: str = ""
    build_fields: Mapping[str, Any] = field(default_factory=dict)


def _gpt2(n_embd: int, n_layer: int, n_head: int) -> dict[str, Any]:
    return {"model_type": "gpt2", "n_embd": n_embd, "n_layer": n_layer, "n_head": n_head,
            "n_positions": 1024, "vocab_size": 50257, "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, positions: int,
           rope_theta: float, model_type: str = "llama", **extra: Any) -> dict[str, Any]:
    return {"model_type": model_type, "hidden_size": hidden, "intermediate_size": inter,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
            "vocab_size": vocab, "max_position_embeddings": positions, "rms_norm_eps": 1e-5,
            "rope_theta": rope_theta, "hidden_act": "silu", "tie_word_embeddings": False, **extra}


_NO_CACHE = {"use_cache": False}

_SHAPES = [
    HFShape("gpt2", "openai-community/gpt2", 124_439_808, _gpt2(768, 12, 12),
            "GPT-2 small (124M): 12 layers, width 768, 12 heads", _NO_CACHE),
    HFShape("llama-tiny", "(written here)", 220_480,
            {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 2048},
            "a tiny Llama (2 layers, width 64, 4 heads, 2 KV heads, vocab 1000)", _NO_CACHE),
    HFShape("llama-7b", "(written here)", 6_738_415_616,
            {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
             "max_position_embeddings": 4096},
            "Llama-2-7B's shape (32 layers, width 4096, vocab 32000); use with --device meta", _NO_CACHE),
    HFShape("gpt2-medium", "openai-community/gpt2-medium", 354_823_168, _gpt2(1024, 24, 16)),
    HFShape("gpt2-large", "openai-community/gpt2-large", 774_030_080, _gpt2(1280, 36, 20)),
    HFShape("gpt2-xl", "openai-community/gpt2-xl", 1_557_611_200, _gpt2(1600, 48, 25)),
    HFShape("llama-2-7b", "meta-llama/Llama-2-7b-hf", 6_738_415_616,
            _llama(4096, 11008, 32, 32, 32, 32000, 4096, 10000.0)),
    HFShape("llama-2-13b", "meta-llama/Llama-2-13b-hf", 13_015_864_320,
            _llama(5120, 13824, 40, 40, 40, 32000, 4096, 10000.0)),
    HFShape("llama-2-70b", "meta-llama/Llama-2-70b-hf", 68_976_648_192,
            _llama(8192, 28672, 80, 64, 8, 32000, 4096, 10000.0)),
    HFShape("llama-3-8b", "meta-llama/Meta-Llama-3-8B", 8_030_261_248,
            _llama(4096, 14336, 32, 32, 8, 128256, 8192, 500000.0)),
    HFShape("mistral-7b", "mistralai/Mistral-7B-v0.1", 7_241_732_096,
            _llama(4096, 14336, 32, 32, 8, 32000, 32768, 10000.0, model_type="mistral", sliding_window=4096)),
]

#: Named shapes, by the name used after ``hf:``.
HF_CONFIGS: dict[str, HFShape] = {s.name: s for s in _SHAPES}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise HFConfigError("hf: models need the transformers package; install it with "
                            "`pip install 'ckpt-scheduler[hf]'` (or `pip install transformers`)") from None
    return transformers


def hf_config(name: str, **overrides: Any) -> Any:
    """A ``transformers`` config from a named shape, a local ``config.json``, or a model type.

    Args:
        name: a key of :data:`HF_CONFIGS` (``llama-2-7b``), a path to a
            ``config.json`` or to a folder holding one, or a ``transformers``
            model type (``gpt2``, ``llama``) for its default config.
        **overrides: config fields to change (e.g. ``num_hidden_layers=2``).

    Raises:
        HFConfigError: an unreadable file, a config without ``model_type``, or
            a name that is none of the above (the message lists the names).
    """
    tf = _transformers()
    if name in HF_CONFIGS:
        fields = dict(HF_CONFIGS[name].config)
    elif name.endswith(".json") or os.path.isdir(name) or os.path.sep in name:
        path = os.path.join(name, "config.json") if os.path.isdir(name) else name
        try:
            with open(path) as f:
                fields = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise HFConfigError(f"cannot read the model config {path!r}: {exc}") from None
        if not isinstance(fields, dict) or "model_type" not in fields:
            raise HFConfigError(f"{path!r} has no 'model_type' field; it does not look like a transformers config.json")
    else:
        fields = {"model_type": name}
    model_type = fields.pop("model_type")
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        fields.pop(key, None)
    try:
        return tf.AutoConfig.for_model(model_type, **{**fields, **overrides})
    except (ValueError, KeyError) as exc:
        raise HFConfigError(f"unknown model {name!r} ({exc}); named shapes: {', '.join(HF_CONFIGS)}, "
                            "or give a path to a config.json") from None


def build_hf_model(config: Any, *, dtype: str = "fp32", device: str = "meta") -> Any:
    """The causal-LM model of ``config`` with random weights, on ``device``.

    On ``meta`` no weight is allocated: a 13B model builds in seconds on a
    laptop and can be traced for its shapes.

    Args:
        config: a ``transformers`` config (:func:`hf_config`).
        dtype: ``fp32``, ``bf16`` or ``fp16``.
        device: ``meta`` or ``cpu`` (or any torch device).
    """
    import torch

    tf = _transformers()
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else {"fp32": torch.float32, "bf16": torch.bfloat16,
                                                                 "fp16": torch.float16}[dtype]
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.train()
    return model


def hf_param_count(name: str) -> int:
    """Parameters of a named shape or config, counted on a meta-device build."""
    model = build_hf_model(hf_config(name), device="meta")
    return sum(p.numel() for p in model.parameters())


def describe() -> list[tuple[str, str]]:
    """``(hf:NAME, description)`` rows for ``ckpt models``."""
    rows = []
    for s in _SHAPES:
        size = f"{s.params / 1e9:.2f}B" if s.params >= 1e9 else f"{s.params / 1e6:.0f}M"
        rows.append((f"hf:{s.name}", s.description
                     or f"{size} parameters, published shape of {s.source} (offline; device=meta for large ones)"))
    return rows


def max_positions(config: Any) -> int | None:
    """The longest sequence the config's position embeddings allow (None if unbounded)."""
    for key in ("n_positions", "max_position_embeddings"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def hf_inputs(config: Any, batch: int, seq: int, *, device: str = "meta") -> tuple[tuple, dict[str, Any]]:
    """Example inputs of a causal-LM training step: token ids, and the same ids as labels.

    With ``labels`` the model computes its own cross-entropy loss (as
    ``Trainer`` does), so the traced step includes the logits and the loss.
    """
    import torch

    ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
    if device != "meta":
        ids = torch.randint(0, int(config.vocab_size), (batch, seq), device=device)
    return (), {"input_ids": ids, "labels": ids}


def hf_loss(out: Any) -> Any:
    """The loss a transformers causal-LM returns when given labels."""
    return out.loss


#: The config field holding the layer count, where it is not ``num_hidden_layers``.
_LAYERS_FIELD = {"gpt2": "n_layer"}


def model_config(name: str, *, layers: int | None = None, attn: str = "sdpa") -> Any:
    """The config :func:`build` (and ``ckpt fit``) builds ``name`` from: a named shape with its build fields, a
    config.json path or a model type (:func:`hf_config`), with ``layers`` layers and ``attn`` attention."""
    overrides: dict[str, Any] = dict(HF_CONFIGS[name].build_fields) if name in HF_CONFIGS else {}
    config = hf_config(name, **overrides)
    if layers is not None:
        config = hf_config(name, **overrides, **{_LAYERS_FIELD.get(config.model_type, "num_hidden_layers"): int(layers)})
    config._attn_implementation = attn
    return config


def build(name: str, *, layers: int | None = None, batch: int = 1, seq: int = 128, dtype: Any = "fp32",
          device: str = "cpu", attn: str = "sdpa") -> tuple[Any, tuple, dict[str, Any], Any]:
    """``(model, args, kwargs, loss)`` for a named shape, as ``scheduler.models.build("hf:NAME")`` returns it.

    Args:
        name: a key of :data:`HF_CONFIGS`.
        layers: override the number of layers.
        batch, seq: token batch shape.
        dtype: parameter dtype (``fp32``, ``bf16``, ``fp16`` or a torch dtype).
        device: ``"cpu"``, or ``"meta"`` for shapes too large for this machine's memory.
        attn: transformers attention implementation (``sdpa`` or ``eager``).
    """
    model = build_hf_model(model_config(name, layers=layers, attn=attn), dtype=dtype, device=device)
    args, kwargs = hf_inputs(model.config, batch, seq, device=device)
    return model, args, kwargs, hf_loss
