"""The Pareto sets ``dp``'s table is made of, and the flat buffer its kernel reads them from (``solvers.dp.chain``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Front", "SuccessorBuffer", "thin"]


@dataclass(frozen=True)
class Front:
    """A Pareto set: ``h`` ascending, ``cost`` strictly descending; ``choice``
    is -1 (stored stage) or the last stage of a region; ``nxt`` the index in
    the next state's set."""

    h: np.ndarray
    cost: np.ndarray
    choice: np.ndarray
    nxt: np.ndarray


class SuccessorBuffer:
    """The fronts that follow a region ending at each stage ``j``, in one flat
    array ordered by ``j`` (filled right to left), so that the kernel reads all
    regions starting at one stage without a Python loop over ``j``: front
    ``j`` is ``h[seg_start[j]:seg_end[j]]`` (and ``c``).
    """

    def __init__(self, m: int) -> None:
        self.cap = 1024
        self.h = np.empty(self.cap, np.int64)
        self.c = np.empty(self.cap, np.int64)
        self.left = self.cap  # first used position
        self.seg_start = np.zeros(m, np.int64)
        self.seg_end = np.zeros(m, np.int64)

    def _grow(self, need: int) -> None:
        used = self.cap - self.left
        cap = max(2 * self.cap, used + need + 1024)
        shift = cap - self.cap
        for name in ("h", "c"):
            arr = np.empty(cap, np.int64)
            arr[shift + self.left:] = getattr(self, name)[self.left:]
            setattr(self, name, arr)
        self.seg_start += shift
        self.seg_end += shift
        self.left += shift
        self.cap = cap

    def push(self, j: int, front: Front) -> None:
        """Add the successor front of stage ``j`` (stages are pushed right to left)."""
        n = len(front.h)
        if n > self.left:
            self._grow(n)
        a = self.left - n
        self.h[a:self.left] = front.h
        self.c[a:self.left] = front.cost
        self.seg_start[j], self.seg_end[j] = a, self.left
        self.left = a


def thin(front: Front, size: int) -> Front:
    """Keep ``size`` entries evenly spread over the front, always the first
    (least ``h``: the least peak stays exact) and the last (least cost)."""
    keep = np.unique(np.linspace(0, len(front.h) - 1, size).round().astype(np.int64))
    return Front(front.h[keep], front.cost[keep], front.choice[keep], front.nxt[keep])
