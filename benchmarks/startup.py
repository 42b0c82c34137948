"""Start-up time: ``import solvers``, ``import scheduler``, ``ckpt --help``, ``ckpt solve --help``.

Each case runs in a new Python process (nothing cached in the interpreter;
the OS file cache is warm after the first run), ``repeats`` times; the table
gives the median and the range of the wall time, and which heavy optional
libraries the case loaded (none of them should be: OR-Tools is imported only
when CP-SAT runs, torch only where a model is traced, applied or measured).

Targets (issue "a house a newcomer can walk"): ``import solvers`` under 1 s,
``ckpt --help`` under 1.5 s. The absolute numbers depend on the machine and
its load; the list of heavy modules does not.

Run: ``python -m benchmarks.run --only startup`` (part of ``make bench``) or
``python -m benchmarks.startup [--repeats 5] [--compare OTHER_CHECKOUT]``; writes
``results/startup.md`` (``--quick``: under ``results/quick/``). ``--compare`` measures another checkout of the project
(e.g. the commit before a change) in the same run, each repeat alternating
between the two, so both see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.pages import write_page

__all__ = ["CASES", "HEAVY", "measure", "main"]

ROOT = Path(__file__).resolve().parent.parent

#: Libraries that must not load on the start-up paths.
HEAVY = ("ortools", "pandas", "torch", "transformers", "timm", "matplotlib", "networkx", "scipy", "sympy", "numba")

_REPORT = f"import json, sys; print('@@' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)"

#: name -> Python code run in a fresh process.
CASES = {
    "import solvers": "import solvers",
    "import scheduler": "import scheduler",
    "ckpt --help": "import sys; from scheduler.cli import main; sys.stdout = open('/dev/null', 'w'); main(['--help'])",
    "ckpt solve --help": ("import sys; from scheduler.cli import main; sys.stdout = open('/dev/null', 'w'); "
                          "main(['solve', '--help'])"),
}


def run_once(code: str, root: Path) -> tuple[float, list[str]]:
    """Wall time of one fresh process running ``code`` in ``root``, and the heavy modules it loaded."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], cwd=root, capture_output=True, text=True,
                         check=True, env=env)
    elapsed = time.perf_counter() - t0
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("@@")]
    return elapsed, json.loads(line[-1][2:]) if line else ["?"]


def measure(code: str, repeats: int, roots: list[Path]) -> list[tuple[list[float], list[str]]]:
    """Per root: the wall times of ``repeats`` fresh processes (alternating between roots) and the heavy modules."""
    times: list[list[float]] = [[] for _ in roots]
    heavy: list[list[str]] = [[] for _ in roots]
    for _ in range(repeats):
        for i, root in enumerate(roots):
            t, heavy[i] = run_once(code, root)
            times[i].append(t)
    return list(zip(times, heavy))


def main(quick: bool = False, repeats: int = 5, compare: str | None = None, label: str = "") -> None:
    """Measure every case (in this checkout, and in ``compare`` if given) and write ``results/startup.md``."""
    repeats = 3 if quick else repeats
    roots = [ROOT] + ([Path(compare).resolve()] if compare else [])
    names = ["this tree"] + ([label or str(roots[1])] if compare else [])
    rows = []
    for case, code in CASES.items():
        for name, (times, heavy) in zip(names, measure(code, repeats, roots)):
            rows.append((case, name, statistics.median(times), min(times), max(times), heavy))
            print(f"{case:20s} {name:12s} median {statistics.median(times):.2f}s  ({min(times):.2f}-{max(times):.2f})"
                  f"  heavy: {', '.join(heavy) or 'none'}")
    lines = [
        f"Median of {repeats} new processes each. Targets: `import solvers` < 1 s, `ckpt --help` < 1.5 s. Absolute times follow the machine's load; "
        "the heavy modules do not.",
        "",
        "| case | tree | median | range | heavy modules loaded |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| `{c}` | {n} | {m:.2f} s | {lo:.2f}-{hi:.2f} s | {', '.join(h) or 'none'} |"
              for c, n, m, lo, hi, h in rows]
    write_page("startup.md", "Start-up time", lines, quick=quick)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compare", help="another checkout of the project to measure in the same run")
    p.add_argument("--label", default="", help="its name in the table (e.g. 'main before')")
    args = p.parse_args()
    main(repeats=args.repeats, compare=args.compare, label=args.label)
