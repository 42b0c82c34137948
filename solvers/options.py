"""What a solver's options are: name, type, default, range, one line of doc.

NOTE [ Solver options ]
    Each registered solver declares its options once, as :class:`Option`
    values passed to :func:`~solvers.registry.register`; the default is read
    from the solver function's signature (so it is written once), and
    registration refuses a declaration that does not match the signature
    (a parameter not declared, or declared and absent). Everything else reads
    the declaration: :func:`~solvers.registry.solve` checks every option a
    caller passes (an unknown name, a wrong type, a value out of range or not
    among the choices raise :class:`~solvers.errors.SolverOptionError` naming
    the options the solver takes, with their types), ``ckpt solve`` parses
    ``-S key=value`` by the declared type and lists the options in
    ``--help-options``. A plan records the options as asked in
    ``Plan.options``; what the solver found is ``Plan.findings``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from .errors import SolverOptionError, UnknownOption

__all__ = ["Option", "describe", "check_all"]

_FROM_SIGNATURE: Any = object()  # the default is filled in from the solver's signature at registration
_KINDS = {bool: "bool", int: "int", float: "number", str: "str"}
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


@dataclass(frozen=True)
class Option:
    """One option of one solver.

    Attributes:
        name: the keyword, as the solver function takes it.
        kind: ``bool``, ``int``, ``float`` (an ``int`` is accepted) or ``str``.
        doc: one line for people.
        default: the default (filled from the solver's signature when left out).
        choices: the accepted values of a ``str`` option (empty: any).
        minimum: the least accepted number (inclusive), or None.
        above: numbers must be greater than this (exclusive), or None.
        maximum: the largest accepted number (inclusive), or None.
        none_ok: None is accepted too (the doc says what it means).
    """

    name: str
    kind: type
    doc: str
    default: Any = _FROM_SIGNATURE
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    none_ok: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise SolverOptionError(f"option {self.name}: kind must be one of bool, int, float, str, not {self.kind!r}")

    def type_text(self) -> str:
        """The accepted values in a few words: ``number > 0``, ``int >= 1 or None``, ``auto|frontier``."""
        if self.choices:
            text = "|".join(self.choices)
        else:
            text = _KINDS[self.kind]
            bounds = []
            if self.minimum is not None:
                bounds.append(f">= {self.minimum:g}")
            if self.above is not None:
                bounds.append(f"> {self.above:g}")
            if self.maximum is not None:
                bounds.append(f"<= {self.maximum:g}")
            if bounds:
                text += " " + " and ".join(bounds)
        return text + (" or None" if self.none_ok else "")

    def line(self) -> str:
        """``name (type, default D): doc``."""
        default = "" if self.default is _FROM_SIGNATURE else f", default {self.default!r}"
        return f"{self.name} ({self.type_text()}{default}): {self.doc}"

    def with_default(self, default: Any) -> "Option":
        """This option with its default set (at registration)."""
        return Option(self.name, self.kind, self.doc, default, self.choices, self.minimum, self.above, self.maximum,
                      self.none_ok)

    # ----------------------------------------------------------------- checks
    def check(self, value: Any, solver: str, options: Iterable["Option"]) -> Any:
        """``value`` if it is of the declared type and range (an ``int`` for a ``float`` option becomes a float).

        Raises:
            SolverOptionError: naming the option, what it takes and every option of ``solver``.
        """
        if value is None:
            if self.none_ok:
                return None
            self._fail(value, solver, options)
        if self.kind is bool:
            if not isinstance(value, bool):
                self._fail(value, solver, options)
            return value
        if self.kind is str:
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                self._fail(value, solver, options)
            return value
        ok_types = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, ok_types):
            self._fail(value, solver, options)
        if isinstance(value, float) and not math.isfinite(value):
            self._fail(value, solver, options)
        if ((self.minimum is not None and value < self.minimum) or (self.above is not None and value <= self.above)
                or (self.maximum is not None and value > self.maximum)):
            self._fail(value, solver, options)
        return float(value) if self.kind is float else value

    def parse(self, text: str, solver: str, options: Iterable["Option"]) -> Any:
        """The value of ``text`` (from ``-S key=value``) read as the declared type, then checked.

        Raises:
            SolverOptionError: the text is not of that type, or the value is out of range.
        """
        raw = text.strip()
        if self.none_ok and raw.lower() == "none":
            return None
        value: Any = raw
        if self.kind is bool:
            value = True if raw.lower() in _TRUE else False if raw.lower() in _FALSE else raw
        elif self.kind in (int, float):
            try:
                value = int(raw) if self.kind is int else float(raw)
            except ValueError:
                value = raw
        return self.check(value, solver, options)

    def _fail(self, value: Any, solver: str, options: Iterable["Option"]) -> None:
        raise SolverOptionError(f"solver {solver}: option {self.name} takes {self.type_text()}, got {value!r}; "
                                f"{solver} takes {describe(options)}")


def describe(options: Iterable[Option]) -> str:
    """``a (int >= 1 or None), b (bool)``, or ``no options``."""
    parts = [f"{o.name} ({o.type_text()})" for o in options]
    return ", ".join(parts) if parts else "no options"


def check_all(solver: str, options: tuple[Option, ...], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` checked against ``options``: the same keys, values as :meth:`Option.check` returns them.

    Raises:
        UnknownOption: a key ``solver`` does not take (naming those it does, with their types).
        SolverOptionError: a value of the wrong type or out of range.
    """
    by_name = {o.name: o for o in options}
    stray = sorted(set(given) - set(by_name))
    if stray:
        raise UnknownOption(f"solver {solver} takes no option {', '.join(map(repr, stray))}; "
                            f"it takes {describe(options)}")
    return {key: by_name[key].check(value, solver, options) for key, value in given.items()}
