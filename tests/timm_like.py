"""A small vision transformer written as timm writes ``vit_*`` (the op pattern, not timm's code).

The regression tests in ``tests/regressions/test_timm_vit_*.py`` use it in place of
``timm.create_model("vit_small_patch16_224", img_size=128)``, which exposed them:
patch embedding by a strided convolution, ``flatten(2).transpose(1, 2)``, a class
token concatenated in front, a position embedding added, pre-norm blocks whose
attention and MLP end in ``Dropout(p=0)`` (no op in training: it returns its
input) before the residual add, a final norm, the class token's row, and the head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(0.0)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, *, image: int = 32, patch: int = 8, dim: int = 64, heads: int = 4, depth: int = 2,
                 classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(patch, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.pos_drop = nn.Dropout(0.0)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head_drop = nn.Dropout(0.0)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(x + self.pos_embed)
        x = self.norm(self.blocks(x))
        return self.head(self.head_drop(x[:, 0]))


def vit_example(batch: int = 4, image: int = 32, **options: int):
    """``(model, images, labels, loss)``: the model in training mode, seeded inputs, cross-entropy."""
    torch.manual_seed(0)
    model = VisionTransformer(image=image, **options).train()
    x = torch.randn(batch, 3, image, image)
    y = torch.randint(0, model.head.out_features, (batch,))
    return model, x, y, lambda out: F.cross_entropy(out, y)
