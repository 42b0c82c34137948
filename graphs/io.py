"""Reading and writing graphs as JSON files (NOTE [ Output files ] in ``graphs.files``)."""

from __future__ import annotations

import json
import os
from typing import Callable, Union

from .files import parse_json, read_json, read_text, write_text_atomic
from .errors import GraphError
from .graph import Graph, graph_from_dict
from .reading import checking, no_collection, parse_graph_json, poll

__all__ = ["load", "save", "loads", "dumps"]

PathLike = Union[str, "os.PathLike[str]"]


def dumps(graph: Graph) -> str:
    """The graph as a JSON string (exact: ``loads(dumps(g)) == g``)."""
    return json.dumps(graph.to_dict(), indent=1)


def loads(text: str, *, source: str = "<string>") -> Graph:
    """Parse a graph from a JSON string.

    Raises:
        GraphError: the text is not JSON or does not describe a valid graph.
    """
    return _from_data(parse_json(text, what=source, error=GraphError), source)


def save(graph: Graph, path: PathLike) -> None:
    """Write ``graph`` to ``path`` as JSON, atomically (a failed write leaves the old file).

    Raises:
        OutputPathError: the file cannot be written.
    """
    write_text_atomic(path, dumps(graph) + "\n")


def load(path: PathLike, *, check: Callable[[str], None] | None = None) -> Graph:
    """Read a graph written by :func:`save` or by hand.

    Args:
        path: the JSON file.
        check: called as ``check(what)`` between pieces of the reading (NOTE [ Reading a graph under a
            deadline ] in ``graphs.reading``), ``what`` saying how far it got; it raises to stop the reading.

    Raises:
        GraphError: the file is missing, unreadable, a directory, not UTF-8,
            not JSON, or not a valid graph; the message names the file and
            the offending node or field.
    """
    source = os.fspath(path)
    with no_collection():
        if check is None:
            return _from_data(read_json(source, what="graph", error=GraphError), source, owned=True)
        return _load_checked(source, check)


def _load_checked(source: str, check: Callable[[str], None]) -> Graph:
    with checking(check):
        poll("reading the graph's file")
        text = read_text(source, what="graph", error=GraphError)
        data = parse_graph_json(text, lambda t: parse_json(t, what=f"graph file {source!r}", error=GraphError))
        del text
        return _from_data(data, source, owned=True)


def _from_data(data: object, source: str, *, owned: bool = False) -> Graph:
    try:
        if owned:  # NOTE [ Reading a graph under a deadline ]: each node's JSON freed as its node is built
            return graph_from_dict(Graph, data, owned=True)
        return Graph.from_dict(data)  # type: ignore[arg-type]
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None
    except RecursionError:
        raise GraphError(f"{source}: nested too deep to be a graph") from None
