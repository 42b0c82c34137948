"""The project's error types at their root: every error raised on purpose is a :class:`CkptError`."""

from __future__ import annotations

__all__ = ["CkptError", "GraphError"]


class CkptError(Exception):
    """Base class of every error this project raises on purpose."""


class GraphError(CkptError, ValueError):
    """A graph (or its JSON) is malformed: the message names the node and field."""
