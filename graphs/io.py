"""Reading and writing graphs as JSON files."""

from __future__ import annotations

import json
import os
from typing import Union

from .graph import Graph, GraphError

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
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(f"{source} is not valid JSON: {exc}") from None
    try:
        return Graph.from_dict(data)
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None


def save(graph: Graph, path: PathLike) -> None:
    """Write ``graph`` to ``path`` as JSON."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(dumps(graph))
        fh.write("\n")


def load(path: PathLike) -> Graph:
    """Read a graph written by :func:`save` or by hand.

    Raises:
        GraphError: the file is missing, not JSON, or not a valid graph; the
            message names the file and the offending node or field.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise GraphError(f"graph file {os.fspath(path)!r} does not exist") from None
    return loads(text, source=os.fspath(path))
