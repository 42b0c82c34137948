"""``make bench``: run every benchmark module in turn and write results/.

Each module in ``SUITES`` (``benchmarks.pages.SUITES``, where each suite
declares its pages and the code they measure) exposes
``main(quick: bool = False) -> None`` and writes its pages through
``benchmarks.pages.write_page`` (NOTE [ Results pages ]), with its data
(CSV/JSON) and small plots, under ``benchmarks/results/``. ``--quick`` runs
reduced sizes and writes under ``benchmarks/results/quick/`` (not committed);
``--only NAME`` runs one suite.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import time

from benchmarks import pages

#: Benchmark modules under benchmarks/, in run order.
SUITES = pages.bench_suites()

log = logging.getLogger("benchmarks")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="reduced sizes, minutes instead of tens of minutes")
    p.add_argument("--only", action="append", help="run only this suite (repeatable)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # NOTE [ Recompute timed in the step ]: every suite's traces measure their step as the applier runs plans
    importlib.import_module("scheduler.applying")
    for name in args.only or SUITES:
        try:
            mod = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"benchmarks.{name}":
                log.warning("benchmark suite %s is not present, skipped", name)
                continue
            raise
        t0 = time.perf_counter()
        pages.mark_start()
        log.info("suite %s: start", name)
        mod.main(quick=args.quick)
        log.info("suite %s: done in %.1fs", name, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
