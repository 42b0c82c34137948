"""This machine's CPU peaks (NOTE [ CPU calibration ] in ``scheduler.tracing.calibration``).

Every measurement here is an injected function (the ``fake_cpu`` fixture, or
``measure=``): no test reads the clock or depends on how busy the machine is.
"""

import datetime
import json
import logging
import os
import platform

import pytest
import torch
from cpu_stand_in import FAKE_CPU
from cpu_stand_in import figures as _figures

from scheduler.cli import main
from scheduler.tracing import calibration
from scheduler.tracing.calibration import CACHE_ENV, cache_dir, calibrate, cpu_peaks, stored_calibrations



def _scripted(by_threads):
    """``measure(threads)`` returning the next scripted figures for that thread count."""
    calls = []

    def measure(threads):
        calls.append(threads)
        return by_threads[threads].pop(0)

    return measure, calls


# ---------------------------------------------------------------- robustness
def test_each_figure_is_the_best_of_the_rounds_alternating_with_one_thread():
    measure, calls = _scripted({2: [_figures(0.5, overhead=5e-6), _figures(2.0, overhead=4e-6)],
                                1: [_figures(1.0), _figures(0.9, overhead=2e-6)]})
    cal = calibrate(2, rounds=2, measure=measure)
    assert calls == [2, 1, 2, 1]  # N threads and one, alternating: a busy spell hits both
    assert cal.measured["flops_per_s"]["float32"] == 2.0e11 and cal.measured["op_overhead_s"] == 4e-6
    assert cal.one_thread["bytes_per_s"] == 2e10 and cal.one_thread["op_overhead_s"] == 2e-6
    assert cal.figures["flops_per_s"] == cal.measured["flops_per_s"] and cal.figures["op_overhead_s"] == 2e-6
    assert cal.contended == () and cal.rounds == 2


def test_a_busy_measurement_is_raised_to_the_one_thread_figure_and_reported(caplog):
    """The entry issue 23 found: 2-thread bf16 at 1.4 GFLOP/s, one thread 163.5."""
    measure, _ = _scripted({2: [_figures(1.0, bf16=1.4e9), _figures(1.0, bf16=1.2e9)],
                            1: [_figures(0.8, bf16=163.5e9), _figures(0.8, bf16=150e9)]})
    with caplog.at_level(logging.WARNING, logger="scheduler.tracing.calibration"):
        cal = calibrate(2, rounds=2, measure=measure)
    assert cal.measured["flops_per_s"]["bfloat16"] == 1.4e9
    assert cal.figures["flops_per_s"]["bfloat16"] == 163.5e9  # never below one thread
    assert cal.figures["flops_per_s"]["float32"] == 1e11  # above the one-thread figure: as measured
    assert cal.contended == ("flops_per_s.bfloat16",)
    assert "busy machine" in caplog.text and "ckpt calibrate" in caplog.text


def test_the_slow_kernel_classes_are_figures_like_the_others(fake_cpu):
    """NOTE [ Slow elementwise kernels ]: each class's bandwidth is the best of the rounds, raised to its
    one-thread figure, reported when contended, stored and used by the traces' peaks."""
    busy = _figures(2.0)
    busy["class_bytes_per_s"]["gelu"] = 1e8
    measure, _ = _scripted({2: [busy, _figures(0.4)], 1: [_figures(1.0), _figures(0.9)]})
    cal = calibrate(2, rounds=2, measure=measure)
    assert cal.measured["class_bytes_per_s"] == {"gelu": 2e9, "softmax": 8e9}  # best of the rounds
    assert cal.figures["class_bytes_per_s"] == {"gelu": 5e9, "softmax": 8e9}  # gelu raised to one thread's
    assert cal.contended == ("class_bytes_per_s.gelu",)
    peaks = cpu_peaks(threads=3)
    assert peaks.class_bytes_per_s == {"gelu": 5e9, "softmax": 4e9}
    assert cpu_peaks(threads=3) == peaks  # as stored


def test_slightly_below_one_thread_is_raised_but_not_contended():
    measure, _ = _scripted({2: [_figures(0.9)], 1: [_figures(1.0)]})
    cal = calibrate(2, rounds=1, measure=measure)
    assert cal.figures["bytes_per_s"] == 2e10 and cal.contended == ()


