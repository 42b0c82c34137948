"""The short ways a region's call takes (NOTE [ Region call overhead ], NOTE [ Calls no policy keeps ]).

Each fast path gives what the general way gave: the same tensors split off
the arguments in the same order (fresh containers on every rebuild), the
same statistics and stochastic modules from one walk, the same generator
decision, the same gradients bitwise through a region with one output or
several, and the same kept and served calls while the policy is asked only
about the overloads it lists. Timing is ``benchmarks/overhead.py``'s, not a test's.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import _infer_device_type

import scheduler
from scheduler.applying.fast import region_state, split_args
from scheduler.applying.rng import RngWatch, drawing_modules
from scheduler.applying.regions import _running_stats
from scheduler.applying.selective import RegionPolicy, tally
from solvers import Plan


def _by_pytree(args: tuple, kwargs: dict) -> list:
    leaves, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
    return [v for v in leaves if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("case", ["tensors", "scalars", "keywords", "container"])
def test_split_args_gives_the_tensors_pytree_gives_and_fresh_containers(case):
    x, y, w = torch.randn(2), torch.randn(3), nn.Parameter(torch.randn(1))
    args, kwargs = {
        "tensors": ((x, w), {}),
        "scalars": ((x, 2, None, 0.5, "mean", True), {}),
        "keywords": ((x, 3), {"mask": y, "scale": 1.5, "bias": None, "w": w}),
        "container": (([x, y], (w, 4)), {"extra": {"m": y}}),
    }[case]
    tensors, rebuild = split_args(args, kwargs)
    assert [id(t) for t in tensors] == [id(t) for t in _by_pytree(args, kwargs)]
    first, second = rebuild(tuple(tensors)), rebuild(tuple(tensors))
    assert pytree.tree_structure(first) == pytree.tree_structure((tuple(args), dict(kwargs)))
    assert all(a is b for a, b in zip(pytree.tree_leaves(first), pytree.tree_leaves((tuple(args), dict(kwargs)))))
    if case == "container":  # each rebuild its own lists (NOTE [ Containers passed to a region ])
        assert first[0][0] is not second[0][0] and first[0][0] is not args[0]
    assert first[1] is not second[1]


class DropPath(nn.Module):  # a stochastic-depth name, found by its class name
    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob


def _zoo() -> nn.Module:
    shared = nn.BatchNorm1d(4)
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.1), nn.Dropout(0.0), DropPath(0.2),
                      DropPath(0.0), nn.RReLU(), nn.Sequential(shared, nn.Dropout(0.3), shared),
                      nn.BatchNorm1d(4, track_running_stats=False))
    m[7][1].eval()
    m.add_module("nothing", None)
    return m


@pytest.mark.parametrize("roots", ["one", "children"])
def test_one_walk_finds_what_the_two_walks_found(roots):
    m = _zoo()
    modules = [m] if roots == "one" else list(m.children())
    for training in (True, False):  # a mode switched between two calls is seen at the next one
        m.train(training)
        m[7][1].eval()
        stats, drawn = region_state(modules, drawing=True)
        assert [id(b) for b in stats] == [id(b) for b in _running_stats(modules)]
        assert [id(d) for d in drawn] == [id(d) for d in drawing_modules(modules)]
        assert (len(stats), len(drawn)) == ((6, 3) if training else (0, 0))
        assert region_state(modules, drawing=False) == (stats, [])


def test_the_watch_reads_cpu_inputs_as_checkpoint_does_and_sees_a_draw_under_a_mode():
    x = torch.randn(3, requires_grad=True)
    for args in [(x,), (), (x, x.detach())]:
        watch = RngWatch(args)
        assert (watch.device_type, watch.devices, watch.states) == (_infer_device_type(*args), [], [])
        assert not watch.drew()

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for mode in (None, Passing()):
        watch = RngWatch((x,))
        if mode is None:
            torch.rand(1)
            assert watch.drew()
        else:
            with mode:
                assert not watch.drew()
                torch.rand(1)
                assert watch.drew()


class _Block(nn.Module):
    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.a, self.b, self.outputs = nn.Linear(8, 8), nn.Linear(8, 8), outputs

    def forward(self, x, scale=1.0, *, mask=None):
        h = torch.relu(self.a(x)) * scale
        if mask is not None:
            h = h * mask
        y = self.b(h) + x
        return (y, h.sum(-1)) if self.outputs == 2 else y


class _Model(nn.Module):
    def __init__(self, outputs: int) -> None:
        super().__init__()
        self.block, self.outputs = _Block(outputs), outputs

    def forward(self, x, mask):
        out = self.block(x, 0.5, mask=mask)
        return (out[0].sum() + out[1].sum()) if self.outputs == 2 else out.sum()


@pytest.mark.parametrize("outputs", [1, 2])
@pytest.mark.parametrize("kept", [False, True])
def test_a_region_on_the_short_ways_has_the_unplanned_gradients_bitwise(outputs, kept):
    torch.manual_seed(0)
    plain = _Model(outputs)
    planned = copy.deepcopy(plain)
    ops = (("aten.addmm.default", 0),) if kept else ()  # the second is never reached by the recompute
    scheduler.apply(planned, Plan(regions=((0, 0),), modules=("block",), stochastic=(False,),
                                  save_ops=(ops,) if kept else (),
                                  save_op_calls=((("aten.addmm.default", 2),),) if kept else ()), check=False)
    x = torch.randn(4, 8, requires_grad=True)
    mask = torch.rand(4, 8, requires_grad=True)
    grads = []
    for model in (plain, planned):
        x.grad = mask.grad = None
        with tally() as seen:
            model(x, mask).backward()
        grads.append([x.grad, mask.grad] + [p.grad for p in model.parameters()])
        if model is planned and kept:
            assert (seen.kept_calls, seen.served_calls) == (1, 1)
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert planned.block.forward.recomputes == 1


def test_the_policy_is_asked_about_listed_overloads_only():
    """NOTE [ Calls no policy keeps ]: the eager modes ask the policy about the overloads it lists; the others
    run uncounted, and a tally still counts every call."""
    torch.manual_seed(0)
    model = _Model(1)
    scheduler.apply(model, Plan(regions=((0, 0),), modules=("block",), stochastic=(False,),
                                save_ops=((("aten.addmm.default", 0),),),
                                save_op_calls=((("aten.addmm.default", 2),),)), check=False)
    policy: RegionPolicy = model.block.forward.policy
    asked: list[str] = []
    ask = policy.__call__
    policy.__class__ = type("Asked", (RegionPolicy,), {"__call__": lambda self, ctx, func, *a, **k: (
        asked.append(str(func)), ask(ctx, func, *a, **k))[1]})
    x, mask = torch.randn(4, 8, requires_grad=True), torch.rand(4, 8)
    with tally() as seen:
        model(x, mask).backward()
    assert asked == ["aten.addmm.default"] * 2
    assert dict(policy.counts) == {"aten.addmm.default": 2} and not policy.off
    assert seen.forward_calls > 2 and (seen.kept_calls, seen.served_calls) == (1, 1)
