"""``gpt``: a GPT-2-shaped decoder-only transformer with dropout, returning its loss.

Defaults are GPT-2 small (12 layers, width 768, 12 heads, vocabulary 50257,
context 1024). Attention is written out (``q @ k^T``, mask, softmax, dropout,
``@ v``) so autograd saves what a plain PyTorch implementation saves.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "build"]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(mask, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, dropout)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width, dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style language model; ``forward(idx, targets)`` returns the cross-entropy loss."""

    def __init__(self, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 50257,
                 context: int = 1024, dropout: float = 0.1):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as in GPT-2
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        mask = self.mask[:t, :t]
        for block in self.blocks:
            x = block(x, mask)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build(*, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 50257, batch: int = 1,
          seq: int = 1024, dropout: float = 0.1, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """``(model, args, kwargs)`` for a GPT of this shape on token batches ``(batch, seq)``.

    Raises:
        ValueError: ``width`` not a multiple of ``heads``, or ``dropout`` outside [0, 1).
    """
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads} (each head gets width / heads)")
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
    with torch.device(device):
        model = GPT(layers, width, heads, vocab, max(seq, 1), dropout).to(dtype)
        idx = torch.randint(0, vocab, (batch, seq))
        targets = torch.randint(0, vocab, (batch, seq))
    return model, (idx,), {"targets": targets}
