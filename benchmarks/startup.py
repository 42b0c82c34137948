"""Start-up time: ``import solvers``, ``import scheduler``, ``ckpt --help``, ``ckpt solve --help``.

Each case runs in a new Python process (nothing cached in the interpreter;
the OS file cache is warm after the first run), ``repeats`` times; the table
gives the median and the range of the wall time, and which heavy optional
libraries the case loaded (none of them should be: OR-Tools is imported only
when CP-SAT runs, torch only where a model is traced, applied or measured).

Targets (issue "a house a newcomer can walk"): ``import solvers`` under 1 s,
``ckpt --help`` under 1.5 s. The absolute numbers depend on the machine and
its load; the list of heavy modules does not.

Run: ``python -m benchmarks.startup [--repeats 5]``; writes ``results/startup.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["CASES", "HEAVY", "measure", "main"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"

#: Libraries that must not load on the start-up paths.
HEAVY = ("ortools", "pandas", "torch", "transformers", "timm", "matplotlib", "networkx", "scipy", "sympy")

_REPORT = f"import json, sys; print('@@' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)"

#: name -> Python code run in a fresh process.
CASES = {
    "import solvers": "import solvers",
    "import scheduler": "import scheduler",
    "ckpt --help": "import sys; from scheduler.cli import main; sys.stdout = open('/dev/null', 'w'); main(['--help'])",
    "ckpt solve --help": ("import sys; from scheduler.cli import main; sys.stdout = open('/dev/null', 'w'); "
                          "main(['solve', '--help'])"),
}


def measure(code: str, repeats: int) -> tuple[list[float], list[str]]:
    """Wall times of ``repeats`` fresh processes running ``code``, and the heavy modules the last one loaded."""
    times, heavy = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], cwd=ROOT, capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        times.append(time.perf_counter() - t0)
        line = [ln for ln in out.stdout.splitlines() + out.stderr.splitlines() if ln.startswith("@@")]
        heavy = json.loads(line[-1][2:]) if line else ["?"]
    return times, heavy


def main(quick: bool = False, repeats: int = 5, label: str = "") -> None:
    """Measure every case and write ``results/startup.md``."""
    repeats = 3 if quick else repeats
    rows = []
    for name, code in CASES.items():
        times, heavy = measure(code, repeats)
        rows.append((name, statistics.median(times), min(times), max(times), heavy))
        print(f"{name:20s} median {statistics.median(times):.2f}s  ({min(times):.2f}-{max(times):.2f})  "
              f"heavy: {', '.join(heavy) or 'none'}")
    lines = [
        "# Start-up time",
        "",
        f"Median of {repeats} new processes each (`python -m benchmarks.startup`), {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end{label}.",
        "Targets: `import solvers` < 1 s, `ckpt --help` < 1.5 s.",
        "",
        "| case | median | range | heavy modules loaded |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{n}` | {m:.2f} s | {lo:.2f}-{hi:.2f} s | {', '.join(h) or 'none'} |" for n, m, lo, hi, h in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--label", default="", help="text added to the table's caption (e.g. ', before the change')")
    args = p.parse_args()
    main(repeats=args.repeats, label=args.label)
