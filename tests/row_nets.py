"""A tiny model with one row-wise call that chunks may run (an MLP over tokens) and a linear head, for tests that
chunk a call of a real module (NOTE [ Chunked head ] in solvers.model.chunks)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class RowNet(nn.Module):
    """``head(h + mlp(h))`` with ``h = stem(x)``, for ``x`` of shape ``(batch, tokens, 5)``."""

    def __init__(self, width: int = 4, vocab: int = 7) -> None:
        super().__init__()
        self.stem, self.mlp, self.head = nn.Linear(5, width), MLP(width), nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(h + self.mlp(h))
