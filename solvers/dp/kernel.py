"""Which merge kernel ``dp`` runs: numba's, or the same code as plain Python while numba loads.

NOTE [ The dp kernel under a deadline ]
    ``dp`` merges each stage's candidates with a numba kernel
    (``solvers.dp._kernel``). Importing numba takes about 0.7 s, loading the
    cached kernel 0.4 s more, and compiling it on an empty cache (a fresh
    install, a new ``NUMBA_CACHE_DIR``) about 10 s on an idle core; a 15-node
    graph once ran 367 s on a 10 s ``ilp`` limit, waiting for it in the warm
    start. So a caller with a deadline (``kernel(wait=False)``) never waits:
    it gets the compiled kernel when this process has it loaded, otherwise the
    same file loaded as plain Python (numba's ``njit`` is then the identity:
    the same code, the same answers, checked by
    ``tests/solvers/test_deadlines.py::test_plain_kernel_is_the_compiled_one``,
    and about 25 times slower on long chains). A table too large for the
    plain copy's share of the limit but small enough for the compiled
    kernel's is not filled; instead a daemon thread starts importing numba
    and compiling (or loading) the kernel for the calls that follow (a sweep
    of budgets, ``fit``, ``compare``: ``load_in_background``). Small tables
    never start it: on a one-shot solve the thread would only take the CPU
    and the GIL from the searches. ``dp`` on its own has no deadline and
    waits (``wait=True``), as it always did.

    The thread is started once per process, by a solve under a deadline only,
    and compiles in this process into numba's on-disk cache (NOTE [ numba's
    cache ] in ``solvers.dp._kernel`` picks the folder, ``$NUMBA_CACHE_DIR``
    first): nothing is forked. A process forked *while* it runs (seconds,
    once) inherits numba's compiler lock held by a thread the child does not
    have, so a forked child that fills a ``dp`` table then may hang; a child
    started with ``spawn`` (or forked later) is unaffected. In the child the
    loader starts afresh (``os.register_at_fork``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from typing import Any, Callable

import numpy as np

__all__ = ["kernel", "plain_kernel", "compiled_ready", "load_in_background", "wait_for_compiled", "cache_is_warm",
           "WORK_PER_S", "PLAIN_NAME", "LOAD_S"]

log = logging.getLogger(__name__)

#: The module name the plain-Python copy of ``solvers.dp._kernel`` is loaded under.
PLAIN_NAME = "solvers.dp._plain"
#: ``dp``'s table work (``solvers.dp.chain.fill_work``) one idle core fills in about a second, by kernel: compiled
#: (True) or the plain copy (False).
WORK_PER_S = {True: 500_000, False: 20_000}

#: Seconds an idle core takes to make the compiled kernel callable: importing numba and loading the cached
#: machine code (warm: True), or compiling it on an empty cache (False).
LOAD_S = {True: 1.5, False: 12.0}

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "compiled": merge_stage once run; "thread": the loader; "error": why it failed


def _reset_in_child() -> None:
    _state.clear()  # a thread of the parent's does not exist here (NOTE [ The dp kernel under a deadline ])


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def plain_kernel() -> Callable[..., Any]:
    """``merge_stage`` of ``solvers.dp._kernel`` as plain Python (no numba imported)."""
    module = sys.modules.get(PLAIN_NAME)
    if module is None:
        with _lock:
            module = sys.modules.get(PLAIN_NAME)
            if module is None:
                path = os.path.join(os.path.dirname(__file__), "_kernel.py")
                spec = importlib.util.spec_from_file_location(PLAIN_NAME, path)
                module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
                spec.loader.exec_module(module)  # type: ignore[union-attr]
                sys.modules[PLAIN_NAME] = module
    return module.merge_stage


def _compiled() -> Callable[..., Any]:
    """Import numba and the kernel and run it once (compiles, or loads the cache); the kernel."""
    from . import _kernel

    e, z = np.zeros(1, np.int64), np.zeros(0, np.int64)
    _kernel.merge_stage(0, 0, e, e, e, e, e, np.ones(1, np.int64), z, z, z, z, z, 0)
    _state["compiled"] = _kernel.merge_stage
    return _kernel.merge_stage


def _load_in_background() -> None:
    try:
        _compiled()
        log.info("dp: the compiled kernel is loaded")
    except Exception as exc:  # noqa: BLE001  (kept, and raised to the next caller that waits)
        _state["error"] = exc
        log.info("dp: the compiled kernel could not be loaded (%s); the plain one runs", exc)


def compiled_ready() -> bool:
    """Whether this process has the compiled kernel loaded."""
    return "compiled" in _state


def load_in_background() -> None:
    """Start importing numba and compiling (or loading) the kernel in a daemon thread, once per process."""
    with _lock:
        if "thread" not in _state and "compiled" not in _state:
            _state["thread"] = threading.Thread(target=_load_in_background, name="ckpt-dp-kernel", daemon=True)
            _state["thread"].start()


def cache_is_warm() -> bool:
    """Whether numba's cache likely holds the compiled kernel (NOTE [ numba's cache ] in ``solvers.dp._kernel``:
    ``$NUMBA_CACHE_DIR``, the ``__pycache__`` beside it, the user's cache, the temporary fallback), newer than
    its source; looked up without importing numba."""
    import glob
    import tempfile

    here = os.path.dirname(__file__)
    source = os.path.getmtime(os.path.join(here, "_kernel.py"))
    uid = os.getuid() if hasattr(os, "getuid") else 0
    env = os.environ.get("NUMBA_CACHE_DIR")
    folders = [env] if env else [os.path.join(here, "__pycache__"),
                                 os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "numba"),
                                 os.path.join(tempfile.gettempdir(), f"ckpt-numba-cache-{uid}")]
    for folder in folders:
        for path in glob.glob(os.path.join(folder, "**", "_kernel.merge_stage-*.nbi"), recursive=True):
            try:
                if os.path.getmtime(path) >= source:
                    return True
            except OSError:
                continue
    return False


def wait_for_compiled(timeout_s: float) -> bool:
    """Start loading the compiled kernel (:func:`load_in_background`) and wait for it at most ``timeout_s``
    seconds; whether this process has it now. ``dp`` under its own time limit waits this way: the compile
    counts against the limit (NOTE [ dp under a time limit ] in ``solvers.dp.limited``)."""
    if compiled_ready():
        return True
    load_in_background()
    thread = _state.get("thread")
    if thread is not None and timeout_s > 0:
        thread.join(timeout_s)
    return compiled_ready()


def kernel(*, wait: bool) -> tuple[Callable[..., Any], bool]:
    """The kernel to fill a table with, and whether it is the compiled one.

    Args:
        wait: load (or compile) numba's kernel now if need be; False: never
            wait (NOTE [ The dp kernel under a deadline ]): the plain copy
            unless this process has the compiled one already.

    Raises:
        MissingDependency: ``wait`` and numba is not installed.
    """
    got = _state.get("compiled")
    if got is not None:
        return got, True
    if wait:
        return _compiled(), True
    return plain_kernel(), False
