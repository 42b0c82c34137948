"""Memory budgets: "6GiB", "512MiB", "1.5GB", bytes, or a fraction.

A budget in bytes is for the whole step: everything the step holds
(parameters, their gradients, inputs, activations) and, when the user names
an optimizer, its state, which is subtracted first because it is alive during
the whole step.

NOTE [ Fractional budgets ]
    A fraction ``0 < f <= 1`` scales the activations of the store-all step,
    as ``torch.compile``'s ``activation_memory_budget`` does: the budget is
    store-all's peak ``P`` less ``(1 - f)`` of its activation peak ``A``,
    ``P - ceil((1 - f) * A)`` (``solvers.activation_budget_bytes``). So
    ``f = 1`` is exactly store-all's peak and every ``f < 1`` lies below it.
    (It used to be ``f * A`` plus the parameters, the inputs and *all*
    parameter gradients, which adds gradients to an activation peak that
    happens at another moment: "0.3" of a ViT-Base at 128 px was 751.8 MiB
    where store-all peaks at 674.3 MiB.)

A number without a unit is a fraction when it lies in (0, 1] (``0.3``,
``3e-1``); a bare integer of at least 1 MiB (``6442450944``) is bytes; any
other bare number (``1.5``, ``512``) is refused with a hint, since it was
surely meant as GiB or a fraction.
"""

from __future__ import annotations

import math
import re
from typing import Union

from graphs import CkptError
from graphs.schema import MAX_COUNT
from solvers.errors import format_bytes

__all__ = ["BudgetError", "read_budget", "parse_size", "format_bytes", "optimizer_state_bytes", "OPTIMIZER_STATES"]

BudgetSpec = Union[str, int, float]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_BARE = re.compile(r"^\s*[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?\s*$")

#: Optimizer state per parameter, in units of the parameter's own bytes.
OPTIMIZER_STATES = {"none": 0, "sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}


class BudgetError(CkptError, ValueError):
    """A budget string could not be understood, or leaves nothing for activations."""


def parse_size(text: str) -> int:
    """Bytes from ``"6GiB"``, ``"512MiB"``, ``"1.5GB"``, ``"1536B"``, ``"6442450944"``.

    A number without a unit must be an integer of at least 1 MiB
    (:data:`BARE_BYTES_MIN`); ``"1.5"`` or ``"80"`` is refused with a hint.

    Raises:
        BudgetError: unknown unit, malformed or non-finite number, a size not
            below 2**62, or an ambiguous bare number; with accepted forms.
    """
    m = _SIZE.match(str(text))
    if not m:
        raise BudgetError(
            f"cannot read {text!r} as a size; write e.g. '6GiB', '512MiB', '1.5GB' or a number of bytes"
        )
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _UNITS:
        hint = " (write GiB for 2**30 or GB for 10**9)" if unit in ("g", "m", "k", "t") else ""
        raise BudgetError(f"unknown size unit {m.group(2)!r} in {text!r}{hint}; use one of B, KB, MB, GB, KiB, MiB, GiB, TiB")
    if not math.isfinite(number) or number * _UNITS[unit] >= MAX_COUNT:
        raise BudgetError(f"size {text!r} is not below 2**62 bytes; write e.g. '6GiB'")
    if not unit and (number != int(number) or number < BARE_BYTES_MIN):
        raise BudgetError(_bare_hint(text.strip() if isinstance(text, str) else text))
    value = number * _UNITS[unit]
    if value < 1:
        raise BudgetError(f"a size must be at least one byte, got {text!r}")
    return int(value)


#: A number without a unit is bytes only from here up (NOTE [ Fractional budgets ]).
BARE_BYTES_MIN = 1 << 20


def _bare_hint(value: object) -> str:
    return (f"{value!s} has no unit: did you mean {value!s}GiB or a fraction in (0, 1] such as 0.3? "
            f"(bytes: write {value!s}B, or a whole number of at least {BARE_BYTES_MIN})")


def optimizer_state_bytes(param_bytes: int, optimizer: str | None) -> int:
    """Bytes of optimizer state for parameters of ``param_bytes`` (same dtype).

    Raises:
        BudgetError: unknown optimizer name.
    """
    key = (optimizer or "none").lower()
    if key not in OPTIMIZER_STATES:
        raise BudgetError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZER_STATES)}")
    return OPTIMIZER_STATES[key] * param_bytes


def read_budget(spec: BudgetSpec) -> tuple[str, float | int]:
    """``("fraction", f)`` or ``("bytes", n)``: the budget read without a graph (checks it early).

    Raises:
        BudgetError: as ``parse_budget`` (``scheduler.sizing.memory``), for everything but a missing graph.
    """
    fraction = None
    if isinstance(spec, bool) or not isinstance(spec, (str, int, float)):
        raise BudgetError(f"budget must be a size or a fraction, got {spec!r}")
    if isinstance(spec, float):
        fraction = spec
    elif isinstance(spec, str) and _BARE.match(spec):
        value = float(spec)
        if 0 < value <= 1 or value == 0:
            fraction = value
        elif not math.isfinite(value):
            raise BudgetError(f"budget {spec.strip()!r} is not a finite number; write e.g. '6GiB' or 0.3")
    if fraction is not None:
        if not 0 < fraction <= 1:
            hint = f" ({_bare_hint(fraction)})" if math.isfinite(fraction) and fraction > 1 else ""
            raise BudgetError(
                f"a fractional budget must be in (0, 1] (a share of the store-all activation peak), got {spec!r}; "
                f"for bytes write e.g. '6GiB'{hint}"
            )
        return "fraction", fraction
    if isinstance(spec, int):
        if spec <= 0:
            raise BudgetError(f"a budget must be positive, got {spec}")
        if spec >= MAX_COUNT:
            raise BudgetError(f"a budget of {spec} bytes is not below 2**62; write e.g. '6GiB'")
        return "bytes", spec
    return "bytes", parse_size(spec)