def test_one_thread_is_measured_once_per_round_and_is_its_own_floor():
    measure, calls = _scripted({1: [_figures(1.0), _figures(3.0)]})
    cal = calibrate(1, rounds=2, measure=measure)
    assert calls == [1, 1] and cal.one_thread == cal.measured == cal.figures
    with pytest.raises(calibration.CkptError, match="rounds >= 1"):
        calibrate(1, rounds=0, measure=measure)


# -------------------------------------------------------------------- storage
def test_stored_per_machine_and_thread_count_with_its_date(fake_cpu, monkeypatch, tmp_path):
    monkeypatch.setattr(platform, "node", lambda: "box-a")
    two = cpu_peaks(threads=2)
    assert fake_cpu == [2, 1, 2, 1]  # two rounds on first use
    assert cpu_peaks(threads=2) == two and len(fake_cpu) == 4  # read back, not measured
    cpu_peaks(threads=1)
    monkeypatch.setattr(platform, "node", lambda: "box-b")  # another machine sharing the home folder
    cpu_peaks(threads=2)
    entries = stored_calibrations()
    assert len(entries) == 3 and len(fake_cpu) == 4 + 2 + 4
    key = next(k for k in entries if k.startswith("box-a") and "| 2 threads |" in k)
    assert torch.__version__ in key
    entry = entries[key]
    datetime.datetime.fromisoformat(entry["measured_at"])  # a date, whatever it is
    assert entry["rounds"] == 2 and entry["contended"] == [] and entry["one_thread"]["bytes_per_s"] == 2e10
    assert two.source == f"measured on this machine ({key}) on {entry['measured_at']}"
    assert two.name.endswith("2 threads)")


def test_refresh_measures_again(fake_cpu):
    cpu_peaks(threads=1)
    cpu_peaks(threads=1, refresh=True, rounds=3)
    assert fake_cpu == [1, 1, 1, 1, 1]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "CORRUPT_ENTRY", "OLD_FORMAT"])
def test_a_corrupt_or_old_entry_is_measured_again_and_rewritten(tmp_path, fake_cpu, content):
    path = tmp_path / "cache" / "cpu_peaks.json"
    cpu_peaks(threads=1)
    entries = json.loads(path.read_text())
    if content == "CORRUPT_ENTRY":
        for v in entries.values():
            v["figures"]["bytes_per_s"] = -5
        content = json.dumps(entries)
    elif content == "OLD_FORMAT":  # a flat entry under this key, as version 3 wrote them
        content = json.dumps({k: {**FAKE_CPU, "source": "measured"} for k in entries})
    path.write_text(content)
    assert cpu_peaks(threads=1).bytes_per_s == 2e10 and len(fake_cpu) == 4
    assert cpu_peaks(threads=1).bytes_per_s == 2e10 and len(fake_cpu) == 4  # the rewritten file is good


def test_cache_folder_argument_environment_and_xdg(tmp_path, monkeypatch, fake_cpu):
    cpu_peaks(cache=tmp_path / "mine", threads=1)
    assert (tmp_path / "mine" / "cpu_peaks.json").exists()
    assert cache_dir() == str(tmp_path / "cache")
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == os.path.join(str(tmp_path / "xdg"), "ckpt")


# ------------------------------------------------------------------- spot check
def _store(entry_figures, pinned=False):
    """A stored one-thread entry with ``entry_figures``, as a busy first calibration left it."""
    path = os.path.join(cache_dir(), "cpu_peaks.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    entry = {"figures": entry_figures, "measured": entry_figures, "one_thread": entry_figures, "contended": [],
             "rounds": 2, "measured_at": "2026-12-02T22:10:35", **({"pinned": True} if pinned else {})}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({calibration.cache_key(1): entry}, fh)


