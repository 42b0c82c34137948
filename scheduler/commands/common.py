"""Argument types and checks every command shares (NOTE [ How the CLI fails ] in ``scheduler.cli``).

Each type raises ``argparse.ArgumentTypeError``, which the parser turns into
one line naming the flag; checks that need more than one flag raise
:class:`graphs.CkptError`. Output paths are checked before any work
(NOTE [ Output files ] in ``graphs.files``).
"""

from __future__ import annotations

import argparse
import ast
import math
from typing import Any, Callable, Iterable, Mapping

from graphs import CkptError, check_output_path
from solvers import solver_info
from solvers.options import describe

__all__ = ["positive_int", "positive_float", "nonneg_float", "gap_fraction", "granularity", "parse_options",
           "check_outputs", "model_files", "optimizer_name", "add_step_flags", "MODEL_FLAGS", "add_model_flags",
           "add_model_arguments", "model_options", "split_items", "SOLVER_FLAGS", "solve_flag_options", "solver_flag_options",
           "solver_options_help",
           "add_target_flag", "add_loop_flag"]


def _number(kind: Callable[[str], Any], text: str, what: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _checked(kind: Callable[[str], Any], what: str, ok: Callable[[Any], bool], why: str, doc: str,
             name: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``text`` read by ``kind`` and held to ``ok``, else ``why`` (``{v}``: the value)."""

    def parse(text: str) -> Any:
        value = _number(kind, text, what)
        if not ok(value):
            raise argparse.ArgumentTypeError(why.format(v=value))
        return value

    parse.__name__ = parse.__qualname__ = name
    parse.__doc__ = doc
    return parse


positive_int = _checked(int, "an integer", lambda v: v >= 1, "{v} is not a positive integer (at least 1)",
                        "An integer >= 1.", "positive_int")
positive_float = _checked(float, "a number", lambda v: v > 0, "{v:g} must be greater than 0",
                          "A finite number > 0 (seconds).", "positive_float")
nonneg_float = _checked(float, "a number", lambda v: v >= 0, "{v:g} must be 0 or more",
                        "A finite number >= 0 (a tolerance).", "nonneg_float")
gap_fraction = _checked(float, "a number", lambda v: 0 <= v < 1,
                        "{v:g} is not a relative gap in [0, 1), e.g. 0.01 for 1 %", "A relative gap in [0, 1).",
                        "gap_fraction")


def granularity(text: str) -> Any:
    """``op``, ``fold``, ``auto`` or a module depth >= 0."""
    if text in ("op", "fold", "auto"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not op, fold, auto or a module depth (0, 1, 2...)")


def parse_options(items: Iterable[str], flag: str = "--option") -> dict[str, Any]:
    """``KEY=VALUE`` strings as a dict; values read as Python literals (``8``, ``0.1``, ``True``), else strings.

    Raises:
        CkptError: an item without ``=`` or with an empty key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise CkptError(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} width=256")
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            out[key.strip()] = value
    return out


#: CLI flag -> model option, the same for every command that builds a model (validated: counts positive here,
#: dtype and device by ``scheduler.models``, or for ``ckpt fit`` by ``scheduler.sizing.memory``).
MODEL_FLAGS: dict[str, Callable[[str], Any]] = {
    "batch": positive_int, "seq": positive_int, "image_size": positive_int, "dtype": str, "layers": positive_int,
    "width": positive_int, "heads": positive_int, "depth": positive_int, "device": str}


def add_model_flags(p: argparse.ArgumentParser, names: Iterable[str] | None = None,
                    helps: dict[str, str] | None = None) -> None:
    """The model option flags ``names`` (default all of :data:`MODEL_FLAGS`), unset (None) by default."""
    for flag in MODEL_FLAGS if names is None else names:
        p.add_argument(f"--{flag.replace('_', '-')}", type=MODEL_FLAGS[flag], default=None,
                       help=(helps or {}).get(flag, f"model option {flag}"))


def add_loop_flag(p: argparse.ArgumentParser, default: str | None = "held", what: str = "plan for") -> None:
    """``--loop held|dropped``: the training loop a command traces or measures (NOTE [ The user's loop ])."""
    from graphs import LOOPS

    p.add_argument("--loop", choices=LOOPS, default=default,
                   help=f"the training loop to {what}: 'held' keeps the model's output through backward() "
                        "(out = model(**batch); out.loss.backward()), 'dropped' drops it first (Trainer; "
                        "loss = model(**batch).loss)" + (f"; default {default}" if default else ""))


def add_model_arguments(p: argparse.ArgumentParser, *, positional: bool = True, model_help: str | None = None,
                        helps: dict[str, str] | None = None) -> None:
    """The MODEL argument (unless the command names it otherwise), every model flag and ``-O KEY=VALUE``
    (``helps``: a command's own help for some flags)."""
    if positional:
        p.add_argument("model", help=model_help or "built-in name, hf:NAME, or package.module:factory (see `ckpt models`)")
    add_model_flags(p, helps=helps)
    p.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other model option (repeatable), e.g. --option vocab=1000")


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The model options the user set: the flags of :data:`MODEL_FLAGS`, then ``-O KEY=VALUE`` over them."""
    opts: dict[str, Any] = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k, None) is not None}
    opts.update(parse_options(args.option))
    return opts


def optimizer_name(text: str) -> str:
    """An optimizer named in ``scheduler.sizing.budget.OPTIMIZER_STATES`` (any case)."""
    from ..sizing.budget import OPTIMIZER_STATES

    if text.lower() not in OPTIMIZER_STATES:
        raise argparse.ArgumentTypeError(f"unknown optimizer {text!r}; choose one of {', '.join(sorted(OPTIMIZER_STATES))}")
    return text.lower()


def add_step_flags(p: argparse.ArgumentParser, *, optimizer: str | None, reserve: str, budget: str) -> None:
    """The persistent state of the step that a byte budget or card also holds (``solve`` and ``fit`` alike;
    ``scheduler.sizing.memory``): ``--optimizer``, ``--mixed-precision``, ``--reserve``."""
    from ..sizing.budget import OPTIMIZER_STATES

    p.add_argument("--optimizer", type=optimizer_name, default=optimizer, metavar="NAME",
                   help=f"the optimizer whose state the step keeps beside it, subtracted from the {budget}: "
                        f"{', '.join(sorted(OPTIMIZER_STATES))} (adam: two states per parameter; default "
                        f"{optimizer or 'none'})")
    p.add_argument("--mixed-precision", action="store_true",
                   help="low-precision weights with an fp32 master copy and fp32 optimizer state (ZeRO's 16 "
                        f"bytes/param with Adam), subtracted from the {budget}")
    p.add_argument("--reserve", default=None,
                   help=f"held back from the {budget} for the CUDA context and allocator fragmentation: a share "
                        f"(5%%, 0.1) or a size (2GiB); default {reserve}")


def model_files(spec: str) -> list[str]:
    """The files MODEL ``spec`` reads, which no output may replace: a factory's module source
    (``package.module:factory``; found without running it) or a config path (``fit``'s ``config.json``)."""
    import importlib.util
    import os
    import sys

    if os.path.exists(spec):
        return [spec]
    mod_name, sep, _ = spec.partition(":")
    if not sep or spec.startswith("hf:") or not all(p.isidentifier() for p in mod_name.split(".")):
        return []
    if os.getcwd() not in sys.path and "" not in sys.path:  # where scheduler.models.factory_of looks too
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(mod_name)
    except Exception:  # noqa: BLE001  (a parent package that fails to import: building the model will say so)
        return []
    return [found.origin] if found is not None and found.origin and os.path.exists(found.origin) else []


def check_outputs(outputs: Iterable[tuple[str, str | None]], inputs: Iterable[str | None] = ()) -> None:
    """Check each ``(flag, path)`` before the command works (NOTE [ Output files ]).

    Raises:
        OutputPathError: a path that cannot be written or that is an input.
    """
    ins = [p for p in inputs if p]
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if path is None:
            continue
        check_output_path(path, inputs=ins, what=f"{flag} file")
        if path in seen:
            raise CkptError(f"{flag} and {seen[path]} name the same file {path!r}")
        seen[path] = flag


def split_items(items: Iterable[str], flag: str = "-S") -> list[tuple[str, str]]:
    """``KEY=VALUE`` strings as ``(key, text)`` pairs, the values left as text (typed by the reader).

    Raises:
        CkptError: an item without ``=`` or with a key that is no identifier.
    """
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise CkptError(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} time_limit_s=30")
        out.append((key.strip(), value))
    return out


#: Solver flag of ``ckpt solve`` -> the option it sets (NOTE [ How the CLI fails ]: a solver that does not take it
#: refuses it).
SOLVER_FLAGS = {"--time-limit": "time_limit_s", "--gap": "gap_limit", "--method": "method"}


def solve_flag_options(name: str, args: argparse.Namespace, *, strict: bool = True) -> dict:
    """The options for solver ``name`` from ``ckpt solve``'s flags and ``-S`` (NOTE [ Solver options ])."""
    flags = {flag: (option, getattr(args, flag[2:].replace("-", "_"))) for flag, option in SOLVER_FLAGS.items()}
    return solver_flag_options(name, flags, args.solver_option, strict=strict)


def solver_flag_options(solver: str, flags: Mapping[str, tuple[str, Any]], items: Iterable[str], *,
                        strict: bool = True) -> dict[str, Any]:
    """The options to pass ``solver``: from its flags and from ``-S key=value`` (NOTE [ Solver options ]).

    Args:
        solver: a registered solver name.
        flags: flag -> ``(option name, value)`` for each solver flag (value None: not set).
        items: the ``-S KEY=VALUE`` texts; each value is read as the type the solver declares.
        strict: refuse what the solver does not take (False: leave it out, for ``--solver all``).

    Returns:
        option name -> value, checked against the solver's declaration.

    Raises:
        CkptError: a flag or key the solver does not take (naming what it takes, with types), or a
            malformed item; :class:`solvers.SolverOptionError` for a value of the wrong type or range.
    """
    info = solver_info(solver)
    declared = {o.name: o for o in info.options}
    out: dict[str, Any] = {}
    for flag, (name, value) in flags.items():
        if value is None:
            continue
        if name in declared:
            out[name] = declared[name].check(value, solver, info.options)
        elif strict:
            raise CkptError(f"{flag} does not apply to solver {solver}: it takes {describe(info.options)} "
                            f"(ckpt solve --solver {solver} --help-options)")
    for key, text in split_items(items):
        if key in declared:
            out[key] = declared[key].parse(text, solver, info.options)
        elif strict:
            raise CkptError(f"-S {key}=...: solver {solver} takes no option {key!r}; it takes "
                            f"{describe(info.options)} (ckpt solve --solver {solver} --help-options)")
    return out


def solver_options_help(names: Iterable[str]) -> str:
    """Each solver's options, one per line under its name (``--help-options``)."""
    lines = []
    for name in names:
        info = solver_info(name)
        part = f" (one method of {info.part_of})" if info.part_of else ""
        lines.append(f"{name}{part}: {info.summary}")
        lines += [f"    -S {o.line()}" for o in info.options] or ["    (no options)"]
    return "\n".join(lines)


def add_target_flag(p: argparse.ArgumentParser, *names: str) -> None:
    """``--target``: the device a trace plans for (NOTE [ Trace targets ] in ``scheduler.tracing.target``);
    ``names``: other spellings kept working (``--cost-device``)."""
    from ..tracing.roofline import DEFAULT_DEVICE, DEVICES

    p.add_argument("--target", *names, dest="target", default=None, metavar="DEVICE",
                   help=f"the device to plan for, whose kernels (attention, dropout) decide what is saved and whose "
                        f"roofline prices the recompute: cpu, cuda (= {DEFAULT_DEVICE}) or a GPU ({', '.join(DEVICES)}); "
                        f"default: the model's device, cuda for a meta model")
