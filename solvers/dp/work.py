"""How much work ``dp``'s table is, counted before it is filled, and how a table filled against its deadline
paces its region length (NOTE [ dp under a time limit ] in ``solvers.dp.limited``)."""

from __future__ import annotations

import numpy as np

from ..deadline import Deadline, OutOfTime
from ..model.stages import Stages
from .kernel import WORK_PER_S, compiled_ready, load_in_background

__all__ = ["fill_work", "last_regionable", "ADAPT_MARGIN"]

#: A table filled against its deadline aims to end at this share of the time left (``solvers.dp.chain``).
ADAPT_MARGIN = 0.8


def _paced(cap: int, paced: tuple[float, int], i: int, deadline: Deadline, m: int) -> tuple[int, tuple[float, int]]:
    """The region length for the next stages (NOTE [ dp under a time limit ]): the stages since ``paced`` took
    ``actual`` seconds each; ``target`` is what each of the ``i + 1`` stages left may take."""
    now = deadline.clock()
    actual = (now - paced[0]) / max(1, paced[1] - i)
    target = ADAPT_MARGIN * deadline.left() / (i + 1)
    if actual > target:
        cap = max(1, int(cap * target / actual))
    elif actual < 0.5 * target:
        cap = min(m, max(cap + 1, int(cap * 1.5)))
    return cap, (now, i)


def last_regionable(st: Stages, max_len: int | None = None) -> np.ndarray:
    """Per stage ``i`` the last stage ``j >= i`` with stages ``i..j`` all regionable (``i - 1``: none), and
    ``j < i + max_len`` when ``max_len`` is given."""
    m = len(st)
    lmax = np.full(m, -1, dtype=np.int64)
    for i in range(m - 1, -1, -1):
        lmax[i] = (lmax[i + 1] if i + 1 < m and st.regionable[i + 1] else i) if st.regionable[i] else i - 1
    if max_len is not None:
        at = np.arange(m, dtype=np.int64)
        lmax = np.where(lmax >= at, np.minimum(lmax, at + max(1, int(max_len)) - 1), lmax)
    return lmax


def _check_work(st: Stages, max_s: float | None, max_len: int | None = None) -> None:
    """Refuse a table of more work than the kernel at hand does in ``max_s`` (NOTE [ The dp kernel under a
    deadline ]), starting to load the compiled kernel where it would do it."""
    if max_s is None:
        return
    work, compiled = fill_work(st, max_len), compiled_ready()
    if work <= max_s * WORK_PER_S[compiled]:
        return
    if not compiled and work <= max_s * WORK_PER_S[True]:
        load_in_background()  # for the calls that follow
    raise OutOfTime(f"dp's table is {work} units of work, more than its kernel fills in {max_s:g} s"
                    + ("" if compiled else " (plain Python: numba's kernel is not loaded)"), by="work limit")


def fill_work(st: Stages, max_len: int | None = None) -> int:
    """The work of filling the table of ``st``, counted before it is filled: the nodes of every region's
    row (``sum over i of the nodes from stage i to its last regionable stage``) plus the stages; with
    ``max_len``, of regions of at most that many stages. Quadratic in a chain's length: every region
    ``i..j`` is a candidate (2 * 10**8 units on a 20,000-node chain, 400 s of an idle core)."""
    lmax = last_regionable(st, max_len)
    starts, ends = np.asarray(st.starts, dtype=np.int64), np.asarray(st.ends, dtype=np.int64)
    ok = lmax >= np.arange(len(st))
    return int(len(st) + (ends[lmax[ok]] - starts[ok] + 1).sum())
