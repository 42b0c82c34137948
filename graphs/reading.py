"""Reading a large graph file under a caller's deadline, node by node.

NOTE [ Reading a graph under a deadline ]
    ``graphs`` imports nothing of the project, so it does not know the
    solvers' ``Deadline``: a caller that must answer by a given time
    (``ckpt solve --time-limit``, NOTE [ One deadline ] in ``solvers.deadline``)
    hands :func:`graphs.load` a ``check(what)`` callable, and reading calls it
    between pieces of work small enough to stop after: the callable raises
    to stop (the command's ``OutOfTime``) and ``what`` says how far reading
    got. A 20,000-node chain's 10 MB file takes about a second of an idle
    core to read (JSON, nodes, order, checks) and 10-15 s at a load of 8;
    read in one piece, it ran past a 10 s limit unseen.

    * The JSON is parsed a top-level value at a time, and the ``nodes`` list
      a node at a time (:func:`parse_graph_json`, with json's own C
      scanner), ``check`` called every :data:`CHECK_EVERY` nodes; a file the
      piecewise parse does not take (anything but an object: an error, or a
      form it does not walk) is parsed whole by ``json.loads``, which gives
      the answer or names the error as before.
    * Building the nodes, sorting them and ``Graph.validate`` poll the check
      every :data:`CHECK_EVERY` nodes (``validate`` runs inside the graph's
      constructor, so the check reaches it through :func:`checking`, a
      context variable, not an argument); so do the passes of a
      ``simulate`` run within :func:`checking` (store-all's, for a
      fractional budget).
    * Python's cyclic garbage collector is off while a graph is read
      (:func:`no_collection`): the collections that reading's objects set
      off were pauses of up to 1.5 s at a load of 8 between two polls.

    Without a check (every other caller) reading does exactly what it did.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import json
from typing import Any, Callable, Iterator

__all__ = ["CHECK_EVERY", "checking", "no_collection", "poll", "poll_every", "parse_graph_json"]

#: Nodes read, built or checked between two calls of the caller's check.
CHECK_EVERY = 1024

_CHECK: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("graphs_read_check",
                                                                                     default=None)


def _no_constant(name: str) -> Any:
    raise ValueError(name)  # NaN, Infinity: json.loads with the caller's messages names them


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


@contextlib.contextmanager
def checking(check: Callable[[str], None] | None) -> Iterator[None]:
    """Within this block, reading and checking a graph call ``check(what)`` as they go (NOTE [ Reading a graph
    under a deadline ]); ``None``: no checks."""
    token = _CHECK.set(check)
    try:
        yield
    finally:
        _CHECK.reset(token)


def poll_every() -> int:
    """Nodes between two polls where a check is set (:data:`CHECK_EVERY`), 0 where none is: a loop reads it
    once, not at every node."""
    return CHECK_EVERY if _CHECK.get() is not None else 0


def poll(what: str) -> None:
    """Call the caller's check, if any, with what reading is doing."""
    check = _CHECK.get()
    if check is not None:
        check(what)


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic garbage collector off within the block (and back as it was after it): reading a graph
    makes no cycles, and the collections its million objects set off (two full ones for a 20,000-node file)
    took a third of the reading, in pauses no check could stop (1.5 s at a load of 8)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_graph_json(text: str, parse_whole: Callable[[str], Any]) -> Any:
    """``text`` parsed as JSON: a top-level object a value at a time and its ``nodes`` list a node at a time,
    polling the check in between; ``parse_whole(text)`` (``json.loads`` with the caller's error messages) for
    anything else, and whenever the piecewise parse fails (it then raises the canonical error or, where it
    parses, answers)."""
    if not poll_every():
        return parse_whole(text)
    poll("parsing the graph's JSON")
    try:
        return _object(text)
    except _NotWalked:
        return parse_whole(text)


class _NotWalked(Exception):
    """The piecewise parse does not take this text: parse it whole."""


def _object(s: str) -> dict[str, Any]:
    scan, ws = _DECODER.scan_once, json.decoder.WHITESPACE.match
    i = ws(s, 0).end()
    if s[i:i + 1] != "{":
        raise _NotWalked
    out: dict[str, Any] = {}
    i = ws(s, i + 1).end()
    if s[i:i + 1] == "}":
        return _end(s, i + 1, out)
    try:
        while True:
            if s[i:i + 1] != '"':
                raise _NotWalked
            key, i = json.decoder.scanstring(s, i + 1)
            i = ws(s, i).end()
            if s[i:i + 1] != ":":
                raise _NotWalked
            i = ws(s, i + 1).end()
            if key == "nodes" and s[i:i + 1] == "[":
                value, i = _nodes(s, i + 1)
            else:
                value, i = scan(s, i)
            out[key] = value
            i = ws(s, i).end()
            if s[i:i + 1] == "}":
                return _end(s, i + 1, out)
            if s[i:i + 1] != ",":
                raise _NotWalked
            i = ws(s, i + 1).end()
    except (ValueError, StopIteration, RecursionError):  # malformed: json.loads names it
        raise _NotWalked from None


def _nodes(s: str, i: int) -> tuple[list[Any], int]:
    scan, ws = _DECODER.scan_once, json.decoder.WHITESPACE.match
    nodes: list[Any] = []
    every = poll_every()
    i = ws(s, i).end()
    if s[i:i + 1] == "]":
        return nodes, i + 1
    while True:
        value, i = scan(s, i)
        nodes.append(value)
        if len(nodes) % every == 0:
            poll(f"parsing the graph's JSON ({len(nodes):,} nodes so far)")
        i = ws(s, i).end()
        if s[i:i + 1] == "]":
            return nodes, i + 1
        if s[i:i + 1] != ",":
            raise _NotWalked
        i = ws(s, i + 1).end()


def _end(s: str, i: int, out: dict[str, Any]) -> dict[str, Any]:
    if json.decoder.WHITESPACE.match(s, i).end() != len(s):  # trailing data: json.loads names it
        raise _NotWalked
    return out
