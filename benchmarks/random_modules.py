"""Small random torch modules from a seed, built from an explicit grammar of constructs.

The model of the step (``simulate``) is checked against the run on these
(``benchmarks.random_plans``): every module is a token model (batch x tokens
x width) whose graph has residual and branching paths, views and in-place
ops, normalisations, dropout, attention, convolutions, submodules nested two
levels below the body (so regions and nested regions exist), a row-wise head
read by a cross-entropy, and optionally a cache-like tensor in its output.

The grammar (each construct is one submodule call of the body, a block):

    model  := stem, body (nn.Sequential of 1..3 blocks; a loop over them with a cache), head [, cache]
    block  := mlp | attn | conv | branch | norm
    mlp    := x + MLP(LN(x))                MLP: Linear, act, [Dropout], Linear (two products: row-wise)
    attn   := x + Attn(LN(x))               Attn: Linear -> q, k, v as heads (view, transpose), softmax(q k^T) v
                                            with [dropout] or F.scaled_dot_product_attention, transpose back, Linear
    conv   := x + Conv(x)                   Conv: transpose, Conv1d, BatchNorm1d, ReLU(inplace=True), transpose
    branch := Mix(A(x), B(x))               A, B: Linear [+ act]; Mix: add, mul, or cat then Linear
    norm   := act(Linear(LN(x)).add_(x)), [Dropout]   (in place on a tensor the block made)
    act    := GELU | ReLU(inplace=True) | SiLU | Tanh
    stem   := Linear(features, width)       head := [LayerNorm,] Linear(width, vocab)

A block's children (LN, MLP, Attn, ...) are submodules too, and attention's
projections are submodules of Attn: two levels below each block. ``describe``
names a module by its constructs (its readable id), ``build`` makes it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["BLOCKS", "ACTS", "Spec", "Block", "draw_spec", "build", "describe", "inputs", "loss_fn", "random_case"]

#: The block constructs of the grammar (see the module's docstring).
BLOCKS = ("mlp", "attn", "conv", "branch", "norm")
#: The activations a block may use.
ACTS = ("gelu", "relu_", "silu", "tanh")


@dataclass(frozen=True)
class Block:
    """One block of the body: its construct and its options (what ``describe`` prints)."""

    kind: str
    act: str = "gelu"
    dropout: float = 0.0
    option: str = ""  # attn: "sdpa" | "manual"; branch: "add" | "mul" | "cat"

    def label(self) -> str:
        parts = [self.option] if self.option else []
        if self.kind in ("mlp", "branch", "norm"):
            parts.append(self.act)
        if self.dropout:
            parts.append(f"p{self.dropout:g}")
        return f"{self.kind}({','.join(parts)})" if parts else self.kind


@dataclass(frozen=True)
class Spec:
    """A random module: its shape and its blocks, all drawn from ``seed``."""

    seed: int
    batch: int
    tokens: int
    features: int
    width: int
    heads: int
    vocab: int
    blocks: tuple[Block, ...]
    head_norm: bool = False
    cache: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return describe(self)


def describe(spec: Spec) -> str:
    """The readable id of a module: ``s12:attn(sdpa)>mlp(relu_,p0.1)>conv/ln-head+cache``."""
    head = ("ln-" if spec.head_norm else "") + "head" + ("+cache" if spec.cache else "")
    return f"s{spec.seed}:" + ">".join(b.label() for b in spec.blocks) + "/" + head


def draw_spec(seed: int, *, max_blocks: int = 3) -> Spec:
    """The module of ``seed``: 1 to ``max_blocks`` blocks, tiny sizes (a step in milliseconds)."""
    rng = random.Random(seed)
    heads = rng.choice((1, 2, 4))
    width = heads * rng.choice((4, 8))
    blocks = []
    for _ in range(rng.randint(1, max_blocks)):
        kind = rng.choice(BLOCKS)
        option = {"attn": rng.choice(("sdpa", "manual")), "branch": rng.choice(("add", "mul", "cat"))}.get(kind, "")
        dropout = rng.choice((0.0, 0.0, 0.1)) if kind in ("mlp", "attn", "norm") else 0.0
        blocks.append(Block(kind=kind, act=rng.choice(ACTS), dropout=dropout, option=option))
    return Spec(seed=seed, batch=rng.choice((1, 2)), tokens=rng.choice((4, 6, 8)), features=rng.choice((3, 5)),
                width=width, heads=heads, vocab=rng.choice((7, 11, 16)), blocks=tuple(blocks),
                head_norm=rng.random() < 0.5, cache=rng.random() < 0.25)


def _act(name: str) -> nn.Module:
    return {"gelu": nn.GELU(), "relu_": nn.ReLU(inplace=True), "silu": nn.SiLU(), "tanh": nn.Tanh()}[name]


class MLP(nn.Module):
    def __init__(self, width: int, act: str, dropout: float) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(width, 2 * width), _act(act), nn.Linear(2 * width, width)
        self.drop = nn.Dropout(dropout) if dropout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.up(x))
        if self.drop is not None:
            y = self.drop(y)
        return self.down(y)


class Attn(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, kind: str, cache: bool) -> None:
        super().__init__()
        self.heads, self.kind, self.p, self.cache = heads, kind, dropout, cache
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> Any:
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.kind == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
            y = F.dropout(scores.softmax(-1), self.p, self.training) @ v
        y = self.out(y.transpose(1, 2).reshape(b, t, w))
        return (y, torch.stack((k, v))) if self.cache else y


class Conv(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv1d(width, width, 3, padding=1), nn.BatchNorm1d(width), nn.ReLU(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x.transpose(1, 2)))).transpose(1, 2)


class Branch(nn.Module):
    def __init__(self, width: int, act: str, mix: str) -> None:
        super().__init__()
        self.a, self.act, self.b, self.mix = nn.Linear(width, width), _act(act), nn.Linear(width, width), mix
        self.join = nn.Linear(2 * width, width) if mix == "cat" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.act(self.a(x)), self.b(x)
        if self.mix == "add":
            return a + b
        if self.mix == "mul":
            return a * b
        return self.join(torch.cat((a, b), -1))


class BlockModule(nn.Module):
    """One block of :data:`BLOCKS` (its children are submodules: regions nest inside it)."""

    def __init__(self, block: Block, width: int, heads: int, cache: bool) -> None:
        super().__init__()
        self.kind, self.cache = block.kind, cache
        if block.kind in ("mlp", "attn", "norm"):
            self.ln = nn.LayerNorm(width)
        if block.kind == "mlp":
            self.mlp = MLP(width, block.act, block.dropout)
        elif block.kind == "attn":
            self.attn = Attn(width, heads, block.dropout, block.option, cache)
        elif block.kind == "conv":
            self.conv = Conv(width)
        elif block.kind == "branch":
            self.branch = Branch(width, block.act, block.option)
        else:
            self.proj, self.act = nn.Linear(width, width), _act(block.act)
            self.drop = nn.Dropout(block.dropout) if block.dropout else None

    def forward(self, x: torch.Tensor) -> Any:
        if self.kind == "mlp":
            return x + self.mlp(self.ln(x))
        if self.kind == "attn" and self.cache:
            y, cache = self.attn(self.ln(x))
            return x + y, cache  # a cache-like output: the keys and values
        if self.kind == "attn":
            return x + self.attn(self.ln(x))
        if self.kind == "conv":
            return x + self.conv(x)
        if self.kind == "branch":
            return self.branch(x)
        y = self.proj(self.ln(x))
        y.add_(x)  # in place on a tensor the block made (a linear's output, which nothing saves)
        y = self.act(y)
        return self.drop(y) if self.drop is not None else y


class CacheBody(nn.ModuleList):
    """The blocks of a model with a cache, in order; attention blocks' keys and values are collected."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        caches = []
        for block in self:
            x = block(x)
            if isinstance(x, tuple):
                x, cache = x
                caches.append(cache)
        return x, caches


