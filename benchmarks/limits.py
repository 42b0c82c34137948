"""Time limits that hold: ``ckpt solve --time-limit N`` cold, idle and at a load of 8.

For each graph (a 700-node random DAG, a 5,000-node wide random DAG, chains
of 20,000 and 100,000 nodes, the Llama-2-7B op graph of
``benchmarks/scale.py``) and each limit (1, 5 and 60 s), ``ckpt solve GRAPH
--budget F --time-limit N -o plan.json`` runs as the program in a fresh
process with an empty numba cache (``NUMBA_CACHE_DIR`` a new folder: the dp
kernel is not compiled yet), once with nothing else of ours running ("idle")
and once with :data:`BUSY_LOOPS` busy-looping processes ("load 8"). Per
run: the solver call's wall time (timed around ``solvers.solve``, to the plan
costed by ``simulate`` or the error), the whole command's wall time from
outside (the process started to the process ended: Python's start, imports,
reading the graph, printing, the exit; the promise is N, NOTE [ The
command's time limit ] in ``scheduler.commands.limits``), status, the
set it is optimal over, the answer (recompute as % of the step's FLOPs), the
method that answered, and the process's peak resident memory (``VmHWM``).
Whether the answer is the same idle and busy is checked wherever the status
is ``optimal``. Writes ``benchmarks/results/limits.md`` and ``limits.json``,
with the commit it ran on.

``python -m benchmarks.run --only limits`` (``--quick``: the DAG and a 2,000-node
chain, limits 1 and 5 s).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time

from benchmarks.pages import out_dir, write_page

log = logging.getLogger("benchmarks.limits")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMITS = (1, 5, 60)
#: (name, synthetic family and size, or None for the Llama-2-7B op graph, budget as a fraction of store-all's
#: activations): the DAG at 0.8, where the fast solvers find a plan (below 0.7 only CP-SAT may).
GRAPHS = [("random-dag 700", ("random-dag", 700), 0.8), ("random-dag 5,000", ("random-dag", 5_000), 0.8),
          ("chain 20,000", ("chain", 20_000), 0.3), ("chain 100,000", ("chain", 100_000), 0.3),
          ("Llama-2-7B op graph", None, 0.3)]
QUICK = [("random-dag 700", ("random-dag", 700), 0.8), ("chain 2,000", ("chain", 2_000), 0.3)]
BUSY = "while True: pass"
#: The child process: ``ckpt``'s limit armed first, as ``scheduler.__main__`` arms it, then :func:`_child`. Run as
#: ``python -m benchmarks.limits --child`` it imported this module's imports before arming (``benchmarks.pages``'s
#: ``importlib.metadata``: 1.2 s at a load of 8), and a 1 s limit answered after 1.9-2.4 s where ``ckpt`` took 0.9 s.
CHILD = ("import sys; from scheduler import launch; launch.arm(['solve', '--time-limit', sys.argv[3]]); "
         "from benchmarks.limits import _child; _child(*sys.argv[1:])")
#: Busy-looping processes for the loaded runs (a load of 8 on top of whatever else runs).
BUSY_LOOPS = 8


def _vm(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _child(graph_path: str, fraction: str, limit: str, plan_path: str) -> None:
    """In this process: ``ckpt solve`` as the program runs it (its limit counted from the process's start, its
    end without Python's teardown); prints, as ``main`` returns, its exit status, the solver call's wall time
    (with or without a plan: ``solvers.solve`` timed from outside) and the peak memory. :data:`CHILD` has armed
    the limit before, as ``ckpt`` (``scheduler.__main__.program``) does before it imports the project."""
    sys.argv = ["ckpt", "solve", graph_path, "--budget", fraction, "--time-limit", limit, "-o", plan_path]
    import solvers
    from scheduler import cli

    real, calls = solvers.solve, []

    def timed(*args, **kwargs):  # what the time limit promises: the solver call, read-out included
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - t)

    solvers.solve = timed
    main = cli.main

    def reported(argv=None) -> int:  # noqa: ANN001
        rc = main(argv)
        print(json.dumps({"rc": rc, "solve_s": round(sum(calls), 3), "peak_rss_bytes": _vm("VmHWM")}), flush=True)
        return rc

    cli.main = reported
    cli.program()


def _graph_file(name: str, spec, folder: str) -> str:
    path = os.path.join(folder, name.replace(" ", "_").replace(",", "") + ".json")
    if spec is None:  # the Llama-2-7B op graph, traced on the meta device (benchmarks/scale.py)
        from benchmarks.scale import _trace

        return _trace("hf:llama-2-7b", {"seq": 4096}, folder)["paths"]["op"]
    from graphs import save, synthetic

    save(synthetic.make(*spec), path)
    return path


def _run(graph_path: str, fraction: float, limit: int, busy: bool, folder: str) -> dict:
    plan_path = os.path.join(folder, "plan.json")
    if os.path.exists(plan_path):
        os.remove(plan_path)
    env = {**os.environ, "NUMBA_CACHE_DIR": tempfile.mkdtemp(prefix="numba-", dir=folder)}  # cold: nothing compiled
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(BUSY_LOOPS)] if busy else []
    try:
        time.sleep(1.0 if busy else 0.0)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, graph_path, str(fraction), str(limit), plan_path],
                              capture_output=True, text=True, cwd=ROOT, env=env, check=False)
        command_s = time.perf_counter() - t0
    finally:
        for p in loops:
            p.kill()
            p.wait()
    row: dict = {"limit_s": limit, "busy": busy, "load_1min": round(load, 1), "command_s": round(command_s, 3)}
    try:
        row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        row.update(rc=proc.returncode, error=proc.stderr.strip().splitlines()[-1:] or ["no output"])
        return row
    if row["rc"] != 0 or not os.path.exists(plan_path):
        row["error"] = proc.stderr.strip().splitlines()[-1:] or [f"exit {row['rc']}"]
        return row
    with open(plan_path) as fh:
        plan = json.load(fh)
    findings = plan.get("findings", {})
    row.update(status=plan["status"], recompute_flops=plan["recompute_flops"],
               peak_bytes=plan["peak_bytes"], budget_bytes=plan["budget_bytes"], kept=len(plan.get("saved", ())),
               optimal_over=findings.get("optimal_over", ""), method=findings.get("method", ""),
               incumbent=findings.get("incumbent", ""),
               gap=plan.get("gap"))
    return row


def main(quick: bool = False) -> None:
    from graphs import load

    results = []
    with tempfile.TemporaryDirectory(prefix="ckpt-limits-") as folder:
        for name, spec, fraction in (QUICK if quick else GRAPHS):
            path = _graph_file(name, spec, folder)
            g = load(path)
            step = g.total_fwd_flops() + g.total_bwd_flops()
            info = {"graph": name, "nodes": len(g), "fraction": fraction, "step_flops": step, "rows": []}
            del g
            for limit in ((1, 5) if quick else LIMITS):
                for busy in (False, True):
                    row = _run(path, fraction, limit, busy, folder)
                    if "recompute_flops" in row:
                        row["overhead_pct"] = 100 * row["recompute_flops"] / step
                    log.info("%s, %s s, %s: %s", name, limit, "busy" if busy else "idle", row)
                    info["rows"].append(row)
            results.append(info)
    meta = {"cpus": os.cpu_count(), "machine": platform.processor() or platform.machine()}
    with open(out_dir(quick) / "limits.json", "w") as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=1)
    _write(meta, results, quick)


def _cell(r: dict) -> str:
    if "error" in r:
        return "no plan: " + r["error"][0].removeprefix("ckpt solve: error: ")[:120]
    over = (f" over {r['optimal_over']}" if r["status"] == "optimal" else f" (optimal over {r['optimal_over']})") \
        if r["optimal_over"] else ""
    kept = f", {r['kept']} kept" if r["kept"] else ""
    via = r["method"] + (f", {r['incumbent']}'s plan" if r.get("incumbent") else "")
    return f"{r['status']}{over}: {r['overhead_pct']:.2f}%{kept} ({via})"


def _write(meta: dict, results: list[dict], quick: bool) -> None:
    lines = ["The 1-minute load average before each run is in the table: \"idle\" means none of ours running, not "
             "an idle machine. Each run "
             "is `ckpt solve GRAPH --budget F --time-limit N -o plan.json` run as the program in a fresh process "
             "with an empty numba cache (`NUMBA_CACHE_DIR` a new folder), the default solver (`ilp`, regions and "
             f"kept nodes), idle and with {BUSY_LOOPS} busy-looping processes (\"load 8\"). solve: the solver "
             "call's wall time, to the plan costed by `simulate` or the error; command: the whole command timed "
             "from outside (Python's start, imports, reading the graph, printing, the exit: the promise is N, "
             "NOTE [ The command's time limit ]). "
             "Answer: recompute FLOPs as % of the step's FLOPs, the nodes kept, and the method that answered. "
             "Memory: the process's peak resident memory (`VmHWM`).", ""]
    lines += ["| graph, budget F | limit | load | solve | command | status and answer | memory |",
              "|---|---|---|---|---|---|---|"]
    same_rows = []
    for r in results:
        for row in r["rows"]:
            solve = f"{row['solve_s']:.2f} s" if "solve_s" in row else "—"
            lines.append(f"| {r['graph']} ({r['nodes']} nodes), {r['fraction']} | {row['limit_s']} s, "
                         f"{'load 8' if row['busy'] else 'idle'} | {row['load_1min']} | {solve} | "
                         f"{row.get('command_s', 0):.2f} s | {_cell(row)} | "
                         f"{row.get('peak_rss_bytes', 0) / 2**20:.0f} MiB |")
        for limit in sorted({row["limit_s"] for row in r["rows"]}):
            idle, busy = (next(x for x in r["rows"] if x["limit_s"] == limit and x["busy"] == b) for b in (False, True))
            if idle.get("status") == "optimal" or busy.get("status") == "optimal":
                same = idle.get("recompute_flops") == busy.get("recompute_flops")
                same_rows.append(f"{r['graph']} at {limit} s: {'the same' if same else 'DIFFERENT'} "
                                 f"({idle.get('status', 'no plan')} idle, {busy.get('status', 'no plan')} busy)")
    over = [row["command_s"] - row["limit_s"] for r in results for row in r["rows"] if "command_s" in row]
    lines += ["", f"Largest overrun of the limit by the command: {max(over):+.2f} s." if over else "",
              "", "Same answer idle and busy where a status is `optimal`: " + ("; ".join(same_rows) or "none optimal")
              + "."]
    write_page("limits.md", "Time limits that hold", lines, quick=quick)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main(quick="--quick" in sys.argv)
