"""Getting an fx graph out of a module: ``torch.fx`` first, ``torch.export`` next.

The graph module returned here is normalised so that the cost graph built on it
can name contiguous runs of its nodes (see NOTE [ Traced contract ] in
``scheduler.tracing``):

* placeholders come first, the output node last;
* every ``get_attr`` node sits right before its first user;
* ``torch.export``'s guard-checking call (``_guards_fn``) is removed;
* parameters and buffers are the user's own tensor objects.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any, Callable, Mapping

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn

from graphs import CkptError

__all__ = ["TraceError", "TraceMismatch", "LossWrapper", "capture_graph_module", "check_against_eager"]

log = logging.getLogger(__name__)


class TraceError(CkptError, RuntimeError):
    """Neither tracer could turn the model into a graph; the message says why and what to try."""


class TraceMismatch(TraceError):
    """The traced graph does not compute what the model computes (shown in the message)."""


class LossWrapper(nn.Module):
    """``loss(model(*args, **kwargs))`` as one module, so the loss is part of the graph.

    The model is registered as the child ``model``; module paths in the cost
    graph have that prefix removed.
    """

    def __init__(self, model: nn.Module, loss: Callable[[Any], torch.Tensor]):
        super().__init__()
        self.model = model
        self.loss_fn = loss

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.loss_fn(self.model(*args, **kwargs))


def capture_graph_module(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], *, method: str = "auto"
                         ) -> tuple[torch.fx.GraphModule, str]:
    """Trace ``module`` into a normalised GraphModule sharing its parameters.

    Args:
        module: the module to trace (the user's model or a :class:`LossWrapper`).
        args, kwargs: example inputs.
        method: ``"fx"`` (``torch.fx.symbolic_trace``), ``"export"``
            (``torch.export.export``, training IR) or ``"auto"`` (fx, then export).

    Returns:
        ``(gm, method_used)``.

    Raises:
        TraceError: both tracers failed; names the failing module/op.
    """
    errors: list[tuple[str, BaseException]] = []
    if method in ("auto", "fx"):
        try:
            gm = _fx_trace(module, args, kwargs)
            opaque = opaque_torch_modules(gm)
            if opaque and method == "auto":
                log.info("torch.fx keeps %s whole (torch's own modules are fx leaves); tracing with torch.export "
                         "to see inside", ", ".join(opaque))
                try:
                    return _normalise(_export(module, args, kwargs), module), "export"
                except Exception as exc:  # noqa: BLE001
                    log.warning("torch.export failed (%s: %s); the fx graph keeps %s as single nodes, so no plan "
                                "can checkpoint inside them", type(exc).__name__, str(exc)[:200], ", ".join(opaque))
            elif opaque:
                log.warning("torch.fx keeps %s as single nodes (torch's own modules are fx leaves): no plan can "
                            "checkpoint inside them; --method export (method='export') traces through them",
                            ", ".join(opaque))
            return _normalise(gm, module), "fx"
        except Exception as exc:  # noqa: BLE001  (fx raises many kinds; we fall back)
            if method == "fx":
                raise TraceError(_explain("torch.fx.symbolic_trace", exc, module)) from exc
            log.info("torch.fx.symbolic_trace failed (%s: %s); trying torch.export", type(exc).__name__, exc)
            errors.append(("torch.fx.symbolic_trace", exc))
    if method in ("auto", "export"):
        try:
            return _normalise(_export(module, args, kwargs), module), "export"
        except Exception as exc:  # noqa: BLE001
            errors.append(("torch.export.export", exc))
    if not errors:
        raise TraceError(f"unknown tracing method {method!r}; use 'auto', 'fx' or 'export'")
    bad_inputs = _eager_failure(module, args, kwargs)
    if bad_inputs is not None:  # not the tracers' fault: the model itself does not run on these inputs
        raise bad_inputs from errors[-1][1]
    msgs = "; ".join(_explain(who, exc, module) for who, exc in errors)
    raise TraceError(
        f"could not trace {type(module).__name__}: {msgs}. What to try: make the failing code traceable "
        "(no data-dependent Python control flow, no .item()/.tolist() on tensors, no printing of tensors), "
        "or pass inputs for which it takes one branch; torch.export is usually the more tolerant tracer"
        + _data_dependent_hint(errors, kwargs)
    ) from errors[-1][1]


def _data_dependent_hint(errors: list[tuple[str, BaseException]], kwargs: Mapping[str, Any]) -> str:
    """What usually branches on a value in a library's model, where export says a guard was data-dependent."""
    if not any("data-dependent" in str(exc) or "DataDependent" in type(exc).__name__ for _, exc in errors):
        return ""
    hint = (". The line named branches on a tensor's value: a random skip of layers in training (transformers' "
            "LayerDrop: set config.layerdrop=0.0 to trace, each step would run other layers anyway)")
    if "labels" in kwargs:
        hint += (", or a loss the model computes from labels= that selects the labelled rows (nonzero(), "
                 "masked_select: DeBERTa, Wav2Vec2's CTC): trace without labels= and pass loss=, computing the "
                 "same loss from the outputs (loss=lambda out: F.cross_entropy(out.logits, labels))")
    return hint


#: torch's own modules that torch.fx's default tracer keeps as one leaf node but that hold a whole
#: network (NOTE [ Opaque torch modules ]).
OPAQUE_TORCH_MODULES = (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder, nn.TransformerEncoderLayer,
                        nn.TransformerDecoderLayer, nn.MultiheadAttention)


def opaque_torch_modules(gm: torch.fx.GraphModule) -> list[str]:
    """Paths of the :data:`OPAQUE_TORCH_MODULES` that ``gm`` calls as single nodes.

    NOTE [ Opaque torch modules ]
        ``torch.fx``'s tracer does not trace into modules of ``torch.nn``: a
        model built on ``nn.TransformerEncoder`` became 3 nodes (embedding,
        encoder, head), every solver said "infeasible" and nothing said why.
        Tracing through them with fx is no way out (their forward branches
        on tensor properties, which fx cannot follow), but ``torch.export``
        traces them to their ops. So with ``method="auto"`` a graph that
        calls one of them is traced again with ``torch.export``; with
        ``method="fx"`` a warning names them and the way out.
        ``tests/scheduler/tracing/test_trace.py::test_transformer_encoder_is_traced_through``.
    """
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            if isinstance(sub, OPAQUE_TORCH_MODULES):
                out.append(f"{node.target} ({type(sub).__name__})")
    return out


def _fx_trace(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> torch.fx.GraphModule:
    """symbolic_trace with every argument not given as a concrete default."""
    sig = inspect.signature(module.forward)
    bound = sig.bind(*args, **kwargs)
    concrete = {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"forward takes *{name}; torch.fx needs named arguments")
        if name not in bound.arguments:
            concrete[name] = p.default
    return torch.fx.symbolic_trace(module, concrete_args=concrete or None)


def _export(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> torch.fx.GraphModule:
    """``torch.export.export`` (training IR), custom autograd functions kept whole when it can.

    NOTE [ Custom autograd functions ]
        ``torch.export`` inlines the forward of a ``torch.autograd.Function``:
        its ops then run under autograd in the graph module and save what
        their derivatives need, where the model saved only what the
        function's ``ctx.save_for_backward`` chose (BLOOM's GeLU saves its
        input; inlined, its eight elementwise ops save seven tensors more).
        The graph module would need more memory than the model, and the cost
        graph, exact for the graph module, would be above the model's real
        step. So while exporting, ``Function.apply`` of every class importable
        by its qualified name is wrapped with torch's
        ``allow_in_pre_dispatch_graph``: the call stays one ``flat_apply``
        node that runs the user's function, forward and backward. A class
        that cannot be imported by name (defined in a function) is inlined as
        before; so is everything when the wrapped export fails. torch 2.14
        defines ``apply`` in C (a descriptor without ``__func__``): the call
        is bound through the descriptor (``tests/regressions/test_torch_2_14_apply.py``).
    """
    from .eager_branches import eager_mask_decisions

    def run() -> torch.fx.GraphModule:
        # FakeTensor logs a traceback of every failing meta kernel; the TraceError raised from it says what it says
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        disabled, fake_log.disabled = fake_log.disabled, True
        try:
            with eager_mask_decisions(module, tuple(args), kwargs):  # NOTE [ Eager's attention masks under export ]
                ep = torch.export.export(module, tuple(args), dict(kwargs), strict=False)
        finally:
            fake_log.disabled = disabled
        return ep.module(check_guards=False)

    try:
        from torch._export.wrappers import allow_in_pre_dispatch_graph
    except ImportError:  # an older or newer torch without it: inline
        return run()
    function = torch.autograd.Function
    original = function.__dict__["apply"]
    plain = getattr(original, "__func__", None)
    if plain is None:  # torch 2.14 defines apply in C: a classmethod_descriptor, bound by __get__, no __func__

        def apply(cls: type, *a: Any, **k: Any) -> Any:  # named so: torch's wrapper accepts only `apply`
            return original.__get__(None, cls)(*a, **k)

        plain = apply
    try:
        kept = allow_in_pre_dispatch_graph(plain)
    except Exception as exc:  # noqa: BLE001  (a torch whose wrapper refuses it: inline)
        log.info("custom autograd functions cannot be kept whole with this torch (%s: %s); inlining them",
                 type(exc).__name__, exc)
        return run()

    def apply(cls: type, *a: Any, **k: Any) -> Any:
        return (kept if _importable(cls) else plain)(cls, *a, **k)

    function.apply = classmethod(apply)  # type: ignore[assignment]
    try:
        gm = run()
    except Exception as exc:  # noqa: BLE001
        log.info("export with custom autograd functions kept whole failed (%s: %s); inlining them",
                 type(exc).__name__, exc)
        gm = None
    finally:
        function.apply = original  # type: ignore[assignment]
    return gm if gm is not None else run()


def _importable(cls: type) -> bool:
    """``cls`` is a top-level name of an importable module (how the ``flat_apply`` node finds it)."""
    if "." in cls.__qualname__ or "<" in cls.__qualname__:
        return False
    try:
        return getattr(importlib.import_module(cls.__module__), cls.__qualname__, None) is cls
    except Exception:  # noqa: BLE001
        return False


def _run_eager(module: nn.Module, fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` without grad, seeded, with ``module``'s buffers (BatchNorm statistics) restored."""
    state = list(module.buffers())
    saved = [b.detach().clone() for b in state]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            return fn(*args, **kwargs)
    finally:
        with torch.no_grad():
            for b, s in zip(state, saved):
                b.copy_(s)


def _inputs_error(module: nn.Module, args: tuple, kwargs: Mapping[str, Any], exc: BaseException) -> TraceError:
    """The error for a model that fails on its own example inputs (wrong shapes, a missing argument...)."""
    shapes = ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" if isinstance(t, torch.Tensor)
                       else type(t).__name__ for t in pytree.tree_leaves((tuple(args), dict(kwargs))))
    return TraceError(f"the model does not run on its example inputs ({shapes or 'none'}): "
                      f"{_explain('its forward', exc, module)}; give inputs the model takes (a factory returns "
                      "(model, args, kwargs) or (model, args, kwargs, loss))")


def _eager_failure(module: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> TraceError | None:
    """After both tracers failed: the error of an eager forward on the same inputs, or None if it runs."""
    try:
        _run_eager(module, module, args, kwargs)
    except Exception as exc:  # noqa: BLE001
        return _inputs_error(module, args, kwargs, exc)
    return None


def _explain(who: str, exc: BaseException, module: nn.Module) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    where = ""
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for fr in reversed(frames):
        obj = fr.f_locals.get("self")
        if isinstance(obj, nn.Module):
            path = next((n for n, m in module.named_modules() if m is obj), None)
            if path is not None:
                where = f" in module {path or '<root>'} ({type(obj).__name__}, {fr.f_code.co_filename}:{fr.f_lineno})"
                break
    return f"{who} failed{where}: {type(exc).__name__}: {first[:300]}"


def _normalise(gm: torch.fx.GraphModule, module: nn.Module) -> torch.fx.GraphModule:
    graph = gm.graph
    for node in list(graph.nodes):
        if (node.op == "call_module" and node.target == "_guards_fn") or (
                node.op == "call_function" and node.target in _ASSERTS and not node.users):
            graph.erase_node(node)
    for node in reversed(list(graph.nodes)):  # comparisons left behind by the asserts of concrete_args
        if node.op == "call_function" and not node.users and getattr(node.target, "__module__", "") == "_operator":
            graph.erase_node(node)
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    first_other = next((n for n in nodes if n.op != "placeholder"), None)
    if first_other is not None:  # placeholders first, in their order
        for ph in placeholders:
            first_other.prepend(ph)
    pos = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):  # get_attr right before its first user
        if node.op == "get_attr" and node.users:
            first_user = min(node.users, key=pos.__getitem__)
            first_user.prepend(node)
    graph.lint()
    gm.recompile()
    _rebind_state(gm, module)
    return gm


_ASSERTS = (torch._assert, torch.fx._symbolic_trace._assert_is_none)


def _rebind_state(gm: torch.fx.GraphModule, module: nn.Module) -> None:
    """Make gm's parameters and buffers the very tensor objects of ``module``."""
    for name, p in module.named_parameters(remove_duplicate=False):
        _set_if_present(gm, name, p, is_param=True)
    for name, b in module.named_buffers(remove_duplicate=False):
        _set_if_present(gm, name, b, is_param=False)


def _set_if_present(gm: nn.Module, name: str, value: torch.Tensor, *, is_param: bool) -> None:
    *path, leaf = name.split(".")
    owner: Any = gm
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return
    if not isinstance(owner, nn.Module):
        return
    current = getattr(owner, leaf, None)
    if current is None or current is value:
        return
    if is_param and leaf in owner._parameters:
        owner._parameters[leaf] = value
    elif leaf in owner._buffers:
        owner._buffers[leaf] = value
    elif isinstance(current, torch.Tensor):
        setattr(owner, leaf, value)


# --------------------------------------------------------------- eager check
def check_against_eager(module: nn.Module, gm: torch.fx.GraphModule, args: tuple, kwargs: Mapping[str, Any],
                        *, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Run ``module`` and ``gm`` on the same inputs with the same RNG; compare.

    Buffers changed by the forward (BatchNorm running stats) are restored after
    each run. On the meta device there are no values and eager code may call
    ``.item()``: the check is skipped (the tracers propagate shapes).

    Raises:
        TraceMismatch: outputs differ; the message shows where and by how much.
    """
    tensors = list(module.parameters()) + pytree.tree_leaves((tuple(args), dict(kwargs)))
    if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors):
        # No values to compare, and eager model code may call .item() (fails on meta):
        # the tracer's own shape propagation is the check.
        log.info("meta tensors: the eager check is skipped (no values); shapes come from the tracer")
        return
    try:
        expected = _run_eager(module, module, args, kwargs)
    except Exception as exc:  # noqa: BLE001  (the model's own code on the user's inputs)
        raise _inputs_error(module, args, kwargs, exc) from exc
    got = _run_eager(module, gm, args, kwargs)
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if len(exp_leaves) != len(got_leaves):
        raise TraceMismatch(
            f"the traced graph returns {len(got_leaves)} values where the model returns {len(exp_leaves)} "
            f"(model: {exp_spec}, graph: {got_spec}); the tracer dropped or added an output"
        )
    for k, (e, g) in enumerate(zip(exp_leaves, got_leaves)):
        if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor):
            raise TraceMismatch(f"output {k}: the model returns {type(e).__name__}, the graph {type(g).__name__}")
        if not isinstance(e, torch.Tensor):
            continue
        if e.shape != g.shape or e.dtype != g.dtype:
            raise TraceMismatch(
                f"output {k}: the model gives {tuple(e.shape)} {e.dtype}, the traced graph {tuple(g.shape)} {g.dtype}"
            )
        if e.device.type == "meta":
            continue
        if not torch.allclose(e.float(), g.float(), rtol=rtol, atol=atol, equal_nan=True):
            diff = (e.float() - g.float()).abs()
            raise TraceMismatch(
                f"output {k}: the traced graph differs from the eager model (max abs difference "
                f"{diff.max().item():.3g} at index {tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])}); "
                "the tracer probably specialised a branch or a value that changes at run time. "
                "Try method='export', or make the model's control flow independent of tensor values"
            )
