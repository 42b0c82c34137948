"""``dp`` under a wall-clock limit: the table its time allows, the compile of its kernel counted.

NOTE [ dp under a time limit ]
    ``dp``'s table holds every region ``i..j`` of its chain of stages, so its
    work (``solvers.dp.chain.fill_work``) is quadratic in the chain's length:
    2 * 10**8 units on a 20,000-node chain, about 400 s of an idle core for
    the compiled kernel, 10,000 s for the plain copy; such a chain once gave
    no answer in 200 s. ``dp(time_limit_s=...)`` (60 s by default, as
    ``ilp``) keeps its limit on the wall clock, as NOTE [ One deadline ] (in
    ``solvers.deadline``) says for ``ilp``:

    * the read-out (one ``simulate`` of the plan) is kept back, as there;
    * the kernel: where this process has no compiled kernel yet and the
      plain copy would take more than :data:`PLAIN_MAX_S`, numba is loaded
      (or compiled, about 10 s on a cold cache) in its thread and waited for
      at most :data:`KERNEL_SHARE` of what is left, so the compile counts
      against the limit; if it is not ready by then, the plain copy fills.
      Where numba's cache does not hold the kernel (``cache_is_warm``) and a
      compile (``solvers.dp.kernel.LOAD_S``, slowed by the load) does not fit
      that share, it is not started at all: a compile thread left running
      took the CPU from the fill and held the process's exit 1.7-3.5 s;
    * the table: where the whole table is more work than the kernel at hand
      does in :data:`FILL_SHARE` of what is left (at
      ``solvers.dp.kernel.WORK_PER_S``, slowed by the load the deadline has
      probed), regions are cut at the longest length ``L`` (in stages) whose
      table fits (linear in the chain: ``m * L``). The plan is then
      ``feasible``, optimal over the regions of at most ``L`` stages, which
      ``plan.findings["optimal_over"]`` says; where even ``L = 1`` does not
      fit, or the fill overruns anyway (it checks the deadline at every
      stage), the call raises :class:`~solvers.deadline.OutOfTime` naming
      the limit: no plan within N s.
    * an inexact table (common tensors) simulates its answers while time is
      left for one more pass.

    ``time_limit_s=None`` keeps the old behaviour: the whole table, however
    long it takes. Tests drive it with a fake clock and a stand-in compile
    (``tests/solvers/test_dp_limits.py``).
"""

from __future__ import annotations

import dataclasses
import logging

from graphs import Graph

from ..deadline import PASS_S_PER_NODE, Deadline, OutOfTime
from ..errors import InfeasibleBudget
from ..model.plan import Plan
from ..model.stages import stages
from . import kernel as dp_kernel
from .chain import dp_answer, dp_table, fill_work

__all__ = ["dp_within", "PLAIN_MAX_S", "KERNEL_SHARE", "FILL_SHARE", "FIRST_PASSES"]

log = logging.getLogger(__name__)

#: Seconds of plain-Python filling (an idle core) below which ``dp`` does not wait for numba's kernel.
PLAIN_MAX_S = 0.25
#: Share of the time left that ``dp`` waits for numba's kernel (import, load or compile).
KERNEL_SHARE = 0.5
#: Share of the time left (after the kernel and the read-out) the table's estimated work may take.
FILL_SHARE = 0.5
#: Passes over the graph before the table: its fingerprint (about two) and its stages; fewer left, no plan.
FIRST_PASSES = 3.0


def _longest(st, allowed: float) -> int:
    """The longest region length (in stages) whose table is at most ``allowed`` units of work (0: none)."""
    lo, hi = 0, max(1, len(st))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fill_work(st, mid) <= allowed:
            lo = mid
        else:
            hi = mid - 1
    return lo


