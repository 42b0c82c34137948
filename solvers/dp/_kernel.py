"""The compiled inner loop of ``dp``: one stage's candidates merged into its Pareto set.

Imported only when a :class:`~solvers.dp.chain.DPTable` is filled, so that importing
``solvers`` does not load numba. The first call compiles the kernel and caches
the machine code on disk (``cache=_CACHE``, beside this file or in the user's
cache); later processes only load it. ``solvers.dp.kernel`` also loads this
file a second time as plain Python (no numba: every ``njit`` below is then the
identity), the kernel a solve under a deadline runs while numba loads (NOTE
[ The dp kernel under a deadline ] in ``solvers.dp.kernel``).

NOTE [ Filtering a stage's candidates by the front so far ]
    A stage's candidates are the stored option (one per entry of the next
    stage's set) and, for every region ``i..j`` (and, with selective
    recompute, every kept set of its menu), a *run*: the entries of the set
    that follows it from the one at or just below the region's floor to the
    end, shifted by the region's retained bytes, peak and cost. *Candidate
    order* is that sequence: stored, then runs by ``j``, then by position.
    The set kept is exactly the candidates no other candidate *beats*, where
    ``a`` beats ``b`` when ``a`` has no higher ``h`` and no higher cost and
    is better in one, or has the same pair and comes first in candidate
    order; i.e. ``h`` ascending, cost strictly descending, among equal ``h``
    the cheapest, among equal pairs the first.

    "Beats" is a strict partial order, so dropping beaten candidates never
    changes that set: each is beaten by an unbeaten one, never dropped. On a
    long chain a stage has about a hundred times more candidates than its set
    has entries, and almost all are beaten early. The kernel starts from
    ``R``, the set of the stored candidates and every run's first entry,
    walks each run dropping what ``R`` beats (a galloping pointer into ``R``,
    no gather, no sort), and merges the survivors into ``R`` in batches, so
    later runs meet a stronger ``R``. Candidates carry their order so that
    ties resolve as in one stable sort of all candidates by ``h``. At the end
    ``R`` is the stage's set.
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np

from ..errors import MissingDependency

#: This copy is the plain-Python one (``solvers.dp.kernel.PLAIN_NAME``): no numba is imported.
_PLAIN = __name__.endswith("._plain")

if _PLAIN:
    def njit(*_args, **_kwargs):  # noqa: D103  (the identity decorator of the plain copy)
        return lambda fn: fn
else:
    try:
        from numba import njit
    except ImportError as exc:  # pragma: no cover - numba is a core dependency
        raise MissingDependency("the dp solver needs numba to fill its table: pip install 'numba>=0.60'") from exc

__all__ = ["merge_stage"]

log = logging.getLogger(__name__)


def _cache_probe(x):  # pragma: no cover - never called: a function numba locates a cache for
    return x


def _choose_cache() -> bool:
    """Whether numba can cache the kernel, pointing it at a temporary folder when it must.

    NOTE [ numba's cache ]
        ``cache=_CACHE`` makes numba look for a writable folder when the kernel
        is *decorated* (at import): ``$NUMBA_CACHE_DIR``, the ``__pycache__``
        beside this file, then the user's cache (``~/.cache/numba``). Where
        none is writable (a read-only install and a read-only ``$HOME``, as
        in some containers and CI runners) numba raises RuntimeError and
        ``dp`` failed outright. So the search is tried first on a probe
        function; if it fails, numba is pointed at a folder under the
        system's temporary directory, and if even that fails the kernel is
        compiled without a cache (slower first call in every process, same
        answers). ``tests/scheduler/test_bad_inputs.py`` runs ``dp`` with every usual
        cache location unwritable.
    """
    try:
        from numba.core import config
        from numba.core.caching import FunctionCache
    except ImportError:  # pragma: no cover - a numba without these internals: trust its defaults
        return True
    try:
        FunctionCache(_cache_probe)
        return True
    except Exception:  # noqa: BLE001  (numba raises RuntimeError; anything else means the same here)
        pass
    folder = os.path.join(tempfile.gettempdir(), f"ckpt-numba-cache-{os.getuid() if hasattr(os, 'getuid') else 0}")
    try:
        os.makedirs(folder, exist_ok=True)
        config.CACHE_DIR = folder
        FunctionCache(_cache_probe)
        log.info("numba: no writable cache folder in the install or $HOME; caching in %s", folder)
        return True
    except Exception:  # noqa: BLE001
        log.info("numba: no writable cache folder anywhere; the dp kernel is compiled without a cache")
        return False


_CACHE = False if _PLAIN else _choose_cache()

#: Survivors held back before they are merged into ``R`` (plus ``|R| / 8``: a
#: merge costs ``O(|R|)``).
MERGE_AT = 64


@njit(cache=_CACHE, inline="always")
def _last_at_most(xs, n, p, x):
    """The last index ``q >= p`` with ``xs[q] <= x`` (``xs`` ascending, ``p``
    may be -1 and is such an index or -1); galloping from ``p``."""
    if p + 1 >= n or xs[p + 1] > x:
        return p
    lo = p + 1
    step = 1
    hi = lo + step
    while hi < n and xs[hi] <= x:
        lo = hi
        step *= 2
        hi = lo + step
    if hi > n:
        hi = n
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if xs[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=_CACHE, inline="always")
def _beaten(rh, rc, ro, p, h, c, o):
    """Whether entry ``p`` of the staircase (the last with ``rh <= h``) beats
    candidate ``(h, c)`` of order ``o``: lower ``h`` at no higher cost, lower
    cost, or the same pair earlier in candidate order."""
    # NOTE: written as early returns; numba compiled ``a or (b and ...)`` here
    # to code about five times slower over the whole kernel.
    if p < 0 or rc[p] > c:
        return False
    if rc[p] < c:
        return True
    return rh[p] < h or ro[p] < o


@njit(cache=_CACHE)
def _grown(arr, n, cap):
    """The first ``n`` entries of ``arr`` in a new array of ``cap`` entries."""
    new = np.empty(cap, np.int64)
    for k in range(n):  # a loop: slice assignment added seconds to the first compile
        new[k] = arr[k]
    return new


@njit(cache=_CACHE, inline="always")
def _entries(size):
    """Five empty int64 columns of a front's entries: h, cost, order, choice, next."""
    return (np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int64),
            np.empty(size, np.int64), np.empty(size, np.int64))


