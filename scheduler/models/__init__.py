"""Example models: ``build(name, **options) -> Example``.

Built-in (written here, no torchvision): ``gpt``, ``resnet``, ``unet``,
``vgg19``. ``hf:NAME``: a transformers model from a config table in
:mod:`scheduler.models.hf_configs` (random weights, offline). ``package.module:factory``:
any function returning ``(model, args, kwargs)`` or ``(model, args, kwargs, loss)``.

Every built-in returns a scalar loss, so its graph covers the training step:
``loss = example.model(*example.args, **example.kwargs)`` (or
``example.loss(...)`` of that output when ``loss`` is set).

Example:
    >>> from scheduler.models import build
    >>> ex = build("gpt", layers=2, width=128, heads=4, seq=64)
    >>> graph = scheduler.trace(ex.model, ex.args, ex.kwargs, loss=ex.loss)

May import ``graphs`` and torch (transformers when ``hf:NAME`` is built); nothing else of ``scheduler``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from graphs import CkptError

__all__ = ["Example", "ModelInfo", "MODELS", "build", "describe", "UnknownModel", "parse_dtype"]


class UnknownModel(CkptError, KeyError):
    """The model name is not built in, not ``hf:NAME`` of the table, nor an importable factory."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


@dataclass(frozen=True)
class Example:
    """A model with example inputs.

    Attributes:
        name: what was asked for (``gpt``, ``hf:gpt2``...).
        model: the module, in training mode.
        args, kwargs: example inputs.
        loss: ``loss(model_output) -> scalar`` when the model does not return
            its loss itself, else None.
        options: the options used (after defaults).
    """

    name: str
    model: torch.nn.Module
    args: tuple
    kwargs: Mapping[str, Any]
    loss: Callable[[Any], torch.Tensor] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __iter__(self):  # (model, args, kwargs) unpacking
        return iter((self.model, self.args, dict(self.kwargs)))

    def step_loss(self) -> torch.Tensor:
        """Run the forward and return the scalar loss."""
        out = self.model(*self.args, **self.kwargs)
        return self.loss(out) if self.loss is not None else out


@dataclass(frozen=True)
class ModelInfo:
    name: str
    description: str
    factory: Callable[..., Any]


def _builtins() -> dict[str, ModelInfo]:
    from . import cnn, gpt, unet

    return {
        "gpt": ModelInfo("gpt", "GPT-2-small-shaped transformer with dropout (defaults: GPT-2 small, seq 1024)", gpt.build),
        "resnet": ModelInfo("resnet", "bottleneck ResNet with BatchNorm (depth=50, width=64 is ResNet-50)", cnn.build_resnet),
        "unet": ModelInfo("unet", "U-Net with long skip connections", unet.build),
        "vgg19": ModelInfo("vgg19", "VGG-19, a pure chain (Checkmate's benchmark model)", cnn.build_vgg19),
    }


MODELS: dict[str, ModelInfo] = {}


def _registry() -> dict[str, ModelInfo]:
    if not MODELS:
        MODELS.update(_builtins())
    return MODELS


def options_of(factory: Callable[..., Any]) -> dict[str, Any]:
    """Keyword options of a factory and their defaults."""
    out = {}
    for p in inspect.signature(factory).parameters.values():
        if p.kind == p.KEYWORD_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and p.default is not p.empty):
            out[p.name] = None if p.default is p.empty else p.default
    return out


def parse_dtype(value: Any) -> torch.dtype:
    """``"float32"``, ``"bf16"``, ``torch.float16``... -> a torch dtype."""
    if isinstance(value, torch.dtype):
        return value
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "half": "float16", "float": "float32"}
    name = aliases.get(str(value), str(value)).replace("torch.", "")
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point or dt.itemsize < 2:
        what = "unknown dtype" if not isinstance(dt, torch.dtype) else "a model is trained in a floating dtype, not"
        raise CkptError(f"{what} {value!r}; use float32, float16 or bfloat16 (fp32, fp16, bf16)")
    return dt


def check_device(value: Any) -> str:
    """``value`` as a device string a model can be built on here (``cpu``, ``meta``, ``cuda[:n]`` when present).

    Raises:
        CkptError: an unknown device, or one this machine does not have.
    """
    try:
        dev = torch.device(str(value))
    except (RuntimeError, ValueError, TypeError):
        raise CkptError(f"unknown device {value!r}; use cpu, meta (nothing allocated), or cuda") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise CkptError(f"device {value!r}: this machine has no CUDA device (or torch is a CPU build); use cpu, "
                            "or meta to plan without allocating")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CkptError(f"device {value!r}: there are {torch.cuda.device_count()} CUDA devices")
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise CkptError(f"device {value!r}: MPS is not available here; use cpu or meta")
    elif dev.type not in ("cpu", "meta", "cuda", "mps"):
        raise CkptError(f"device {value!r} is not supported; use cpu, meta or cuda")
    return str(value)


