"""Language models written for pipelining: a stage is the model with the other stages' layers deleted.

torchtitan builds pipeline stages that way (its layers live in an
``nn.ModuleDict`` keyed by index, and a stage's copy drops the layers, the
embeddings or the head it does not run), so every module keeps its path and
a plan solved on the whole model's graph, cut into stages
(``scheduler.distributed``), applies onto each stage's module as it is.

:class:`StagedLM` is a small pre-norm decoder (GPT-2's module names);
:func:`staged_gpt2` holds a transformers ``GPT2LMHeadModel``'s own modules at
their own paths (``transformer.h.3``...). :func:`stage_module` cuts either.
The forward takes token ids (or, on a later stage, hidden states) and, given
``targets``, returns the mean cross-entropy, which is what
``torch.distributed.pipelining`` computes with ``loss_fn`` on the last stage.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["StagedLM", "staged_gpt2", "stage_module", "lm_loss"]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (batch, seq, vocab) against ``targets`` (batch, seq)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.c_attn(x).split(w, dim=2)
        q, k, v = (t.view(b, s, self.heads, w // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, s, w))


class _MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = _Attention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = _MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class StagedLM(nn.Module):
    """A decoder whose layers are ``layers.0``, ``layers.1``... in an ``nn.ModuleDict``.

    Args:
        vocab, width, heads, layers, seq: its shape (``seq``: the most positions).
        blocks: the layers, when given (any modules mapping hidden states to hidden states).
        embed, pos, drop, norm, head: the modules around them, when given (``staged_gpt2``).
    """

    def __init__(self, vocab: int = 256, width: int = 64, heads: int = 4, layers: int = 4, seq: int = 64, *,
                 blocks: Sequence[nn.Module] | None = None, embed: nn.Module | None = None,
                 pos: nn.Module | None = None, drop: nn.Module | None = None, norm: nn.Module | None = None,
                 head: nn.Module | None = None) -> None:
        super().__init__()
        self.embed = embed if embed is not None else nn.Embedding(vocab, width)
        self.pos = pos if pos is not None else nn.Embedding(seq, width)
        self.drop = drop
        made = blocks if blocks is not None else [_Block(width, heads) for _ in range(layers)]
        self.layers = nn.ModuleDict({str(i): b for i, b in enumerate(made)})
        self.norm = norm if norm is not None else nn.LayerNorm(width)
        self.head = head if head is not None else nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            if self.drop is not None:
                x = self.drop(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        return x if targets is None else lm_loss(x, targets)


def staged_gpt2(**config: int) -> StagedLM:
    """A transformers ``GPT2LMHeadModel`` of ``config`` (random weights, untied head, no dropout) as a
    :class:`StagedLM` holding its own modules: ``embed`` is its ``wte``, ``layers.i`` its ``h.i``."""
    import transformers

    cfg = transformers.GPT2Config(use_cache=False, tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, **config)
    hf = transformers.GPT2LMHeadModel(cfg).train()
    t = hf.transformer
    return StagedLM(blocks=list(t.h), embed=t.wte, pos=t.wpe, drop=t.drop, norm=t.ln_f, head=hf.lm_head)


def stage_module(model: StagedLM, starts: Sequence[str], index: int) -> StagedLM:
    """Stage ``index`` of ``model`` cut where ``starts`` (``layers.2``, ...) begin: a copy without the other
    stages' layers, without the embeddings unless first, without the norm and head unless last."""
    names = list(model.layers.keys())
    firsts = [0] + [names.index(s.split(".")[-1]) for s in starts] + [len(names)]
    keep = set(names[firsts[index]:firsts[index + 1]])
    stage = copy.deepcopy(model)
    for name in names:
        if name not in keep:
            del stage.layers[name]
    if index > 0:
        stage.embed = stage.pos = stage.drop = None
    if index < len(starts):
        stage.norm = stage.head = None
    return stage
