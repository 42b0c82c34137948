"""The GPU suite's logic (``benchmarks.cuda``), run on the CPU on a tiny model: a suite that only runs where a
GPU is lent must not rot between such sessions.

On the tiny ResNet (BatchNorm), one step of each side from the same state: our plans' gradients and running
statistics equal the plain step's, every plan measures at or under its prediction, and the naive per-block
checkpoint the suite measures as "theirs" updates the running statistics twice (the finding its buffers
column shows on the GPU page: 1.3 on ResNet-50).
"""

from __future__ import annotations

import torch

from benchmarks import cuda


def test_the_gpu_suite_runs_its_checks_on_the_cpu():
    (case,) = [c for c in cuda.cases(tiny=True) if c.name == "resnet"]
    res = cuda.run_case(case, torch.device("cpu"), 1)
    assert not res["errors"], res["errors"]
    assert res["plain_peak"] == res["plain_predicted"]
    labels = [p["label"] for p in res["plans"]]
    assert labels[:2] == ["pick at their peak", "least budget"]
    for p in res["plans"][:2]:  # planned for this device: at or under the prediction, gradients and buffers exact
        assert p["measured"] <= p["predicted"], p
        assert p["grad"] <= 1e-6 and p["stats"] == 0.0, p
    assert res["plans"][0]["measured"] <= res["their_peak"]
    assert res["their_stats"] > 0  # checkpoint() around each block ran each BatchNorm's update twice
    assert res["noise"] == 0.0 and res["noise_stats"] == 0.0
    assert set(res["times"]) == {"plain", "theirs", *labels}
    assert res["meta_plain_predicted"] > 0  # the meta trace ran (for an H100 here: its peak is not the CPU's)
    assert isinstance(res["meta_on_card"], int) and res["meta_on_card"] > 0  # its plan, predicted by the CPU's trace
    res["dispatch"] = [("fp32, GQA", "math", "math"), ("bf16", "cudnn", "flash")]  # as dispatch_table gives on a GPU
    text = "\n".join(cuda.page([res], [], "the CPU", 1.0))
    assert "| resnet | pick at their peak |" in text and "## Time" in text and "## Planned with no GPU" in text
    assert "1 of 2 agree" in text


def test_the_random_modules_part_runs_on_the_cpu_and_its_table_counts_requested_bytes():
    """``run_generated`` steps one random module's plans (on the CPU here: no requested bytes); on a GPU each pair
    also has the bytes requested, which the table counts against the prediction beside the allocator's peak."""
    from benchmarks.generated import Row, failures, table
    from benchmarks.random_plans import Outcome

    gen = cuda.run_generated(torch.device("cpu"), 1)
    assert gen["seeds"] == 1 and gen["pairs"] > 0 and not gen["untraced"]
    assert "requested" not in gen["table"][0]
    assert gen["failures"] == ["Every pair ran, measured at or under its prediction and matched the unplanned step."]
    text = "\n".join(cuda._generated_section(gen))
    assert "## Random modules on the card" in text and f"{gen['pairs']} (module, plan) pairs" in text

    # as on a GPU: the allocator rounds up (over), the requested bytes stay under, except in one pair
    rows = [Row("m", "regions", "held", "regions a", Outcome(predicted=1000, allocator=1536, equal=True, requested=990)),
            Row("m", "regions", "held", "regions b", Outcome(predicted=1000, allocator=1536, equal=True, requested=1010))]
    lines = table(rows)
    assert "requested at or under prediction" in lines[0]
    assert lines[-1].startswith("| all | 2 | 2 | 0 | +536 B") and "| 1 | +10 B | 2 |" in lines[-1], lines[-1]
    listed = failures(rows)
    assert len(listed) == 3 and "regions b" in listed[2] and "(requested 1,010)" in listed[2]
    assert failures(rows[:1]) == ["Every pair ran, requested at or under its prediction and matched the unplanned "
                                  "step."]


def test_a_plan_is_carried_to_another_trace_of_its_model_by_module_paths():
    """The page's "meta trace's plan predicted by the card's trace": a chunked plan with regions,
    from a ``meta`` trace onto the CPU's (which has forward holds the meta trace has not: other positions)."""
    import scheduler
    from solvers.model.chunks import expand

    (case,) = [c for c in cuda.cases(tiny=True) if c.name == "llama"]
    torch.manual_seed(0)
    model = case.build().train()
    args, kwargs = case.inputs(torch.device("cpu"))
    graph = scheduler.trace(model, args, kwargs, loss=case.loss, target="H100")
    mgraph = cuda._meta_graph(case, torch.device("cpu"), "H100")
    least = cuda._least(mgraph, True)
    plan = scheduler.solve(mgraph, int(least * 1.05), "ilp", time_limit_s=10, **cuda._menus(mgraph, True))
    assert plan.chunks and plan.regions, plan
    moved = cuda.carry_plan(plan, mgraph, graph)
    assert moved.modules == plan.modules and moved.chunk_modules == plan.chunk_modules
    work, theirs = expand(mgraph, plan.chunks), expand(graph, moved.chunks)
    assert [work.nodes[i].name for i in plan.saved] == [theirs.nodes[i].name for i in moved.saved]
    assert cuda._on_card(plan, mgraph, graph) == scheduler.simulate(graph, moved).peak_bytes
    back = cuda.carry_plan(moved, graph, mgraph)
    assert back.regions == plan.regions and back.saved == plan.saved and back.chunks == plan.chunks
