"""Results pages: what every benchmark suite writes, and where each page came from.

Every Markdown page under ``benchmarks/results/`` is written by
:func:`write_page`, which puts the page's provenance under its title
(NOTE [ Results pages ]), and every suite is declared in :data:`SUITES` with
the pages it writes and the code it measures. ``tests/test_results_pages.py``
reads both: a committed page that names no commit, was measured on a dirty
tree, or is older than the code its suite measures fails.

NOTE [ Results pages ]
A results page is only as good as the commit it names. Its header is four
lines, written here and nowhere else:

    - commit: `abc1234` (``git rev-parse --short HEAD`` when the suite
      started; ``+dirty`` when tracked files outside ``benchmarks/results/``
      differed from it then or when the page was written, or HEAD moved)
    - date: the UTC time the page was written, and the suite's wall time
    - machine: CPU model, cores, load average, torch and Python versions
    - command: the exact command line that wrote it

A page is stale once any path its suite declares in ``measures`` changed in a
commit after the one in its header (``git log COMMIT..HEAD -- PATHS``); the
fix is to run the command in its header again on a clean tree and commit the
page. ``--quick`` runs write under ``benchmarks/results/quick/`` (ignored by
git), never over a committed page.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

__all__ = ["Header", "Suite", "SUITES", "COMPILE_ONLY", "RESULTS", "out_dir", "write_page", "read_header", "mark_start",
           "bench_suites", "seconds"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# What the suites exercise, by package (paths relative to the repository root).
_SOLVE = ("graphs/", "solvers/")
_TRACE = _SOLVE + ("scheduler/tracing/", "scheduler/models/")
_STEP = _TRACE + ("scheduler/applying/", "scheduler/measuring/", "scheduler/sizing/", "scheduler/api.py")
#: What only ``scheduler.solve_compiled`` runs (the compile-aware search, its measure): under ``_STEP``'s folders,
#: and no suite's pages but those that name them depend on them.
COMPILE_ONLY = ("scheduler/sizing/compiled.py", "scheduler/compiled.py", "scheduler/measuring/compiled.py",
                "scheduler/measuring/inductor.py")
#: Where files of :data:`COMPILE_ONLY` were before (``solve_compiled`` in ``scheduler/sizing/`` from ``ba21d3e``
#: to ``fc9e0c3``): excluded alike.
COMPILE_ONLY_BEFORE = ("scheduler/sizing/solve_compiled.py",)


@dataclass(frozen=True)
class Suite:
    """One benchmark module (``name`` under ``benchmarks/``) and what its pages depend on.

    Attributes:
        name: the module under ``benchmarks/``.
        pages: the Markdown pages it writes under ``benchmarks/results/``.
        measures: repository paths (files, or folders ending in ``/``) whose
            change makes its pages stale; the module itself is always one.
        bench: run by ``make bench`` (``benchmarks.run``); False for a suite
            that needs libraries the project does not install (``how`` says
            how to run it).
        how: the command that writes its pages, when ``bench`` is False.
    """

    name: str
    pages: tuple[str, ...]
    measures: tuple[str, ...]
    bench: bool = True
    how: str = ""

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the suite's pages depend on: its own module and ``measures``."""
        return (f"benchmarks/{self.name}.py", *self.measures)

    @property
    def pathspecs(self) -> tuple[str, ...]:
        """:attr:`paths` as ``git log`` reads them: without the files of :data:`COMPILE_ONLY` that the suite does
        not name."""
        return self.paths + tuple(f":(exclude){p}" for p in COMPILE_ONLY + COMPILE_ONLY_BEFORE if p not in self.measures)


