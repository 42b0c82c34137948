"""Random small graphs and span families shared by the solver tests.

Seeded, so a failing case is named by its seed and drawn again the same way;
small enough (4 to 9 nodes) for brute force over every interval plan.
"""

from __future__ import annotations

import dataclasses
import random

from graphs import Graph, Node, Span

__all__ = ["random_graph", "random_outputs", "random_spans", "random_extra_bytes"]


def random_graph(seed: int, *, chain: bool) -> Graph:
    """A small random graph: random edges, save patterns, buffers, workspace,
    parameters, requires_grad, recomputable and grad_views flags, state buffers,
    outputs held through the backward (:func:`random_outputs`)."""
    rng = random.Random(seed)
    n = rng.randint(4, 9)
    nodes = []
    for i in range(n):
        if i == 0:
            inputs: tuple[str, ...] = ()
        elif chain:
            inputs = (f"n{i - 1}",)
        else:
            ins = [f"n{i - 1}"] if rng.random() < 0.8 else []
            ins += [f"n{j}" for j in range(i - 1) if rng.random() < 0.25]
            inputs = tuple(ins or [f"n{rng.randrange(i)}"])
        nodes.append(Node(
            name=f"n{i}", inputs=inputs, saves_inputs=tuple(x for x in inputs if rng.random() < 0.6),
            saves_output=rng.random() < 0.3, out_bytes=rng.randint(1, 20) * 100,
            saved_bytes=rng.choice([0, 0, rng.randint(1, 10) * 10]),
            workspace_bytes=rng.choice([0, 0, rng.randint(1, 10) * 10]),
            param_bytes=rng.choice([0, rng.randint(1, 5) * 10]),
            fwd_flops=rng.randint(0, 50), bwd_flops=rng.randint(0, 100),
            requires_grad=i == 0 or rng.random() < 0.9, recomputable=rng.random() < 0.95,
            # cat-like backward (input gradients are views of the output's), drawn apart so the
            # other fields keep their seeds
            grad_views=bool(inputs) and random.Random(seed * 7919 + i).random() < 0.25,
            # buffers a region snapshots while it recomputes (BatchNorm's statistics)
            state_bytes=random.Random(seed * 104729 + i).choice([0, 0, 0, 40, 300]),
        ))
    return Graph(nodes=tuple(nodes), param_bytes=rng.randint(0, 500), input_bytes=rng.randint(0, 100),
                 name=f"random{seed}", **random_outputs(n, seed))


def random_outputs(n: int, seed: int) -> dict:
    """``outputs`` and ``loop`` for a graph of ``n`` nodes (NOTE [ The user's loop ] in ``graphs.graph``):
    on most graphs one to three nodes the model returns (read by later nodes or not), held through the
    backward on four in five of those; drawn apart so the other fields keep their seeds."""
    r = random.Random(seed * 15485863 + 11)
    if r.random() < 0.25:
        return {}
    outputs = tuple(f"n{k}" for k in sorted(r.sample(range(n), r.randint(1, min(3, n)))))
    return {"outputs": outputs, "loop": "held" if r.random() < 0.8 else "dropped"}


def random_spans(n: int, rng: random.Random, *, laminar: bool) -> list[Span]:
    """A random module tree over ``0..n-1`` (children are consecutive runs of
    their parent, named ``<parent>.<i>``); unless ``laminar``, also runs of
    consecutive children (``<parent>[i:j]``, as ``nn.Sequential`` slices) and
    a few random intervals, which overlap the tree."""
    spans: list[Span] = []
    runs: list[tuple[str, list[tuple[int, int]]]] = []

    def grow(a: int, b: int, name: str, depth: int) -> None:
        if b == a or depth == 3 or rng.random() < 0.1:
            return
        cuts = sorted(rng.sample(range(a + 1, b + 1), min(b - a, rng.randint(1, 3))))
        kids = list(zip([a] + cuts, [c - 1 for c in cuts] + [b]))
        runs.append((name, kids))
        for i, (x, y) in enumerate(kids):
            if rng.random() < 0.9:
                spans.append(Span(x, y, f"{name}.{i}"))
            grow(x, y, f"{name}.{i}", depth + 1)

    if rng.random() < 0.5:
        spans.append(Span(0, n - 1, "m"))  # the whole model as one call
    grow(0, n - 1, "m", 0)
    spans += [Span(k, k, f"leaf{k}") for k in range(n) if rng.random() < 0.3]
    if not laminar:
        for name, kids in runs:
            for _ in range(rng.randint(0, 2)):
                i = rng.randrange(len(kids))
                j = rng.randrange(i, len(kids))
                spans.append(Span(kids[i][0], kids[j][1], f"{name}[{i}:{j + 1}]"))
        for _ in range(rng.randint(1, 3)):
            a = rng.randrange(n)
            spans.append(Span(a, rng.randrange(a, n), f"x{a}"))
    return spans or [Span(0, n - 1, "m")]


def random_extra_bytes(g: Graph, spans: list[Span], rng: random.Random) -> list[Span]:
    """The spans with random ``extra_bytes`` (eager lifetimes in a recompute, NOTE
    [ Execution model ]): none on a fifth of the graphs; else 0 on some spans
    and, on the others, from a tenth of the mean output to twice the largest."""
    if rng.random() < 0.2:
        return spans
    mean = sum(nd.out_bytes for nd in g.nodes) // len(g)
    top = max(nd.out_bytes for nd in g.nodes)
    return [dataclasses.replace(sp, extra_bytes=rng.choice([0, rng.randint(max(1, mean // 10), 2 * top)]))
            for sp in spans]


def with_randomness(graph: Graph, seed: int) -> Graph:
    """``graph`` with about a third of its nodes drawing random numbers and a generator state to store
    (NOTE [ RNG state per region ] in ``solvers.model.terms``)."""
    r = random.Random(9000 + seed)
    nodes = tuple(dataclasses.replace(nd, stochastic=r.random() < 0.35) for nd in graph.nodes)
    return dataclasses.replace(graph, nodes=nodes, rng_state_bytes=r.choice([40, 300, 1000]))
