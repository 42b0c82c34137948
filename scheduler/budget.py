"""Memory budgets: "6GiB", "512MiB", "1.5GB", plain bytes, or a fraction.

A budget in bytes is for the whole step: everything the step holds
(parameters, their gradients, inputs, activations) and, when the user names
an optimizer, its state, which is subtracted first because it is alive during
the whole step. A fraction ``0 < f <= 1`` means ``f`` times the store-all
activation peak, as ``torch.compile``'s ``activation_memory_budget`` does;
parameters, inputs and parameter gradients are added on top.
"""

from __future__ import annotations

import re
from typing import Union

from graphs import CkptError, Graph
from solvers.errors import format_bytes
from solvers.simulate import activation_budget_bytes

__all__ = ["BudgetError", "parse_budget", "parse_size", "format_bytes", "optimizer_state_bytes", "OPTIMIZER_STATES"]

BudgetSpec = Union[str, int, float]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

#: Optimizer state per parameter, in units of the parameter's own bytes.
OPTIMIZER_STATES = {"none": 0, "sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}


class BudgetError(CkptError, ValueError):
    """A budget string could not be understood, or leaves nothing for activations."""


def parse_size(text: str) -> int:
    """Bytes from ``"6GiB"``, ``"512MiB"``, ``"1.5GB"``, ``"123456"``.

    Raises:
        BudgetError: unknown unit or malformed number, with accepted forms.
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
    value = number * _UNITS[unit]
    if value <= 0:
        raise BudgetError(f"a size must be positive, got {text!r}")
    return int(value)


def optimizer_state_bytes(param_bytes: int, optimizer: str | None) -> int:
    """Bytes of optimizer state for parameters of ``param_bytes`` (same dtype).

    Raises:
        BudgetError: unknown optimizer name.
    """
    key = (optimizer or "none").lower()
    if key not in OPTIMIZER_STATES:
        raise BudgetError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZER_STATES)}")
    return OPTIMIZER_STATES[key] * param_bytes


def parse_budget(spec: BudgetSpec, graph: Graph | None = None, *, optimizer: str | None = None) -> int:
    """The whole-step budget in bytes that ``simulate``'s ``peak_bytes`` must not exceed.

    Args:
        spec: ``"6GiB"``, ``"512MiB"``, ``"1.5GB"``, an integer number of
            bytes, or a fraction in (0, 1] (float or string such as ``"0.3"``)
            of the store-all activation peak (needs ``graph``).
        graph: the graph the budget applies to (for fractions).
        optimizer: when given, its state is subtracted from a byte budget.

    Raises:
        BudgetError: malformed spec, a fraction without a graph, or optimizer
            state that leaves nothing for the step.
    """
    fraction = None
    if isinstance(spec, bool):
        raise BudgetError(f"budget must be a size or a fraction, got {spec!r}")
    if isinstance(spec, float) or (isinstance(spec, str) and re.fullmatch(r"\s*0*\.[0-9]+\s*|\s*1(\.0*)?\s*|\s*0\s*", spec)):
        fraction = float(spec)
        if not 0 < fraction <= 1:
            raise BudgetError(
                f"a fractional budget must be in (0, 1] (a share of the store-all activation peak), got {spec!r}; "
                "for bytes write e.g. '6GiB'"
            )
    if fraction is not None:
        if graph is None:
            raise BudgetError(f"a fractional budget ({spec!r}) needs the graph to know the store-all peak")
        return activation_budget_bytes(graph, fraction)
    if isinstance(spec, int):
        if spec <= 0:
            raise BudgetError(f"a budget must be positive, got {spec}")
        total = spec
    else:
        total = parse_size(spec)
    if optimizer and graph is not None:
        state = optimizer_state_bytes(graph.param_bytes, optimizer)
        if state >= total:
            raise BudgetError(
                f"{optimizer} state alone takes {format_bytes(state)}, which is all of the {format_bytes(total)} budget; "
                "raise the budget or use an optimizer with less state"
            )
        total -= state
    return total