#: Every suite that writes a results page, in ``make bench``'s run order.
SUITES: tuple[Suite, ...] = (
    Suite("solvers", ("solvers.md",), _SOLVE),
    Suite("limits", ("limits.md",), _TRACE + ("benchmarks/scale.py", "scheduler/cli.py", "scheduler/commands/",
                                             "scheduler/sizing/", "scheduler/progress.py", "scheduler/report.py")),
    Suite("aligned", ("aligned.md",), _SOLVE),
    Suite("scale", ("scale.md",), _TRACE),
    Suite("trace_memory", ("trace_memory.md",), _STEP + ("scheduler/report.py",)),
    Suite("apply_memory", ("apply_memory.md",), _STEP),
    Suite("apply_shapes", ("apply_shapes.md",), _STEP),
    Suite("compare", ("compare_summary.md",), _STEP + ("benchmarks/maxbatch.py", "scheduler/comparing/")),
    Suite("selective", ("selective.md",), _STEP + ("scheduler/comparing/",)),
    Suite("fit", ("fit.md",), _STEP),
    Suite("zoo", ("zoo.md",), _STEP),
    Suite("loop", ("loop.md",), _STEP),
    Suite("chunked", ("chunked.md",), _STEP + ("solvers/model/chunks.py", "scheduler/applying/chunked.py")),
    Suite("fused_lms", ("fused_lms.md",), _STEP + ("solvers/model/chunks.py", "solvers/model/fused.py",
                                                 "scheduler/applying/chunked.py")),
    Suite("generated", ("generated.md",), _STEP + ("benchmarks/random_modules.py", "benchmarks/random_plans.py")),
    Suite("distributed", ("distributed.md",), _STEP + ("scheduler/distributed/", "scheduler/measuring/distributed.py",
                                                     "scheduler/models/staged.py")),
    Suite("thirdparty", ("thirdparty.md",), _STEP + ("benchmarks/thirdparty_models.py",),
          how="PYTHONPATH=. VENV/bin/python -m benchmarks.thirdparty, in a venv with timm, torchvision, diffusers, "
              "peft, monai and segmentation_models_pytorch (make bench runs the models it can and keeps the committed "
              "page when a library is missing)"),
    Suite("levers", ("levers.md",), _STEP + ("benchmarks/thirdparty.py", "benchmarks/thirdparty_models.py",
                                           "scheduler/applying/chunked.py"),
          how="PYTHONPATH=. VENV/bin/python -m benchmarks.levers, in the venv of thirdparty (make bench runs the "
              "models it can and keeps the committed page when a library is missing)"),
    Suite("compile", ("compile.md",), _STEP + ("scheduler/comparing/", "scheduler/sizing/compiled.py",
                                               "benchmarks/compile_page.py", "benchmarks/steady.py"),
          how="PYTHONPATH=. VENV/bin/python -m benchmarks.compile, in the venv of thirdparty (torchvision; make bench "
              "runs the models it can and keeps the committed page when torchvision is missing)"),
    Suite("compile_thirdparty", ("compile_thirdparty.md",), _STEP + ("scheduler/measuring/inductor.py",
                                                                   "benchmarks/thirdparty.py",
                                                                   "benchmarks/thirdparty_models.py"),
          how="PYTHONPATH=. VENV/bin/python -m benchmarks.compile_thirdparty, in the venv of thirdparty (make bench "
              "runs the models it can and keeps the committed page when a library is missing)"),
    Suite("cost_models", ("cost_models.md",), _TRACE),
    Suite("time_truth", ("time.md",), _STEP + ("scheduler/comparing/", "benchmarks/chunked.py",
                                               "benchmarks/steady.py")),
    Suite("overhead", ("overhead.md",), ("scheduler/applying/", "scheduler/api.py")),
    Suite("startup", ("startup.md",), ("graphs/", "solvers/", "scheduler/")),
    Suite("cuda", ("cuda.md",), _STEP + ("benchmarks/generated.py", "benchmarks/random_modules.py",
                                          "benchmarks/random_plans.py"), bench=False,
          how="python -m benchmarks.cuda, on a machine with a CUDA GPU and torchvision (make bench runs on this "
              "project's CPU machine and does not run it)"),
    Suite("accounting", ("accounting.md",), _STEP, bench=False,
          how="python -m benchmarks.accounting timm-vit-s timm-vit-b hf-vit hf-t5 (in a venv with timm, see the module)"),
)


def bench_suites() -> list[str]:
    """The suites ``make bench`` runs, in order."""
    return [s.name for s in SUITES if s.bench]


