"""``ckpt calibrate``: measure this machine's CPU peaks for the roofline again, or show what is stored."""

from __future__ import annotations

import argparse

from ..report import table
from .common import positive_int

NAME = "calibrate"
HELP = "measure this CPU's roofline peaks again (matmul FLOP/s, bandwidth, per-op cost) and store them"
DESCRIPTION = """Measure the peaks a trace for the CPU is priced with (NOTE [ CPU calibration ]):
matmul FLOP/s per dtype, copy bandwidth, the bandwidth of the elementwise
kernels a CPU runs below it (GELU, softmax...: NOTE [ Slow elementwise
kernels ]), random draws per second and the fixed cost of one small op, best of
--rounds measurements. With more than one thread
the rounds alternate with one-thread rounds: a figure measured below its
one-thread value (a busy machine) is raised to it, and one below half of it is
reported as contended; run again on an idle machine.

The result is stored per machine, CPU model, torch version and thread count,
with its date, in the cache folder ($CKPT_CACHE_DIR, else ~/.cache/ckpt);
traces read it from there. The first trace on a machine calibrates by itself
(two rounds); this command measures again.

examples:
  ckpt calibrate                 # torch's thread count, three rounds
  ckpt calibrate --threads 1
  ckpt calibrate --show          # what is stored, with dates"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch intra-op threads to measure for (default: torch's, as traces use)")
    p.add_argument("--rounds", type=positive_int, default=3, help="measurements at each thread count (default 3)")
    p.add_argument("--show", action="store_true", help="list the stored calibrations and measure nothing")
    p.add_argument("--cache", default=None, metavar="DIR", help="the cache folder (default: $CKPT_CACHE_DIR, "
                   "else $XDG_CACHE_HOME/ckpt, else ~/.cache/ckpt)")


def _rate(v: float | None, unit: str) -> str:
    return "" if v is None else f"{v / 1e9:.3g} G{unit}"


def _rows(entry: dict) -> list[tuple]:
    used, measured, one = entry["figures"], entry["measured"], entry["one_thread"]
    rows = [(f"matmul {dt}", _rate(measured["flops_per_s"].get(dt), "FLOP/s"),
             _rate(one["flops_per_s"].get(dt), "FLOP/s"), _rate(v, "FLOP/s"))
            for dt, v in sorted(used["flops_per_s"].items())]
    rows.append(("copy bandwidth", _rate(measured["bytes_per_s"], "B/s"), _rate(one["bytes_per_s"], "B/s"),
                 _rate(used["bytes_per_s"], "B/s")))
    for cls, v in sorted(dict(used.get("class_bytes_per_s") or {}).items()):
        rows.append((f"{cls} bandwidth", _rate(dict(measured.get("class_bytes_per_s") or {}).get(cls), "B/s"),
                     _rate(dict(one.get("class_bytes_per_s") or {}).get(cls), "B/s"), _rate(v, "B/s")))
    rows.append(("random draws", _rate(measured.get("random_per_s"), "/s"), _rate(one.get("random_per_s"), "/s"),
                 _rate(used.get("random_per_s"), "/s")))
    rows.append(("per-op overhead", f"{measured['op_overhead_s'] * 1e6:.3g} us", f"{one['op_overhead_s'] * 1e6:.3g} us",
                 f"{used['op_overhead_s'] * 1e6:.3g} us"))
    return rows


def _report(key: str, entry: dict) -> str:
    threads = key.split(" | ")[-2] if " | " in key else "?"
    verdict = (f"CONTENDED ({', '.join(entry['contended'])} below half the one-thread figure): run again on an idle "
               "machine" if entry.get("contended") else "consistent with one thread")
    head = f"{key}\nmeasured {entry['measured_at']}, best of {entry['rounds']} rounds: {verdict}"
    return head + "\n" + table(_rows(entry), ["", threads, "1 thread", "used"])


def run(args: argparse.Namespace) -> int:
    import os

    from ..tracing.calibration import cache_dir, cache_key, cpu_peaks, stored_calibrations

    if args.show:
        entries = stored_calibrations(args.cache)
        if not entries:
            print(f"nothing stored in {cache_dir(args.cache)} (a trace for the CPU, or `ckpt calibrate`, stores one)")
            return 0
        for key, entry in sorted(entries.items()):
            try:
                print(_report(key, entry) + "\n")
            except (KeyError, TypeError, AttributeError):
                print(f"{key}\n(an entry of an older calibration; it is measured again when used)\n")
        return 0
    import torch

    from graphs import CkptError

    folder = cache_dir(args.cache)
    way_out = "pass --cache DIR with a folder you can write, or set $CKPT_CACHE_DIR"
    try:  # before minutes of measuring: the figures are measured to be stored
        os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK)
    except OSError as exc:
        raise CkptError(f"cannot use {folder} as the cache folder ({exc.strerror or exc}); {way_out}") from None
    if not writable:
        raise CkptError(f"the cache folder {folder} is not writable; {way_out}")
    threads = args.threads or torch.get_num_threads()
    cpu_peaks(cache=args.cache, refresh=True, threads=threads, rounds=args.rounds)
    key = cache_key(threads)
    entry = stored_calibrations(args.cache).get(key)
    if entry is None:  # cpu_peaks only warns when it cannot write (a trace goes on without the cache)
        raise CkptError(f"the CPU peaks were measured but could not be stored in {folder}; {way_out}")
    print(_report(key, entry))
    print(f"stored in {os.path.join(folder, 'cpu_peaks.json')}")
    from ..tracing.overheads import cpu_overheads  # NOTE [ Overhead calibration ]

    o = cpu_overheads(cache=args.cache, refresh=True, threads=threads, rounds=args.rounds)
    print("plan overheads: " + ", ".join(f"{name} {1e6 * getattr(o, name):.1f} us" for name in
                                         ("region_s", "random_region_s", "selective_op_s", "kept_call_s", "chunk_s",
                                          "op_s")))
    print(f"stored in {os.path.join(folder, 'plan_overheads.json')}")
    return 0
