"""The composition matrix of issue 33: every plan kind x every workflow x every model family.

Each cell applies a plan made by the real solvers onto a tiny transformers model configured by default
and runs a workflow on it and on an unplanned twin (same weights, seeds, inputs): the results agree
bitwise, or within ``composition.CHUNKED_RTOL`` where a chunked plan reassociates a sum, or ``apply``
refuses at once in one line that names the way out (``REFUSED``). Cells that fail for a reason another
part of issue 33 fixes are strict xfails naming the item. DDP and FSDP2 with a plan applied are
``test_apply_distributed.py``'s (not repeated here); peft's LoRA cells run where peft imports.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

import composition  # noqa: E402  (tests/ is on pytest's pythonpath)
import scheduler  # noqa: E402
from composition import FAMILIES, KINDS, WORKFLOWS, agree, applies, build, make_plan, tolerance  # noqa: E402
from graphs import CkptError  # noqa: E402
from scheduler.measuring.steps import allocator_step_peak  # noqa: E402

composition.use(transformers)

#: (family, kind) -> the one-line refusal, matched: a cell that cannot work is refused by the solver or by apply
#: before any step. A chunked head runs only on causal and masked LMs, whose loss it knows
#: (NOTE [ Which heads run in chunks ]): the menu leaves an image classifier's head whole and says so; the CNN has no other row-wise call,
#: and the ViT's MLPs in chunks cannot go below the floor its patch embedding's backward sets.
REFUSED: dict[tuple[str, str], str] = {
    ("cnn", "chunked"): r"ResNetForImageClassification is neither .*the MLPs are not chunked",
    ("vit", "chunked"): r"no plan fits a budget of .* the least feasible budget is .* Raise the budget",
}

#: (family or "*", kind or "*", workflow or "*") -> why the cell fails today, naming the part of issue 33 that
#: fixes it, and the exception it fails with (any other failure of the cell is a failure).
XFAIL: dict[tuple[str, str, str], tuple[str, Any]] = {
}


def _xfail(family: str, kind: str, workflow: str) -> list:
    """The strict expected-failure mark of a cell, or none."""
    for (f, k, w), (reason, raises) in XFAIL.items():
        if f in ("*", family) and k in ("*", kind) and w in ("*", workflow):
            return [pytest.mark.xfail(strict=True, reason=reason, raises=raises)]
    return []


def _cells():
    for family in FAMILIES:
        for kind in KINDS:
            if (family, kind) in REFUSED:
                continue
            for workflow in WORKFLOWS:
                if not applies(family, kind, workflow):
                    continue
                yield pytest.param(family, kind, workflow, id=f"{family}-{kind}-{workflow}",
                                   marks=_xfail(family, kind, workflow))


class _Cache:
    """Models, graphs, plans and the unplanned twins' results, each made once for the module."""

    def __init__(self) -> None:
        self.models: dict = {}
        self.graphs: dict = {}
        self.plans: dict = {}
        self.plain: dict = {}

    def model(self, family):
        if family not in self.models:
            self.models[family] = build(family)
        return self.models[family]

    def graph(self, family):
        if family not in self.graphs:
            model, batch = self.model(family)
            self.graphs[family] = scheduler.trace(copy.deepcopy(model), (), batch, loss=composition.loss_of)
        return self.graphs[family]

    def plan(self, family, kind):
        if (family, kind) not in self.plans:
            self.plans[family, kind] = make_plan(family, kind, self.graph(family))
        return self.plans[family, kind]

    def reference(self, family, workflow):
        if (family, workflow) not in self.plain:
            model, batch = self.model(family)
            self.plain[family, workflow] = WORKFLOWS[workflow](copy.deepcopy(model), dict(batch), family)
        return self.plain[family, workflow]


@pytest.fixture(scope="module")
def cache():
    """One intra-op thread while the matrix runs: its steps are tiny, and on a busy machine two threads
    spinning for each op made the file 20 times slower (both the planned and the plain step run so)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _Cache()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("family,kind,workflow", list(_cells()))
def test_cell(cache, family, kind, workflow):
    base, batch = cache.model(family)
    plan = cache.plan(family, kind)
    model = scheduler.apply(copy.deepcopy(base), plan)
    if workflow == "peak":  # the held step by the allocator, at or under the plan's prediction
        predicted = scheduler.simulate(cache.graph(family), plan).peak_bytes
        assert allocator_step_peak(model, model, (), batch, composition.loss_of) <= predicted
        return
    got = WORKFLOWS[workflow](model, dict(batch), family)
    agree(got, cache.reference(family, workflow), tolerance(kind, workflow), f"{family}-{kind}-{workflow}")


@pytest.mark.parametrize("family,kind", [pytest.param(f, k, id=f"{f}-{k}-refused") for f, k in sorted(REFUSED)])
def test_refused_at_once_in_one_line(cache, family, kind):
    """Refused before any step, by the solver or by apply, in one line that says what to do."""
    base, _ = cache.model(family)
    with pytest.raises(CkptError, match=REFUSED[family, kind]) as info:
        scheduler.apply(copy.deepcopy(base), make_plan(family, kind, cache.graph(family)))
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------- peft (where it imports)
@pytest.fixture(scope="module")
def lora_cache():
    return {}


@pytest.mark.parametrize("family,kind", [pytest.param(f, k, id=f"{f}-{k}-peft")  # all pass (torch 2.14.1, peft 0.21)
    for f in FAMILIES for k in KINDS if (f, k) not in REFUSED and (f, k) not in composition.NOT_USED])
def test_peft_lora(cache, lora_cache, family, kind):
    """peft's LoRA around the model, traced and planned as a user would, one held step against the twin."""
    pytest.importorskip("peft")
    base, batch = cache.model(family)
    if family not in lora_cache:
        wrapped = composition.lora(copy.deepcopy(base), family)
        lora_cache[family] = wrapped, scheduler.trace(copy.deepcopy(wrapped), (), batch, loss=composition.loss_of)
    wrapped, graph = lora_cache[family]
    plan = make_plan(family, kind, graph)
    model = scheduler.apply(copy.deepcopy(wrapped), plan)
    agree(composition.wf_held(model, dict(batch), family), composition.wf_held(copy.deepcopy(wrapped), dict(batch),
                                                                             family), tolerance(kind, "held"), "peft")