def test_a_stored_entry_from_a_busy_machine_is_measured_again_once_checked(fake_cpu, caplog):
    """The entry this project's machine had: copy bandwidth 3.9 GB/s where an idle one measures 16-26."""
    busy = _figures(1.0)
    busy["bytes_per_s"] = 3.9e9
    busy["flops_per_s"]["bfloat16"] = 3e11  # above what the new rounds measure: kept
    _store(busy)
    spots = []
    check = lambda threads: spots.append(threads) or _figures(1.0)  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="scheduler.tracing.calibration"):
        peaks = cpu_peaks(threads=1, check=check)
    assert spots == [1] and fake_cpu == [1, 1]  # checked, then two rounds
    assert peaks.bytes_per_s == 2e10 and peaks.peak("bfloat16") == 3e11  # each rate the best of old and new
    assert "busy machine" in caplog.text and "bytes_per_s 3.9e+09 stored, 2e+10 now" in caplog.text
    stored = stored_calibrations()[calibration.cache_key(1)]
    assert stored["figures"]["bytes_per_s"] == 2e10 and stored["measured_at"] != "2026-12-02T22:10:35"
    assert cpu_peaks(threads=1, check=check).bytes_per_s == 2e10 and spots == [1] and fake_cpu == [1, 1]


def test_a_stored_entry_close_to_the_check_is_kept_and_checked_once_per_process(fake_cpu):
    _store(_figures(0.6))  # 60 % of what the check measures: within STALE_BELOW
    spots = []
    check = lambda threads: spots.append(threads) or _figures(1.0)  # noqa: E731
    first = cpu_peaks(threads=1, check=check)
    assert first.bytes_per_s == 0.6 * 2e10 and spots == [1] and fake_cpu == []
    assert cpu_peaks(threads=1, check=check) == first and spots == [1]  # once per process
    calibration._CHECKED.clear()  # another process checks again
    cpu_peaks(threads=1, check=check)
    assert spots == [1, 1] and fake_cpu == []


def test_a_pinned_entry_is_never_checked(fake_cpu):
    _store(_figures(0.01), pinned=True)
    check = lambda threads: pytest.fail("a pinned entry was checked")  # noqa: E731
    assert cpu_peaks(threads=1, check=check).bytes_per_s == 0.01 * 2e10 and fake_cpu == []


# ------------------------------------------------------------------------ CLI
def test_ckpt_calibrate_measures_stores_and_shows(fake_cpu, capsys, monkeypatch):
    assert main(["calibrate", "--help"]) == 0 and "one-thread" in capsys.readouterr().out
    assert main(["calibrate", "--show"]) == 0 and "nothing stored" in capsys.readouterr().out
    assert main(["calibrate", "--threads", "2", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert fake_cpu == [2, 1, 2, 1] and "best of 2 rounds: consistent with one thread" in out
    assert "matmul bfloat16" in out and "200 GFLOP/s" in out and "cpu_peaks.json" in out
    gelu = next(line for line in out.splitlines() if "gelu bandwidth" in line)
    assert gelu.split() == ["gelu", "bandwidth"] + ["5", "GB/s"] * 3, gelu
    busy = _figures(1.0, bf16=1e9)
    monkeypatch.setattr(calibration, "measure_cpu", lambda threads: busy if threads > 1 else _figures())
    assert main(["calibrate", "--threads", "2", "--rounds", "1"]) == 0
    assert "CONTENDED (flops_per_s.bfloat16" in capsys.readouterr().out
    assert main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert "| 2 threads |" in out and "measured " in out and "CONTENDED" in out


def test_ckpt_calibrate_with_a_cache_it_cannot_write_says_so_in_one_line(fake_cpu, capsys, monkeypatch, tmp_path):
    """Issue 33: ``ckpt calibrate --cache <read-only dir>`` ended in a KeyError traceback."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    assert main(["calibrate", "--cache", str(not_a_folder), "--rounds", "1"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cache folder" in err[0] and "--cache DIR" in err[0] and "Traceback" not in err[0]
    assert fake_cpu == []  # refused before measuring
    # A folder that looks writable but takes no file (a read-only mount seen as root): measured, then one line.
    monkeypatch.setattr(calibration, "write_text_atomic", lambda *a, **k: (_ for _ in ()).throw(OSError(30, "ro")))
    assert main(["calibrate", "--cache", str(tmp_path / "ro"), "--rounds", "1"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not be stored" in err[0] and "KeyError" not in err[0]
