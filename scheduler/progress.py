"""Progress lines for long phases: ``ckpt: tracing gpt ... 10 s`` on stderr.

NOTE [ Progress lines ]
    A first run on a busy laptop once sat silent for ten minutes (``apply
    --verify`` on the README's GPT: 573 s without a line). Every phase that
    can take long (tracing, each solve, verifying) runs inside
    :func:`phase`: when it passes :data:`SLOW_S` seconds a line says what is
    running and for how long, again every :data:`EVERY_S` seconds, and once
    more when it ends. Quick phases print nothing. The lines go to the
    ``scheduler.progress`` logger at INFO; the CLI shows them on stderr
    (:func:`enable`), a library user sees them when they configure logging.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Iterator

__all__ = ["phase", "enable", "SLOW_S", "EVERY_S"]

log = logging.getLogger("scheduler.progress")

#: A phase gets a line once it has run this long (seconds).
SLOW_S = 5.0
#: ... and another at this interval while it runs.
EVERY_S = 15.0


@contextlib.contextmanager
def phase(what: str, *, slow_s: float = SLOW_S, every_s: float = EVERY_S) -> Iterator[None]:
    """Report ``what`` on the progress logger if it runs longer than ``slow_s`` (NOTE [ Progress lines ])."""
    t0 = time.perf_counter()
    stop = threading.Event()

    def beat() -> None:
        wait = slow_s
        while not stop.wait(wait):
            log.info("%s ... %.0f s", what, time.perf_counter() - t0)
            wait = every_s

    watcher = threading.Thread(target=beat, name="ckpt-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(1.0)
    elapsed = time.perf_counter() - t0
    if elapsed >= slow_s:
        log.info("%s: done in %.0f s", what, elapsed)


class _Stderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the moment (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001  (a progress line must never fail the run)
            pass


def enable() -> None:
    """Show progress lines on stderr as ``ckpt: ...`` (idempotent)."""
    if any(isinstance(h, _Stderr) for h in log.handlers):
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("ckpt: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
