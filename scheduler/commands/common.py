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
from typing import Any, Callable, Iterable

from graphs import CkptError, check_output_path

__all__ = ["positive_int", "positive_float", "nonneg_float", "gap_fraction", "granularity", "parse_options",
           "check_outputs", "reject_options", "MODEL_FLAGS", "add_model_flags", "add_model_arguments", "model_options"]


def _number(kind: Callable[[str], Any], text: str, what: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _number(int, text, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer (at least 1)")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds)."""
    value = _number(float, text, "a number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be greater than 0")
    return value


def nonneg_float(text: str) -> float:
    """A finite number >= 0 (a tolerance)."""
    value = _number(float, text, "a number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be 0 or more")
    return value


def gap_fraction(text: str) -> float:
    """A relative gap in [0, 1)."""
    value = _number(float, text, "a number")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value:g} is not a relative gap in [0, 1), e.g. 0.01 for 1 %")
    return value


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


def add_model_arguments(p: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """The MODEL argument (unless the command names it otherwise), every model flag and ``-O KEY=VALUE``."""
    if positional:
        p.add_argument("model", help="built-in name, hf:NAME, or package.module:factory (see `ckpt models`)")
    add_model_flags(p)
    p.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other model option (repeatable), e.g. --option vocab=1000")


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The model options the user set: the flags of :data:`MODEL_FLAGS`, then ``-O KEY=VALUE`` over them."""
    opts: dict[str, Any] = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k, None) is not None}
    opts.update(parse_options(args.option))
    return opts


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


def reject_options(solver: str, given: dict[str, Any], accepted: dict[str, Iterable[str]]) -> None:
    """Refuse flags the chosen solver does not take, naming those it does.

    Args:
        solver: the solver name (or ``all``).
        given: flag -> value for the solver flags the user set (None: not set).
        accepted: solver -> the flags it takes.

    Raises:
        CkptError: e.g. "--time-limit does not apply to solver chen ...".
    """
    if solver == "all":
        return
    takes = set(accepted.get(solver, ()))
    stray = [flag for flag, value in given.items() if value is not None and flag not in takes]
    if stray:
        which = ", ".join(f"{name} ({', '.join(flags)})" for name, flags in accepted.items() if flags)
        raise CkptError(f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not apply to solver {solver}; "
                        f"it takes {', '.join(sorted(takes)) or 'no solver flags'} (solver flags: {which})")
