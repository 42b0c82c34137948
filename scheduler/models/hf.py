"""``hf:NAME``: HuggingFace transformers models from configs, random weights, offline.

Nothing is downloaded: each name maps to a config written here. The model
returns its language-modelling loss (``labels = input_ids``); the trace keeps
only the loss (``loss=lambda out: out.loss``) so the logits are not held past it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["HF_CONFIGS", "build"]

#: name -> (description, config class name, config kwargs, option name for the layer count)
HF_CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2": ("GPT-2 small (124M): 12 layers, width 768, 12 heads", "GPT2Config",
             dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)),
    "llama-tiny": ("a tiny Llama (2 layers, width 64, 4 heads, 2 KV heads, vocab 1000)", "LlamaConfig",
                   dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=1000, max_position_embeddings=2048)),
    "llama-7b": ("Llama-2-7B's shape (32 layers, width 4096, vocab 32000); use with --device meta", "LlamaConfig",
                 dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)),
}

_LAYER_KEY = {"GPT2Config": "n_layer", "LlamaConfig": "num_hidden_layers"}
_MODEL_CLASS = {"GPT2Config": "GPT2LMHeadModel", "LlamaConfig": "LlamaForCausalLM"}


def _loss(out: Any) -> torch.Tensor:
    return out.loss


def build(name: str, *, layers: int | None = None, batch: int = 1, seq: int = 128,
          dtype: torch.dtype = torch.float32, device: str = "cpu", attn: str = "sdpa"
          ) -> tuple[torch.nn.Module, tuple, dict, Callable[[Any], torch.Tensor]]:
    """``(model, args, kwargs, loss)`` for the transformers config ``name``.

    Args:
        name: a key of :data:`HF_CONFIGS`.
        layers: override the number of layers.
        batch, seq: token batch shape.
        dtype: parameter dtype.
        device: ``"cpu"`` or ``"meta"`` (no allocation).
        attn: transformers attention implementation (``sdpa`` or ``eager``).

    Raises:
        KeyError: unknown name (the registry turns it into a readable error).
        ImportError: transformers is not installed.
    """
    import transformers

    _desc, cfg_name, cfg_kwargs = HF_CONFIGS[name]
    cfg_kwargs = dict(cfg_kwargs)
    if layers is not None:
        cfg_kwargs[_LAYER_KEY[cfg_name]] = int(layers)
    config = getattr(transformers, cfg_name)(**cfg_kwargs, use_cache=False)
    config._attn_implementation = attn
    vocab = config.vocab_size
    with torch.device(device):
        model = getattr(transformers, _MODEL_CLASS[cfg_name])(config).to(dtype)
        ids = torch.randint(0, vocab, (batch, seq))
    model.train()
    return model, (), {"input_ids": ids, "labels": ids}, _loss
