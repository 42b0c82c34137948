"""Seeded synthetic graphs for tests and benchmarks.

Every generator is deterministic for a given ``seed`` and returns a valid
:class:`~graphs.graph.Graph`. Sizes are in bytes and FLOPs of plausible
magnitude (a few MB per activation) so that budgets in GiB read naturally.

Families (``FAMILIES`` maps a name to ``f(n, seed) -> Graph`` with about
``n`` nodes):

* ``chain``: homogeneous chain, every node the same.
* ``hetero-chain``: chain with random sizes and FLOPs.
* ``residual``: a chain with a skip connection every ``k`` nodes (ResNet).
* ``unet``: encoder/decoder with long skips from each encoder level to the
  mirrored decoder level.
* ``transformer``: attention + MLP blocks with residual adds, and an attention
  mask read by every block (a "common node").
* ``random-dag``: random layered DAG.

Every generator takes ``saveable`` (default 0: the graph as it always was),
the probability that a node can be kept by selective recompute
(:func:`mark_saveable`).

:func:`repeated_blocks` builds what a traced LLM is at small scale: a chain
of identical random blocks, tensors without grad every block reads, and
(optionally) the module calls as spans.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable

from .graph import Graph
from .node import Node

__all__ = [
    "chain",
    "hetero_chain",
    "residual",
    "unet",
    "transformer",
    "random_dag",
    "repeated_blocks",
    "FAMILIES",
    "make",
    "mark_saveable",
]

MB = 1 << 20


def chain(n: int, *, out_bytes: int = 4 * MB, flops: int = 10**9, seed: int = 0, saveable: float = 0.0) -> Graph:
    """A homogeneous chain of ``n`` nodes: each saves its input (like a linear layer)."""
    nodes = []
    for i in range(n):
        inputs = (f"n{i-1}",) if i else ()
        nodes.append(Node(name=f"n{i}", op="linear", inputs=inputs, saves_inputs=inputs,
                          out_bytes=out_bytes, fwd_flops=flops, bwd_flops=2 * flops))
    graph = Graph(nodes=tuple(nodes), input_bytes=out_bytes, name=f"chain{n}",
                 meta={"family": "chain", "n": n})
    return mark_saveable(graph, saveable, seed=seed)


def hetero_chain(n: int, *, seed: int = 0, saveable: float = 0.0) -> Graph:
    """A chain with random output sizes, FLOPs and save patterns."""
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        inputs = (f"n{i-1}",) if i else ()
        kind = rng.choice(["linear", "relu", "dropout", "add", "norm"])
        out = rng.randint(1, 16) * MB
        flops = rng.randint(1, 50) * 10**8 if kind == "linear" else rng.randint(1, 5) * 10**6
        nodes.append(Node(
            name=f"n{i}", op=kind, inputs=inputs,
            saves_inputs=inputs if kind in ("linear", "norm") else (),
            saves_output=kind == "relu",
            saved_bytes=out // 4 if kind == "dropout" else (out // 64 if kind == "norm" else 0),
            stochastic=kind == "dropout",
            out_bytes=out, fwd_flops=flops, bwd_flops=2 * flops,
        ))
    graph = Graph(nodes=tuple(nodes), input_bytes=4 * MB, name=f"hetero-chain{n}",
                 meta={"family": "hetero-chain", "n": n, "seed": seed})
    return mark_saveable(graph, saveable, seed=seed)


def residual(n: int, *, k: int = 3, seed: int = 0, saveable: float = 0.0) -> Graph:
    """A chain with a skip every ``k`` nodes: ``add`` joins the block and its input."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    block_in = None
    i = 0
    while len(nodes) < n:
        name = f"n{i}"
        prev = nodes[-1].name if nodes else None
        pos = i % (k + 1)
        if pos == 0:
            inputs = (prev,) if prev else ()
            nodes.append(Node(name=name, op="conv", inputs=inputs, saves_inputs=inputs,
                              out_bytes=rng.randint(2, 8) * MB, fwd_flops=rng.randint(5, 20) * 10**8))
            block_in = name
        elif pos < k:
            op = "relu" if pos % 2 else "conv"
            nodes.append(Node(name=name, op=op, inputs=(prev,),
                              saves_inputs=(prev,) if op == "conv" else (), saves_output=op == "relu",
                              out_bytes=rng.randint(2, 8) * MB,
                              fwd_flops=rng.randint(5, 20) * 10**8 if op == "conv" else 10**6))
        else:
            inputs = (prev, block_in) if block_in != prev else (prev,)
            nodes.append(Node(name=name, op="add", inputs=inputs, saves_inputs=(),
                              out_bytes=nodes[-1].out_bytes, fwd_flops=10**6))
        i += 1
    nodes = [_fix_bwd(nd) for nd in nodes]
    graph = Graph(nodes=tuple(nodes), input_bytes=4 * MB, name=f"residual{n}",
                 meta={"family": "residual", "n": n, "k": k, "seed": seed})
    return mark_saveable(graph, saveable, seed=seed)


