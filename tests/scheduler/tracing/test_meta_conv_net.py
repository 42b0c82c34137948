"""A meta trace for the CPU equals the CPU trace to the byte on a diffusion-style conv net (issue 33 item 7).

The ops of a diffusers ``UNet2DModel`` without diffusers: GroupNorm, 3x3 and 1x1 convolutions, SiLU, a strided
down-sampling convolution, nearest up-sampling, a skip concatenation, dropout, a time embedding added per
channel, and self-attention over the pixels through SDPA, trained with ``F.mse_loss``. Compared node by node
(outputs, saved bytes, what each saves, workspaces measured on this CPU) and by the store-all peak. A diffusers
``UNet2DModel`` (two levels, attention at the lower, widths 16/32 to 64/128, 16 to 64 pixels, dropout 0 or 0.1,
Fourier or positional time embedding, scale-shift, resnet up/down-sampling) gave meta = cpu to the byte here
(torch 2.14.1, diffusers 0.42.1); the 1.9 % the issue reported was not reproduced.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import scheduler
from solvers import simulate


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(4, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(temb, cout)
        self.norm2, self.drop, self.conv2 = nn.GroupNorm(4, cout), nn.Dropout(0.1), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.time(F.silu(t))[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return self.skip(x) + h


class Attention(nn.Module):
    def __init__(self, c: int, heads: int = 2) -> None:
        super().__init__()
        self.norm, self.qkv, self.out, self.heads = nn.GroupNorm(4, c), nn.Linear(c, 3 * c), nn.Linear(c, c), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        h = self.norm(x).flatten(2).transpose(1, 2)
        q, k, v = (z.unflatten(-1, (self.heads, -1)).transpose(1, 2) for z in self.qkv(h).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return x + self.out(a).transpose(1, 2).reshape(b, c, hh, ww)


class TinyUNet(nn.Module):
    def __init__(self, c: int = 8, temb: int = 16) -> None:
        super().__init__()
        self.temb = nn.Sequential(nn.Linear(1, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.down = ResBlock(c, c, temb)
        self.pool = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.mid, self.attn = ResBlock(c, 2 * c, temb), Attention(2 * c)
        self.up = ResBlock(3 * c, c, temb)
        self.out = nn.Sequential(nn.GroupNorm(4, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        e = self.temb(t[:, None].float())
        h = self.down(self.inp(x), e)
        m = self.attn(self.mid(self.pool(h), e))
        u = F.interpolate(m, scale_factor=2.0, mode="nearest")
        return self.out(self.up(torch.cat([u, h], dim=1), e))


FIELDS = ("name", "out_bytes", "saved_bytes", "workspace_bytes", "saves_output", "saves_inputs", "param_bytes",
          "stochastic")


def test_a_meta_trace_for_the_cpu_equals_the_cpu_trace_to_the_byte():
    torch.manual_seed(0)
    x, t, y = torch.randn(2, 3, 16, 16), torch.tensor([10, 500]), torch.randn(2, 3, 16, 16)
    cpu = scheduler.trace(TinyUNet().train(), (x, t), loss=lambda out: F.mse_loss(out, y), granularity="op")
    with torch.device("meta"):
        twin = TinyUNet().train()
    ym = y.to("meta")
    meta = scheduler.trace(twin, (x.to("meta"), t.to("meta")), loss=lambda out: F.mse_loss(out, ym), target="cpu",
                           granularity="op")
    assert meta.meta["workspaces"] == "cpu"  # measured on this CPU's kernels, as the CPU trace's
    assert any(nd.workspace_bytes for nd in cpu.nodes)
    assert {"aten.group_norm.default", "aten.conv2d.default", "aten.upsample_nearest2d.vec", "aten.silu.default",
            "aten.scaled_dot_product_attention.default", "aten.dropout.default", "aten.cat.default"} <= \
        {nd.op for nd in cpu.nodes}
    assert [tuple(getattr(nd, f) for f in FIELDS) for nd in meta.nodes] == \
        [tuple(getattr(nd, f) for f in FIELDS) for nd in cpu.nodes]
    assert simulate(meta).peak_bytes == simulate(cpu).peak_bytes
