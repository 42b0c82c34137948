"""``resnet`` (bottleneck ResNet with BatchNorm) and ``vgg19`` (a pure chain).

Both take images ``(batch, 3, size, size)`` and class labels and return the
cross-entropy loss. ``resnet`` with ``depth=50, width=64`` is ResNet-50's
shape; the defaults are small enough for a CPU test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ResNet", "VGG19", "build_resnet", "build_vgg19"]

_STAGES = {26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = 4 * mid
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        skip = x if self.down is None else self.down(x)
        return self.relu(out + skip)


class ResNet(nn.Module):
    """Bottleneck ResNet; ``forward(images, labels)`` returns the loss."""

    def __init__(self, depth: int = 50, width: int = 64, classes: int = 1000):
        super().__init__()
        if depth not in _STAGES:
            raise ValueError(f"depth {depth} is not one of {sorted(_STAGES)}")
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        layers: list[nn.Module] = []
        cin = width
        for stage, blocks in enumerate(_STAGES[depth]):
            mid = width * 2 ** stage
            for b in range(blocks):
                layers.append(Bottleneck(cin, mid, 2 if (b == 0 and stage > 0) else 1))
                cin = 4 * mid
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(images))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return F.cross_entropy(self.fc(x), labels)


_VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


class VGG19(nn.Module):
    """VGG-19 (Checkmate's benchmark model): conv/ReLU chain, 3 linear layers; returns the loss."""

    def __init__(self, width: int = 64, classes: int = 1000, image_size: int = 224, hidden: int = 4096):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in _VGG19:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                cout = int(v) * width // 64
                layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
                cin = cout
        self.features = nn.Sequential(*layers)
        side = max(image_size // 32, 1)
        self.classifier = nn.Sequential(nn.Linear(cin * side * side, hidden), nn.ReLU(), nn.Dropout(0.5),
                                        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.5),
                                        nn.Linear(hidden, classes))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.features(images), 1)
        return F.cross_entropy(self.classifier(x), labels)


def _images(batch: int, image_size: int, classes: int, dtype: torch.dtype) -> tuple[tuple, dict]:
    return (torch.randn(batch, 3, image_size, image_size, dtype=dtype),), {"labels": torch.randint(0, classes, (batch,))}


def build_resnet(*, depth: int = 26, width: int = 16, classes: int = 100, batch: int = 2, image_size: int = 64,
                 dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """``(model, args, kwargs)``; ``depth=50, width=64, classes=1000, image_size=224`` is ResNet-50."""
    with torch.device(device):
        model = ResNet(depth, width, classes).to(dtype)
        args, kwargs = _images(batch, image_size, classes, dtype)
    return model, args, kwargs


def build_vgg19(*, width: int = 16, classes: int = 100, hidden: int = 512, batch: int = 2, image_size: int = 64,
                dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """``(model, args, kwargs)``; ``width=64, hidden=4096, classes=1000, image_size=224`` is VGG-19."""
    with torch.device(device):
        model = VGG19(width, classes, image_size, hidden).to(dtype)
        args, kwargs = _images(batch, image_size, classes, dtype)
    return model, args, kwargs
