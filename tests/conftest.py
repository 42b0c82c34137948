import atexit
import json
import os
import shutil
import tempfile

# Keep torch and BLAS from fighting over the cores: `make test` runs the suite in one process per core
# (pytest-xdist, PYTEST_XDIST_WORKER_COUNT), each with its share of the cores; alone, two threads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, min(2, (os.cpu_count() or 2) // _WORKERS))))
# Inductor's kernels in a folder of this run's own (set before xdist starts its workers, which inherit it): in the
# shared /tmp/torchinductor_<user>, a benchmark compiling beside `make test` left a kernel's .so half written when a
# test loaded it ("file too short").
# Removed when the process that made it exits (the controller outlives its workers).
if "PYTEST_XDIST_WORKER" not in os.environ and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="ckpt-test-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

#: The CPU peaks every test's trace is priced with (NOTE [ CPU calibration ]): fixed, so that a plan a test
#: solves is the same on every machine and at any load. Measured on this project's development machines
#: (AMD EPYC, torch 2.13, one thread); tests of calibration itself pass their own cache folder and figures.
TEST_CPU_PEAKS = {
    "flops_per_s": {"float32": 96.7e9, "bfloat16": 48.0e9, "float16": 24.0e9},
    "bytes_per_s": 9.83e9,
    "op_overhead_s": 3.0e-6,
    "random_per_s": 1.0e8,
}


def _pin_cpu_peaks() -> None:
    if os.environ.get("CKPT_TEST_REAL_PEAKS"):  # opt out: price tests with this machine's own calibration
        return
    from scheduler.tracing.calibration import CACHE_ENV, cache_key

    folder = tempfile.mkdtemp(prefix="ckpt-test-peaks-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    entry = {"figures": TEST_CPU_PEAKS, "measured": TEST_CPU_PEAKS, "one_thread": TEST_CPU_PEAKS,
             "contended": [], "rounds": 1, "measured_at": "fixed for the tests (tests/conftest.py)",
             "pinned": True}  # never spot-checked against this machine
    entries = {cache_key(threads): entry for threads in range(1, max(os.cpu_count() or 1, 16) + 1)}
    with open(os.path.join(folder, "cpu_peaks.json"), "w", encoding="utf-8") as fh:
        json.dump(entries, fh)
    # NOTE [ Overhead calibration ]: plans in tests are chosen on recompute alone; tests of the overhead
    # terms inject their own figures on a graph (solvers.model.overheads.with_overheads).
    zero = {"figures": {"op_s": 0.0, "region_s": 0.0, "random_region_s": 0.0, "selective_op_s": 0.0,
                        "kept_call_s": 0.0, "chunk_s": 0.0, "recompute_op_s": 0.0, "gemm_rows": []},
            "measured_at": "fixed for the tests (tests/conftest.py)", "pinned": True}
    with open(os.path.join(folder, "plan_overheads.json"), "w", encoding="utf-8") as fh:
        json.dump({key: zero for key in entries}, fh)
    # NOTE [ Measured op classes ]: no class timed (a clock), the plain roofline; NOTE [ Chunk loops timed at
    # their shapes ]: no chunk loop timed either; NOTE [ Recompute timed in the step ]: nor the blocks' recompute
    with open(os.path.join(folder, "op_classes.json"), "w", encoding="utf-8") as fh:
        json.dump({"classes": [], "chunk_loops": False, "recompute_scale": False}, fh)
    os.environ[CACHE_ENV] = folder


_pin_cpu_peaks()
