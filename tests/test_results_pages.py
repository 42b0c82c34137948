"""Results pages cannot go stale (NOTE [ Results pages ] in benchmarks/pages.py).

Every Markdown page committed under ``benchmarks/results/`` is declared by a
suite in ``benchmarks.pages.SUITES``, names the commit it was measured on (a
clean tree), and that commit is in this branch's history with no later commit
touching the code its suite measures. Reading git history needs a git
checkout: outside one (an sdist, a copied tree) these tests skip, saying so;
in a checkout they never skip.

``test_page_is_fresh`` carries the ``results`` marker: ``make check-results``
runs it (``make bench`` regenerates the pages first), and ``make test``
deselects it, because a results page goes stale with every commit to the code
it measures, and the regeneration (``make bench``, hours on 2 busy cores) is not
part of a test run. Every other check here runs in ``make test``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import pages

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def _in_checkout() -> bool:
    return shutil.which("git") is not None and _git("rev-parse", "--is-inside-work-tree").stdout.strip() == "true"


needs_git = pytest.mark.skipif(not _in_checkout(), reason="not a git checkout: page freshness is read from git history")


def _committed_pages() -> list[str]:
    if not _in_checkout():
        return []
    out = _git("ls-files", "--", "benchmarks/results/*.md").stdout.split()
    return sorted(Path(p).name for p in out if Path(p).parent == Path("benchmarks/results"))


def _suite_of(page: str) -> pages.Suite:
    found = [s for s in pages.SUITES if page in s.pages]
    assert found, f"benchmarks/results/{page} is declared by no suite: add it to benchmarks.pages.SUITES"
    return found[0]


@needs_git
@pytest.mark.results
@pytest.mark.parametrize("page", _committed_pages())
def test_page_is_fresh(page):
    suite = _suite_of(page)
    head = pages.read_header((pages.RESULTS / page).read_text(encoding="utf-8"))
    rerun = f"run `{suite.how or 'python -m benchmarks.run --only ' + suite.name}` on a clean tree and commit the page"
    assert head is not None, f"benchmarks/results/{page} names no commit: {rerun}"
    assert not head.dirty, f"benchmarks/results/{page} was measured on uncommitted changes ({head.commit}+dirty): {rerun}"
    assert _git("merge-base", "--is-ancestor", head.commit, "HEAD").returncode == 0, (
        f"benchmarks/results/{page} names commit {head.commit}, which is not in this branch's history "
        f"(measured before a rebase?): {rerun}")
    later = _git("log", "--format=%h %s", f"{head.commit}..HEAD", "--", *suite.pathspecs).stdout.strip()
    assert not later, (f"benchmarks/results/{page} (commit {head.commit}) is older than the code it measures; "
                       f"{rerun}. Changed since:\n{later}")


def test_suites_declare_paths_that_exist():
    for suite in pages.SUITES:
        for path in suite.paths:
            assert (ROOT / path).exists(), f"suite {suite.name} measures {path}, which does not exist"


@needs_git
def test_every_declared_page_is_committed():
    committed = set(_committed_pages())
    missing = [f"{s.name}: {p}" for s in pages.SUITES for p in s.pages if p not in committed]
    assert not missing, f"declared pages not committed under benchmarks/results/: {missing}"


def test_make_bench_runs_the_declared_suites():
    from benchmarks import run

    assert run.SUITES == pages.bench_suites()


_WRITES_MD = re.compile(r"""["'][\w{}.-]*\.md["']""")


def test_every_suite_writes_through_the_writer():
    """No benchmark module names a Markdown page but through ``pages.write_page``."""
    shared = (ROOT / "benchmarks/thirdparty.py").read_text(encoding="utf-8")
    assert "def run_suite(" in shared and "write_page(" in shared.split("def run_suite(", 1)[1].split("\ndef ", 1)[0]
    for suite in pages.SUITES:
        src = (ROOT / f"benchmarks/{suite.name}.py").read_text(encoding="utf-8")
        # thirdparty.run_suite (the loop the third-party suites share) writes through write_page, checked above
        assert "write_page(" in src or "run_suite(" in src, \
            f"benchmarks/{suite.name}.py does not write its pages with pages.write_page"
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.name == "pages.py":
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if _WRITES_MD.search(line) and ("open(" in line or "write_text(" in line):
                pytest.fail(f"{path.name} writes a Markdown page without pages.write_page: {line.strip()}")


def test_a_written_page_names_this_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "RESULTS", tmp_path)
    path = pages.write_page("solvers.md", "Solver benchmark", ["| a |", "|---|"], command="python -m x")
    text = path.read_text(encoding="utf-8")
    head = pages.read_header(text)
    if not _in_checkout():
        assert "- commit: none (not a git checkout)" in text
    else:
        assert head is not None and head.commit == _git("rev-parse", "--short", "HEAD").stdout.strip()
        assert head.command == "python -m x" and "torch" in head.machine and "UTC" in head.date
    assert text.startswith("# Solver benchmark\n\n- commit: ") and text.endswith("| a |\n|---|\n")
    assert pages.write_page("solvers.md", "t", "", quick=True) == tmp_path / "quick" / "solvers.md"
    with pytest.raises(ValueError, match="declared by no suite"):
        pages.write_page("nobody.md", "t", "")


def test_a_page_without_a_header_names_no_commit():
    assert pages.read_header("# Solver benchmark\n\n`python -m benchmarks.run` on 2 cores\n") is None
    assert pages.read_header("# t\n\n- commit: `abc1234+dirty`\n").dirty


def test_every_page_is_listed_in_the_results_doc():
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    missing = [p for s in pages.SUITES for p in s.pages if f"(../benchmarks/results/{p})" not in text]
    assert not missing, f"results pages docs/results.md does not link: {missing}"


def test_times_are_written_in_a_unit_that_fits():
    assert [pages.seconds(s) for s in (12.34, 0.00123, 4.5e-7, 0.0, None)] == ["12.3 s", "1.23 ms", "0.45 us", "0 us",
                                                                               "-"]


@needs_git
def test_the_compile_search_stales_the_compile_page_and_no_page_that_does_not_run_it():
    """``pages.COMPILE_ONLY``: files under ``_STEP``'s folders that only ``solve_compiled`` and the compile page
    run; git reads the exclusions (``git ls-files`` with a suite's pathspecs lists what its pages depend on)."""
    def files(suite_name: str) -> set[str]:
        suite = next(s for s in pages.SUITES if s.name == suite_name)
        return set(_git("ls-files", "--", *suite.pathspecs).stdout.split())

    step = files("apply_memory")
    assert "scheduler/sizing/fit.py" in step and "scheduler/measuring/steps.py" in step
    assert not step & set(pages.COMPILE_ONLY)
    assert "scheduler/sizing/compiled.py" in files("compile")
    assert all((ROOT / p).is_file() for p in pages.COMPILE_ONLY)