@dataclass(frozen=True)
class Header:
    """A results page's provenance, as :func:`read_header` parses it."""

    commit: str
    dirty: bool
    date: str
    machine: str
    command: str


_started = time.perf_counter()
_start_commit: str | None = None  # the commit when the suite started (set below, on import)


def mark_start() -> None:
    """Start the clock and note the commit the next page reports (``benchmarks.run`` calls it before each suite;
    importing this module does it for a suite run on its own)."""
    global _started, _start_commit
    _started, _start_commit = time.perf_counter(), _commit()


def out_dir(quick: bool = False) -> Path:
    """Where a suite writes its pages and data: ``results/``, or ``results/quick/`` for a ``--quick`` run."""
    path = RESULTS / "quick" if quick else RESULTS
    path.mkdir(parents=True, exist_ok=True)
    return path


def seconds(value: float | None) -> str:
    """A predicted or measured time to three significant digits in a unit that fits (``-`` for None)."""
    if value is None:
        return "-"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(value) >= scale or unit == "us":
            return f"{value / scale:.3g} {unit}"
    return "-"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _commit() -> str:
    head = _git("rev-parse", "--short", "HEAD")
    if head is None:
        return "none (not a git checkout)"
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return f"`{head}{'+dirty' if dirty else ''}`"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_version() -> str:
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _machine() -> str:
    load = f", load average {os.getloadavg()[0]:.1f} at the end" if hasattr(os, "getloadavg") else ""
    return (f"{_cpu_model()}, {os.cpu_count()} cores{load}, torch {_torch_version()}, "
            f"Python {platform.python_version()}")


def _command() -> str:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if argv and Path(argv[0]).name.startswith("python"):
        argv[0] = "python"
    return " ".join(argv)


def _provenance() -> str:
    """The commit at the start, ``+dirty`` if the tree was dirty then or is now, or HEAD moved meanwhile."""
    now, start = _commit(), _start_commit or _commit()
    if now != start and not start.endswith("+dirty`") and start.startswith("`"):
        start = start[:-1] + "+dirty`"
    return start


def header_lines() -> list[str]:
    """The four provenance lines of NOTE [ Results pages ], for a page written now."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [f"- commit: {_provenance()}",
            f"- date: {now} (this suite: {time.perf_counter() - _started:.0f} s)",
            f"- machine: {_machine()}",
            f"- command: `{_command()}`"]


def write_page(name: str, title: str, body: str | Iterable[str], *, quick: bool = False,
               command: str | None = None) -> Path:
    """Write ``results/NAME`` (``results/quick/NAME`` if ``quick``): the title, the header, then ``body``.

    ``name`` must be a page its suite declares in :data:`SUITES`. ``command``
    replaces the command line read from ``sys.orig_argv`` (a suite that writes
    from a child process). Returns the path written.
    """
    if not any(name in s.pages for s in SUITES):
        raise ValueError(f"results page {name!r} is declared by no suite: add it to benchmarks.pages.SUITES")
    text = body if isinstance(body, str) else "\n".join(body)
    lines = header_lines()
    if command is not None:
        lines[-1] = f"- command: `{command}`"
    path = out_dir(quick) / name
    path.write_text("\n".join([f"# {title}", "", *lines, "", text.rstrip("\n"), ""]), encoding="utf-8")
    return path


_FIELD = re.compile(r"^- (commit|date|machine|command): (.*)$")
_COMMIT = re.compile(r"^`([0-9a-f]{7,40})(\+dirty)?`")


def read_header(text: str) -> Header | None:
    """The header of a page written by :func:`write_page`, or None when it names no commit."""
    fields: dict[str, str] = {}
    for line in text.splitlines()[:8]:
        m = _FIELD.match(line)
        if m:
            fields[m.group(1)] = m.group(2)
    m = _COMMIT.match(fields.get("commit", ""))
    if m is None:
        return None
    return Header(commit=m.group(1), dirty=m.group(2) is not None, date=fields.get("date", ""),
                  machine=fields.get("machine", ""), command=fields.get("command", "").strip("`"))


mark_start()
