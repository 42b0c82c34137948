"""``unet``: a U-Net (encoder, decoder, long skip connections) for segmentation.

``forward(images, masks)`` returns the per-pixel cross-entropy. The long skips
make it a DAG whose articulation points are few: chain-only planners do badly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["UNet", "build"]


class DoubleConv(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                  nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UNet(nn.Module):
    """U-Net with ``levels`` down/up steps and ``width`` channels at the top."""

    def __init__(self, levels: int = 4, width: int = 64, in_channels: int = 3, classes: int = 2):
        super().__init__()
        self.inc = DoubleConv(in_channels, width)
        self.down = nn.ModuleList(DoubleConv(width * 2 ** i, width * 2 ** (i + 1)) for i in range(levels))
        self.upconv = nn.ModuleList(nn.ConvTranspose2d(width * 2 ** (i + 1), width * 2 ** i, 2, stride=2)
                                    for i in reversed(range(levels)))
        self.up = nn.ModuleList(DoubleConv(width * 2 ** (i + 1), width * 2 ** i) for i in reversed(range(levels)))
        self.out = nn.Conv2d(width, classes, 1)

    def forward(self, images: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        x = self.inc(images)
        skips = []
        for down in self.down:
            skips.append(x)
            x = down(F.max_pool2d(x, 2))
        for upconv, up in zip(self.upconv, self.up):
            x = up(torch.cat([skips.pop(), upconv(x)], dim=1))
        return F.cross_entropy(self.out(x), masks)


def build(*, levels: int = 3, width: int = 16, classes: int = 2, batch: int = 2, image_size: int = 64,
          dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """``(model, args, kwargs)``; ``levels=4, width=64`` is the original U-Net's shape."""
    if image_size % (2 ** levels):
        raise ValueError(f"image size {image_size} must be a multiple of 2**levels = {2 ** levels}")
    with torch.device(device):
        model = UNet(levels, width, 3, classes).to(dtype)
        images = torch.randn(batch, 3, image_size, image_size, dtype=dtype)
        masks = torch.randint(0, classes, (batch, image_size, image_size))
    return model, (images,), {"masks": masks}