def unet(n: int, *, seed: int = 0, saveable: float = 0.0) -> Graph:
    """A U-Net: ``depth`` encoder levels, a bottleneck, mirrored decoder levels.

    Each level is ``conv, relu``; the decoder's first node at each level also
    reads the encoder output of the same level (a long skip). Sizes halve
    going down and double going up, as resolution does.
    """
    rng = random.Random(seed)
    depth = max(1, (n - 2) // 6)
    nodes: list[Node] = []
    skips: list[str] = []

    def add(op: str, inputs: tuple[str, ...], out: int, flops: int) -> str:
        name = f"n{len(nodes)}"
        saves_in = inputs if op in ("conv", "up") else ()
        nodes.append(Node(name=name, op=op, inputs=inputs, saves_inputs=saves_in,
                          saves_output=op == "relu", out_bytes=out, fwd_flops=flops, bwd_flops=2 * flops,
                          saved_bytes=out // 4 if op == "pool" else 0))
        return name

    size = 32 * MB
    x = add("conv", (), size, rng.randint(5, 10) * 10**8)
    sizes: list[int] = []
    for _ in range(depth):
        x = add("conv", (x,), size, rng.randint(5, 10) * 10**8)
        x = add("relu", (x,), size, 10**6)
        skips.append(x)
        sizes.append(size)
        size = max(MB, size // 2)
        x = add("pool", (x,), size, 10**6)
    x = add("conv", (x,), size, rng.randint(5, 10) * 10**8)
    for _ in range(depth):
        size = sizes.pop()  # mirror the encoder's resolution on the way up
        x = add("up", (x,), size, rng.randint(2, 5) * 10**8)
        x = add("conv", (x, skips.pop()), size, rng.randint(5, 10) * 10**8)
        x = add("relu", (x,), size, 10**6)
    while len(nodes) < n:
        x = add("conv", (x,), size, rng.randint(1, 5) * 10**8)
    graph = Graph(nodes=tuple(nodes), input_bytes=8 * MB, name=f"unet{n}",
                 meta={"family": "unet", "n": n, "seed": seed})
    return mark_saveable(graph, saveable, seed=seed)


def transformer(n: int, *, seed: int = 0, act_bytes: int = 4 * MB, spans: bool = False,
                saveable: float = 0.0) -> Graph:
    """A stack of transformer blocks with ~``n`` nodes (12 per block).

    An attention mask (no grad) is computed once and read by every block's
    attention: the tensor that crosses every cut.

    With ``spans``, the graph lists the submodule calls of a GPT-2-like
    module tree (NOTE [ Module-aligned regions ] in ``graphs.graph``): the
    embedding ``wte``, each block ``h.<i>`` and inside it ``ln_1``, ``attn``
    (QKV to the residual dropout), ``ln_2`` and ``mlp``, then ``ln_f`` and
    ``lm_head``.
    """
    rng = random.Random(seed)
    nodes: list[Node] = []
    a = act_bytes

    module = ""

    def add(op, inputs, out, flops, *, saves=None, saves_output=False, saved=0, rg=True, stochastic=False):
        name = f"n{len(nodes)}"
        inputs = tuple(inputs)
        nodes.append(Node(name=name, op=op, inputs=inputs, module=module,
                          saves_inputs=tuple(inputs if saves is None else saves),
                          saves_output=saves_output, saved_bytes=saved, out_bytes=out,
                          fwd_flops=flops, bwd_flops=2 * flops if rg else 0,
                          requires_grad=rg, stochastic=stochastic))
        return name

    mm = 4 * 10**8
    x = add("embedding", (), a, 10**6, saves=())
    mask = add("mask", (), a // 16, 0, saves=(), rg=False)
    blocks = max(1, (n - 4) // 12)
    for blk in range(blocks):
        module = f"h.{blk}"
        h = add("layer_norm", (x,), a, 10**6, saved=a // 64)
        qkv = add("linear", (h,), 3 * a, 3 * mm)
        att = add("attention", (qkv, mask), a, 2 * mm, saves=(qkv,), saved=a // 8)
        p = add("linear", (att,), a, mm)
        d = add("dropout", (p,), a, 10**6, saves=(), saved=a // 4, stochastic=True)
        x = add("add", (x, d), a, 10**6, saves=())
        h = add("layer_norm", (x,), a, 10**6, saved=a // 64)
        f = add("linear", (h,), 4 * a, 4 * mm)
        g = add("gelu", (f,), 4 * a, 10**6)
        f2 = add("linear", (g,), a, 4 * mm)
        d = add("dropout", (f2,), a, 10**6, saves=(), saved=a // 4, stochastic=True)
        x = add("add", (x, d), a, 10**6, saves=())
    module = ""
    x = add("layer_norm", (x,), a, 10**6, saved=a // 64)
    add("lm_head", (x,), 8 * a, rng.randint(8, 12) * mm)
    add("loss", (nodes[-1].name,), 4, 10**6, saves=(nodes[-1].name,))
    calls: list[tuple[int, int, str]] = []
    if spans:
        calls.append((0, 0, "wte"))
        for blk in range(blocks):
            s = 2 + 12 * blk
            calls += [(s, s + 11, f"h.{blk}"), (s, s, f"h.{blk}.ln_1"), (s + 1, s + 4, f"h.{blk}.attn"),
                      (s + 6, s + 6, f"h.{blk}.ln_2"), (s + 7, s + 10, f"h.{blk}.mlp")]
        calls += [(len(nodes) - 3, len(nodes) - 3, "ln_f"), (len(nodes) - 2, len(nodes) - 2, "lm_head")]
    graph = Graph(nodes=tuple(nodes), input_bytes=a // 16, name=f"transformer{n}",
                 meta={"family": "transformer", "n": n, "seed": seed}, spans=tuple(calls))
    return mark_saveable(graph, saveable, seed=seed)


def random_dag(n: int, *, seed: int = 0, width: int = 3, p_skip: float = 0.3,
               saveable: float = 0.0) -> Graph:
    """A random layered DAG: layers of up to ``width`` nodes, edges from the
    previous layer plus occasional longer skips; one sink at the end."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    prev_layer: list[str] = []
    all_names: list[str] = []
    while len(nodes) < n - 1:
        w = min(rng.randint(1, width), n - 1 - len(nodes))
        layer = []
        for _ in range(w):
            name = f"n{len(nodes)}"
            inputs: list[str] = []
            if prev_layer:
                inputs.append(rng.choice(prev_layer))
                if len(prev_layer) > 1 and rng.random() < 0.5:
                    other = rng.choice(prev_layer)
                    if other not in inputs:
                        inputs.append(other)
                if rng.random() < p_skip and len(all_names) > len(prev_layer):
                    far = rng.choice(all_names[: len(all_names) - len(prev_layer)])
                    if far not in inputs:
                        inputs.append(far)
            kind = rng.random()
            saves = tuple(inputs) if kind < 0.6 else ()
            out = rng.randint(1, 16) * MB
            flops = rng.randint(1, 40) * 10**8
            nodes.append(Node(name=name, op="op", inputs=tuple(inputs), saves_inputs=saves,
                              saves_output=kind > 0.85, saved_bytes=out // 8 if 0.6 <= kind < 0.7 else 0,
                              out_bytes=out, fwd_flops=flops, bwd_flops=2 * flops))
            layer.append(name)
        all_names.extend(layer)
        prev_layer = layer
    # One sink that reads every node nothing else reads, so the graph has one output.
    consumed = {s for nd in nodes for s in nd.inputs}
    dangling = tuple(nd.name for nd in nodes if nd.name not in consumed)
    nodes.append(Node(name=f"n{len(nodes)}", op="loss", inputs=dangling, saves_inputs=dangling,
                      out_bytes=4, fwd_flops=10**6, bwd_flops=2 * 10**6))
    graph = Graph(nodes=tuple(nodes), input_bytes=4 * MB, name=f"random-dag{n}",
                 meta={"family": "random-dag", "n": n, "seed": seed})
    return mark_saveable(graph, saveable, seed=seed)


def repeated_blocks(blocks: int, size: int, *, seed: int = 0, spans: bool = True, common: int = 1,
                    cut: bool = False, saveable: float = 0.0) -> Graph:
    """A chain of ``blocks`` identical blocks of ``size`` nodes, as a traced LLM is.

    The prefix is an embedding and ``common`` tensors without grad that every
    block reads (a mask, rotary tables); each block is the same random
    template (edges inside the block, save patterns, buffers, workspaces,
    parameters, ``grad_views``, now and then an output nobody reads) ending
    in a residual add when ``size >= 2``; the suffix is a head and a loss.

    With ``spans``: the model call (everything but the loss), the embedding,
    each block ``blocks.<i>``, the same random sub-calls inside every block,
    the head, and sometimes a run of whole blocks (``blocks[0:2]``, as an
    ``nn.Sequential`` slice). With ``cut`` also a span from inside one block
    to inside the next (the blocks it cuts cannot be composed).
    """
    rng = random.Random(seed)
    res = rng.randint(2, 12) * 100  # the residual stream's bytes
    template = []
    for r in range(size):
        ins: list[str] = ["x"] if r == 0 else [f"{r - 1}"]
        if r >= 2 and rng.random() < 0.3:
            ins.append(rng.choice(["x"] + [f"{q}" for q in range(r - 1)]))
        if r == size - 1 and size >= 2 and "x" not in ins:
            ins.append("x")  # the residual add
        template.append({
            "ins": ins, "out": res if r == size - 1 else rng.randint(1, 20) * 100,
            "save": [x for x in ins if rng.random() < 0.6], "self": rng.random() < 0.3,
            "buf": rng.choice([0, 0, rng.randint(1, 10) * 10]), "ws": rng.choice([0, 0, rng.randint(1, 10) * 10]),
            "param": rng.choice([0, rng.randint(1, 5) * 10]), "flops": rng.randint(1, 50),
            "views": r > 0 and rng.random() < 0.15, "state": rng.choice([0] * 6 + [40]),
            "rg": rng.random() < 0.92, "sink": rng.random() < 0.1,
        })
    for c in range(common):  # every block reads every common tensor
        t = template[rng.randrange(size)]
        t["ins"].append(f"c{c}")
        if rng.random() < 0.5:
            t["save"].append(f"c{c}")
    nodes = [Node("emb", out_bytes=res, fwd_flops=5, saves_inputs=())]
    nodes += [Node(f"c{c}", out_bytes=rng.randint(1, 4) * 100, fwd_flops=0, requires_grad=False) for c in range(common)]
    x = "emb"
    first = []
    for i in range(blocks):
        first.append(len(nodes))
        name = {"x": x, **{f"c{c}": f"c{c}" for c in range(common)}}
        for r, t in enumerate(template):
            name[f"{r}"] = f"b{i}.{r}"
            ins = tuple(dict.fromkeys(name[a] for a in t["ins"]))
            nodes.append(Node(f"b{i}.{r}", inputs=ins, saves_inputs=tuple(dict.fromkeys(name[a] for a in t["save"])),
                              saves_output=t["self"], out_bytes=t["out"], saved_bytes=t["buf"],
                              workspace_bytes=t["ws"], param_bytes=t["param"], fwd_flops=t["flops"],
                              bwd_flops=2 * t["flops"], grad_views=t["views"], state_bytes=t["state"],
                              stateful=t["state"] > 0, requires_grad=t["rg"] or r == size - 1))
            if t["sink"]:
                nodes.append(Node(f"b{i}.{r}.aux", inputs=(f"b{i}.{r}",), saves_inputs=(), out_bytes=100,
                                  fwd_flops=1))
        x = nodes[-1].name if not template[-1]["sink"] else nodes[-2].name
    nodes.append(Node("head", inputs=(x,), out_bytes=rng.randint(1, 20) * 100, fwd_flops=40, param_bytes=50))
    nodes.append(Node("loss", inputs=("head",), out_bytes=4, fwd_flops=1))
    n = len(nodes)
    calls: list[tuple[int, int, str]] = []
    if spans:
        per = (first[1] - first[0]) if blocks > 1 else n - 3 - common
        inner = {(a, b) for a, b in (sorted(rng.sample(range(per), 2)) if per > 1 else (0, 0)
                                     for _ in range(rng.randint(1, 4)))}
        inner |= {(r, r) for r in range(per) if rng.random() < 0.3}
        calls += [(0, n - 2, "model"), (0, 0, "emb"), (n - 2, n - 2, "head")]
        for i, f in enumerate(first):
            calls.append((f, f + per - 1, f"blocks.{i}"))
            calls += [(f + a, f + b, f"blocks.{i}.m{a}_{b}") for a, b in sorted(inner)]
        if blocks >= 2 and rng.random() < 0.5:
            calls.append((first[0], first[1] + per - 1, "blocks[0:2]"))
        if cut and blocks >= 3:
            calls.append((first[1] + per // 2, first[2] + per // 2, "across"))
    graph = Graph(nodes=tuple(nodes), param_bytes=200 + 10 * blocks, input_bytes=50, name=f"blocks{blocks}x{size}",
                 meta={"family": "repeated-blocks", "blocks": blocks, "size": size, "seed": seed},
                 spans=tuple(calls))
    return mark_saveable(graph, saveable, seed=seed, key=_template_row)


def mark_saveable(graph: Graph, p: float, *, seed: int = 0, key: Callable[[str], str] | None = None) -> Graph:
    """``graph`` with some nodes marked keepable by a selective-checkpoint policy.

    A node is marked (``dispatch=("op",)``, ``sac_op=0``: NOTE [ Selective
    recompute ] in ``solvers.model.simulate``) with probability ``p``, drawn from
    its own stream keyed by ``seed`` and ``key(name)`` (the name by default),
    so the other fields keep their seeds and ``p=0`` returns ``graph`` itself.

    Args:
        graph: the graph.
        p: probability in ``[0, 1]``.
        seed: the draw's seed.
        key: maps a node name to what its draw depends on (nodes with one key
            are marked alike: the same row of every repeated block).

    Returns:
        The marked graph (``graph`` itself when ``p == 0``).

    Raises:
        ValueError: ``p`` outside ``[0, 1]``.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"saveable must be a probability in [0, 1], got {p!r}")
    if p == 0:
        return graph
    key = key or (lambda name: name)
    nodes = [dataclasses.replace(nd, dispatch=("op",), sac_op=0)
             if random.Random(f"sac:{seed}:{key(nd.name)}").random() < p else nd for nd in graph.nodes]
    return graph.with_nodes(nodes)


def _template_row(name: str) -> str:
    """``b3.5`` -> ``5`` (the row of a repeated block); other names unchanged."""
    return name.split(".", 1)[1] if name.startswith("b") and "." in name else name


def _fix_bwd(node: Node) -> Node:
    return dataclasses.replace(node, bwd_flops=2 * node.fwd_flops)


FAMILIES: dict[str, Callable[..., Graph]] = {
    "chain": lambda n, seed=0, saveable=0.0: chain(n, seed=seed, saveable=saveable),
    "hetero-chain": hetero_chain,
    "residual": residual,
    "unet": unet,
    "transformer": transformer,
    "random-dag": random_dag,
}


def make(family: str, n: int, seed: int = 0, *, saveable: float = 0.0) -> Graph:
    """``FAMILIES[family](n, seed=seed, saveable=saveable)`` with a clear error for unknown names.

    Args:
        family: a key of :data:`FAMILIES`.
        n: about how many nodes.
        seed: the generator's seed.
        saveable: probability that a node is keepable by selective recompute
            (:func:`mark_saveable`); 0 leaves the graph as it always was.

    Returns:
        The graph.
    """
    try:
        fn = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown graph family {family!r}; choose one of {sorted(FAMILIES)}") from None
    return fn(n, seed=seed, saveable=saveable)