class RandomModel(nn.Module):
    """A module of :class:`Spec`: ``forward(x) -> logits`` (or ``(logits, caches)`` with ``spec.cache``)."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.spec = spec
        self.stem = nn.Linear(spec.features, spec.width)
        blocks = [BlockModule(b, spec.width, spec.heads, spec.cache) for b in spec.blocks]
        # a plain nn.Sequential: runs of its children are calls too (NOTE [ Module-aligned regions ])
        self.body = CacheBody(blocks) if spec.cache else nn.Sequential(*blocks)
        self.norm = nn.LayerNorm(spec.width) if spec.head_norm else None
        self.head = nn.Linear(spec.width, spec.vocab)

    def forward(self, x: torch.Tensor) -> Any:
        h, caches = self.body(self.stem(x)) if self.spec.cache else (self.body(self.stem(x)), [])
        if self.norm is not None:
            h = self.norm(h)
        logits = self.head(h)
        return (logits, tuple(caches)) if self.spec.cache and caches else logits


def build(spec: Spec) -> RandomModel:
    """The module of ``spec``, its weights drawn from ``spec.seed``, in training mode."""
    with torch.random.fork_rng():
        torch.manual_seed(spec.seed)
        return RandomModel(spec).train()


def inputs(spec: Spec) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, labels)`` for a step of ``spec``'s module, drawn from its seed."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    x = torch.randn(spec.batch, spec.tokens, spec.features, generator=g)
    return x, torch.randint(0, spec.vocab, (spec.batch, spec.tokens), generator=g)


def loss_fn(labels: torch.Tensor) -> Any:
    """The step's loss: the cross-entropy of the logits (the first output) over every token row."""

    def loss(out: Any) -> torch.Tensor:
        logits = out[0] if isinstance(out, tuple) else out
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    return loss


def random_case(seed: int, device: torch.device | str | None = None, **options: Any
                ) -> tuple[Spec, RandomModel, tuple[torch.Tensor], Any]:
    """``(spec, model, args, loss)`` of ``seed``: what ``scheduler.trace`` takes; on ``device`` when given (the
    weights and inputs are drawn on the CPU, so they are the same on every device)."""
    spec = draw_spec(seed, **options)
    x, labels = inputs(spec)
    model = build(spec)
    if device is not None:
        model, x, labels = model.to(device), x.to(device), labels.to(device)
    return spec, model, (x,), loss_fn(labels)
