import pytest
from cpu_stand_in import figures

from scheduler.tracing import calibration, overheads
from scheduler.tracing.calibration import CACHE_ENV


@pytest.fixture
def fake_cpu(monkeypatch, tmp_path):
    """No test using it measures this machine or writes into the user's cache: a stand-in
    (``cpu_stand_in.FAKE_CPU``) that records the thread count of each measurement, and a private cache folder."""
    calls = []

    def measure(threads):
        calls.append(threads)
        return figures()

    monkeypatch.setattr(calibration, "measure_cpu", measure)
    monkeypatch.setattr(calibration, "spot_cpu", lambda threads: figures())  # a stored entry's check agrees
    monkeypatch.setattr(calibration, "_CHECKED", set())
    # nor its plan overheads (NOTE [ Overhead calibration ]): zero figures, as every test's
    monkeypatch.setattr(overheads, "measure_overheads", lambda threads: {
        "op_s": 0.0, "region_s": 0.0, "random_region_s": 0.0, "selective_op_s": 0.0, "kept_call_s": 0.0,
        "chunk_s": 0.0, "recompute_op_s": 0.0, "gemm_rows": []})
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    # nor times op classes (NOTE [ Measured op classes ]), chunk loops or recompute: none, as every test's
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "op_classes.json").write_text('{"classes": [], "chunk_loops": false, "recompute_scale": false}', encoding="utf-8")
    return calls