@njit(cache=_CACHE)
def _stable_order(keys, n):
    """Indices ``0..n-1`` sorted by ``keys``, equal keys in index order.

    A merge sort of the ascending runs already there (a batch is a few sorted
    runs; numba's own stable argsort also takes seconds to compile).
    """
    a = np.arange(n)
    b = np.empty(n, np.int64)
    bounds = np.empty(n + 1, np.int64)  # starts of the sorted runs, then n
    nb = 0
    for k in range(n):
        if k == 0 or keys[k] < keys[k - 1]:
            bounds[nb] = k
            nb += 1
    bounds[nb] = n
    nxt = np.empty(n + 1, np.int64)
    while nb > 1:
        m = 0
        for q in range(0, nb, 2):
            lo = bounds[q]
            mid = bounds[q + 1]
            hi = bounds[q + 2] if q + 2 <= nb else mid
            x, y, k = lo, mid, lo
            while x < mid and y < hi:
                if keys[a[y]] < keys[a[x]]:
                    b[k] = a[y]
                    y += 1
                else:
                    b[k] = a[x]
                    x += 1
                k += 1
            while x < mid:
                b[k] = a[x]
                x += 1
                k += 1
            while y < hi:
                b[k] = a[y]
                y += 1
                k += 1
            nxt[m] = lo
            m += 1
        nxt[m] = n
        bounds, nxt = nxt, bounds
        nb = m
        a, b = b, a
    return a


@njit(cache=_CACHE)
def _merge(rh, rc, ro, rch, rnx, n_r, bh, bc, bo, bch, bnx, n_b):
    """The unbeaten entries of set ``r`` (``n_r`` entries, ``h`` strictly
    ascending) and batch ``b`` (``n_b`` entries in candidate order ``o``):
    ``(h, cost, order, choice, nxt, length)``.

    Scanned by ``(h, order)``: an entry is kept when it costs less than
    everything before it, and among kept entries of equal ``h`` the last
    replaces the others (NOTE [ Filtering a stage's candidates by the front so far ]).
    """
    order = _stable_order(bh, n_b)
    size = n_r + n_b
    oh, oc, oo, och, onx = _entries(size)
    m = 0
    x = 0
    y = 0
    while x < n_r or y < n_b:
        # the next candidate by (h, order)
        if y >= n_b:
            take_r = True
        elif x >= n_r:
            take_r = False
        else:
            s = order[y]
            take_r = rh[x] < bh[s] or (rh[x] == bh[s] and ro[x] < bo[s])
        if take_r:
            h, c, o, ch, nx = rh[x], rc[x], ro[x], rch[x], rnx[x]
            x += 1
        else:
            s = order[y]
            h, c, o, ch, nx = bh[s], bc[s], bo[s], bch[s], bnx[s]
            y += 1
        if m == 0 or c < oc[m - 1]:
            if m == 0 or oh[m - 1] != h:
                m += 1
            oh[m - 1] = h
            oc[m - 1] = c
            oo[m - 1] = o
            och[m - 1] = ch
            onx[m - 1] = nx
    return oh, oc, oo, och, onx, m


