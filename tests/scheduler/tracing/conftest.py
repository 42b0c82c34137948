import pytest
from cpu_stand_in import figures

from scheduler.tracing import calibration
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
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return calls