def factory_of(name: str) -> Callable[..., Any]:
    """The factory ``build(name)`` calls: a built-in's, or ``package.module:factory`` imported.

    Raises:
        UnknownModel: not a built-in name nor an importable ``package.module:factory``.
    """
    reg = _registry()
    if name in reg:
        return reg[name].factory
    if ":" not in name or name.startswith("hf:"):
        raise UnknownModel(f"unknown model {name!r}; built-in: {', '.join(reg)}; or hf:NAME "
                           "(see `ckpt models`), or package.module:factory")
    mod_name, _, attr = name.partition(":")
    if not mod_name or not attr or not all(p.isidentifier() for p in (*mod_name.split("."), attr)):
        raise UnknownModel(f"model {name!r}: write package.module:factory (e.g. mymodel:build), with a module "
                           "and a function name")
    # Like `python -m` (and uvicorn's "module:app"), a module in the current
    # directory is found: `ckpt trace mymodel:build` next to mymodel.py.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise UnknownModel(f"cannot import the factory {name!r}: {exc} (modules are searched in the current "
                           "directory and on PYTHONPATH)") from exc
    except Exception as exc:  # noqa: BLE001  (the user's module failed while importing: say where, in one line)
        raise UnknownModel(f"cannot import the factory {name!r}: importing {mod_name} raised "
                           f"{user_error(exc)}; fix the module and run again") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise UnknownModel(f"cannot import the factory {name!r}: module {mod_name} ({getattr(module, '__file__', '')}) "
                           f"has no attribute {attr!r}")
    if not callable(factory):
        raise UnknownModel(f"model {name!r}: {mod_name}.{attr} is a {type(factory).__name__}, not a function; name a "
                           "function that returns (model, args, kwargs) or (model, args, kwargs, loss)")
    return factory


def user_error(exc: BaseException) -> str:
    """``Type: first line (file:line)`` of an exception raised in the user's code, for a one-line error."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}{': ' + first if first else ''}{where}"


def build(name: str, **options: Any) -> Example:
    """Build the example model ``name`` with ``options`` (None values are ignored).

    Raises:
        UnknownModel: the name is not known; the message lists what is.
        CkptError: an option the model does not take (the message lists those it does).
    """
    options = {k: v for k, v in options.items() if v is not None}
    if "dtype" in options:
        options["dtype"] = parse_dtype(options["dtype"])
    if "device" in options:
        options["device"] = check_device(options["device"])
    if name.startswith("hf:"):
        from . import hf_configs

        key = name[3:]
        if key not in hf_configs.HF_CONFIGS:
            known = ", ".join("hf:" + k for k in hf_configs.HF_CONFIGS)
            raise UnknownModel(f"no transformers config named {key!r}; known: {known}")
        check_options(name, hf_configs.build, options)
        model, args, kwargs, loss = hf_configs.build(key, **options)
        return Example(name, model, tuple(args), dict(kwargs), loss, options)
    factory = factory_of(name)
    check_options(name, factory, options)
    try:
        out = factory(**options)
    except (TypeError, ValueError, AssertionError, RuntimeError) as exc:
        # Options the factory accepts by name but not by value: the user's input, not a bug of ours.
        shown = ", ".join(f"{k}={getattr(v, '__name__', v)}" for k, v in options.items()) or "its defaults"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CkptError(f"model {name} cannot be built with {shown}: {type(exc).__name__}: {first}") from exc
    if isinstance(out, Example):
        return out
    if not isinstance(out, tuple) or len(out) not in (3, 4):
        raise CkptError(f"{name} returned {type(out).__name__}; a factory returns (model, args, kwargs) "
                        "or (model, args, kwargs, loss)")
    model, args, kwargs = out[:3]
    loss = out[3] if len(out) == 4 else None
    for what, value, ok, want in (
            ("model", model, isinstance(model, torch.nn.Module), "an nn.Module"),
            ("args", args, isinstance(args, (tuple, list)), "a tuple of positional inputs, e.g. (x,)"),
            ("kwargs", kwargs, kwargs is None or isinstance(kwargs, Mapping), "a dict of keyword inputs, or {}"),
            ("loss", loss, loss is None or callable(loss), "a function of the model's output, or None")):
        if not ok:
            raise CkptError(f"{name} returned {what} as {type(value).__name__}; a factory returns (model, args, "
                            f"kwargs) or (model, args, kwargs, loss), with {what} {want}")
    return Example(name, model, tuple(args), dict(kwargs or {}), loss, options)


def check_options(name: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Refuse an option ``factory`` does not take, or a value of the wrong kind (as its default says)."""
    sig = inspect.signature(factory)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    known = options_of(factory)
    bad = sorted(set(options) - set(known))
    if bad:
        raise CkptError(f"model {name} does not take option(s) {bad}; it takes: {', '.join(sorted(known))}")
    for key, value in options.items():
        default = known.get(key)
        if isinstance(default, bool) or default is None or isinstance(value, torch.dtype):
            continue
        if isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int)):
            raise CkptError(f"model {name}: option {key} takes an integer (default {default}), got {value!r}")
        if isinstance(default, int) and value <= 0 and key != "seed":
            raise CkptError(f"model {name}: option {key} must be a positive integer, got {value}")
        if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise CkptError(f"model {name}: option {key} takes a number (default {default}), got {value!r}")


def describe() -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, description, options with defaults)`` for every known model."""
    from . import hf_configs

    hf_opts = options_of(hf_configs.build)
    return ([(m.name, m.description, options_of(m.factory)) for m in _registry().values()]
            + [(name, desc, hf_opts) for name, desc in hf_configs.describe()])