@njit(cache=_CACHE)
def merge_stage(local, retained, nf_h, nf_c, buf_h, buf_c, seg_start, seg_end, js, floor, run_cost, ret, choice,
                extra):
    """The Pareto set of stage ``i`` entered in one boundary state.

    Args:
        local, retained: the stored stage's local peak and retained bytes.
        nf_h, nf_c: the next stage's set (stored option).
        buf_h, buf_c, seg_start, seg_end: the sets that can follow a region
            in flat arrays, set ``s`` at ``[seg_start[s], seg_end[s])``.
        js: per region candidate (a *run*), the set ``s`` that follows it:
            without selective recompute its last stage ``j``, for every ``j``
            up to the last regionable one, or on an aligned graph those where
            ``i..j`` is a span.
        floor, run_cost: per run its local peak without the input and its
            recompute cost.
        ret: per run the bytes it retains beyond its input (the kept
            tensors of selective recompute, ``solvers.dp.selective``; 0 without).
        choice: per run the code the plan is read back from (``j`` without
            selective recompute).
        extra: bytes of the region's input it holds (0 when ``lh == 1``).

    Returns:
        ``(h, cost, choice, nxt)``: ``h`` ascending, ``cost`` strictly
        descending, ``choice`` -1 (stored) or the run's code, ``nxt`` the index in the
        following set (NOTE [ Filtering a stage's candidates by the front so far ]).
    """
    n_s = nf_h.shape[0]
    nr = js.shape[0]
    # The stored option and the head of every run, in candidate order.
    n0 = n_s + nr
    lo = np.empty(nr, np.int64)
    first = np.empty(nr, np.int64)  # candidate order of each run's head
    sh = np.empty(n0, np.int64)
    sc = np.empty(n0, np.int64)
    so = np.arange(n0)  # candidate order
    sch = np.empty(n0, np.int64)
    snx = np.empty(n0, np.int64)
    for k in range(n_s):
        hk = retained + nf_h[k]
        sh[k] = hk if hk > local else local
        sc[k] = nf_c[k]
        sch[k] = -1
        snx[k] = k
    total = n_s
    longest = 0
    for r in range(nr):
        j = js[r]
        a = seg_start[j]
        b = seg_end[j]
        f = floor[r]
        rr = ret[r]
        # the last entry with rr + h <= f (the cheapest of those that collapse to the floor), else the first
        s, e = a, b
        while s < e:
            mid = (s + e) >> 1
            if rr + buf_h[mid] <= f:
                s = mid + 1
            else:
                e = mid
        t = s - 1 if s > a else a
        lo[r] = t
        first[r] = total
        so[n_s + r] = total
        total += b - t
        longest = max(longest, b - t)
        hh = extra + rr + buf_h[t]
        loc = f + extra
        sh[n_s + r] = hh if hh > loc else loc
        sc[n_s + r] = run_cost[r] + buf_c[t]
        sch[n_s + r] = choice[r]
        snx[n_s + r] = t - a
    # R: their unbeaten set; then the rest of every run, filtered by R and merged in.
    empty = np.empty(0, np.int64)
    rh, rc, ro, rch, rnx, n_r = _merge(empty, empty, empty, empty, empty, 0, sh, sc, so, sch, snx, n0)
    cap = MERGE_AT + longest + 1
    bh, bc, bo, bch, bnx = _entries(cap)
    n_b = 0
    for r in range(nr):
        j = js[r]
        a = seg_start[j]
        loc = floor[r] + extra
        ex = extra + ret[r]
        code = choice[r]
        cr = run_cost[r]
        o = first[r] - lo[r]  # candidate order of position 0
        if n_b + seg_end[j] - lo[r] > cap:
            cap = 2 * (n_b + seg_end[j] - lo[r])
            bh, bc, bo = _grown(bh, n_b, cap), _grown(bc, n_b, cap), _grown(bo, n_b, cap)
            bch, bnx = _grown(bch, n_b, cap), _grown(bnx, n_b, cap)
        p = -1
        for pos in range(lo[r] + 1, seg_end[j]):
            h = ex + buf_h[pos]
            if h < loc:
                h = loc
            c = cr + buf_c[pos]
            p = _last_at_most(rh, n_r, p, h)
            if not _beaten(rh, rc, ro, p, h, c, o + pos):
                bh[n_b] = h
                bc[n_b] = c
                bo[n_b] = o + pos
                bch[n_b] = code
                bnx[n_b] = pos - a
                n_b += 1
        if n_b > MERGE_AT + (n_r >> 3) or (n_b > 0 and r == nr - 1):
            rh, rc, ro, rch, rnx, n_r = _merge(rh, rc, ro, rch, rnx, n_r, bh, bc, bo, bch, bnx, n_b)
            n_b = 0
    return _grown(rh, n_r, n_r), _grown(rc, n_r, n_r), _grown(rch, n_r, n_r), _grown(rnx, n_r, n_r)