def dp_within(graph: Graph, budget_bytes: int, deadline: Deadline, *, max_front: int | None, selective: bool,
              nested: bool, check: Graph | None = None) -> Plan:
    """``dp`` within ``deadline`` (NOTE [ dp under a time limit ]).

    Raises:
        OutOfTime: no plan within the limit.
        InfeasibleBudget: no plan the table holds fits (not proven when regions were cut).
    """
    n = len(graph)
    probed = PASS_S_PER_NODE * n * FIRST_PASSES > 0.1 * deadline.left()  # passes: a large part of what is left
    if probed:
        deadline.probe_load()
    if deadline.left() < FIRST_PASSES * deadline.pass_estimate(n) + deadline.read_out_s(n):  # as ilp's
        raise OutOfTime(f"dp: no plan within {deadline.limit_s:g} s: {deadline.left():.2g} s were left when it "
                        f"started, and one pass over this graph's {n} nodes takes about "
                        f"{deadline.pass_estimate(n):.2g} s here (a plan needs about {FIRST_PASSES + 1:g}); "
                        "raise time_limit_s (--time-limit)")
    t0 = deadline.clock()
    graph.fingerprint()  # the read-out needs it (two passes, seconds at 20,000 nodes on a loaded machine): timed
    if deadline.clock() - t0 > 0.01:
        deadline.pass_s = (deadline.clock() - t0) / 2
    st = stages(graph)
    work = fill_work(st)
    if not probed and work / dp_kernel.WORK_PER_S[True] > 0.1 * deadline.limit_s:  # a large part: how loaded?
        deadline.probe_load()
    keep = deadline.read_out_s(n)

    def avail() -> float:
        return deadline.left() - keep

    compiled = dp_kernel.compiled_ready()
    if not compiled and work * deadline.slowdown / dp_kernel.WORK_PER_S[False] > PLAIN_MAX_S:
        wait = max(0.0, KERNEL_SHARE * avail())
        if dp_kernel.LOAD_S[dp_kernel.cache_is_warm()] * deadline.slowdown <= wait:
            compiled = dp_kernel.wait_for_compiled(wait)
        else:  # a cold compile the limit cannot hold: not started (it would take the CPU and hold up the exit)
            log.info("dp: numba's kernel is not cached, and compiling it does not fit %.3g s", wait)
        log.info("dp: %s kernel after %.2f s", "numba's" if compiled else "the plain", deadline.elapsed())
    rate = dp_kernel.WORK_PER_S[compiled] / deadline.slowdown
    allowed = FILL_SHARE * avail() * rate
    max_len = None
    if work > allowed:
        # at least one-stage regions while the whole of what is left may fill them: the pace decides the rest
        max_len = max(_longest(st, allowed), 1 if fill_work(st, 1) <= avail() * rate else 0)
        if max_len < 1:
            raise OutOfTime(f"dp: no plan within {deadline.limit_s:g} s: not even its table of one-stage regions "
                            f"({fill_work(st, 1)} units of work) fits what is left"
                            + ("" if compiled else " for the plain-Python kernel (numba's was not loaded in time)")
                            + "; raise time_limit_s (--time-limit), or use ilp")
        log.info("dp: the whole table is %d units of work, more than %.3g s allow; regions of at most %d stages",
                 work, deadline.limit_s, max_len)
    try:
        table = dp_table(graph, max_front=max_front, selective=selective, nested=nested, max_len=max_len,
                         deadline=deadline.before(keep), adapt=max_len is not None)
    except OutOfTime:
        raise OutOfTime(f"dp: no plan within {deadline.limit_s:g} s: its table ({len(st)} stages"
                        + (f", regions of at most {max_len}" if max_len else "") + ") was not filled in time; "
                        "raise time_limit_s (--time-limit), or use ilp") from None
    try:
        plan = dp_answer(graph, table, budget_bytes, deadline, check=check)
    except InfeasibleBudget as exc:
        if not table.capped:
            raise
        raise exc.replace(proven=False, time_limit_s=deadline.limit_s,
                          scope=f"the plans whose regions span at most {table.max_len} stages (all that "
                                f"{deadline.limit_s:g} s allow)") from None
    if table.capped:
        plan = dataclasses.replace(plan, findings={**plan.findings, "optimal_over": f"regions of at most "
                                                   f"{table.max_len} stages (all that the time limit allows)"})
    return plan
