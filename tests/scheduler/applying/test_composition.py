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

import pytest
import torch

transformers = pytest.importorskip("transformers")

import composition  # noqa: E402  (tests/ is on pytest's pythonpath)
import scheduler  # noqa: E402
from composition import FAMILIES, KINDS, WORKFLOWS, agree, applies, build, make_plan, tolerance  # noqa: E402
from graphs import CkptError  # noqa: E402
from scheduler.measuring.steps import allocator_step_peak  # noqa: E402

composition.use(transformers)

#: (family, kind) -> the one-line refusal, matched: a cell that cannot work must be refused by solve or apply.
REFUSED: dict[tuple[str, str], str] = {}

#: (family or "*", kind or "*", workflow or "*") -> why the cell fails today and which part of issue 33 owns it.
XFAIL: dict[tuple[str, str, str], str] = {}


def _xfail(family: str, kind: str, workflow: str) -> str | None:
    for (f, k, w), reason in XFAIL.items():
        if f in ("*", family) and k in ("*", kind) and w in ("*", workflow):
            return reason
    return None


def _cells():
    for family in FAMILIES:
        for kind in KINDS:
            if (family, kind) in REFUSED:
                continue
            for workflow in list(WORKFLOWS) + ["peak"]:
                if not applies(family, workflow) or (workflow == "peak" and kind == "stage"):
                    continue
                reason = _xfail(family, kind, workflow)
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                yield pytest.param(family, kind, workflow, id=f"{family}-{kind}-{workflow}", marks=marks)


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
    return _Cache()


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


@pytest.mark.parametrize("family,kind", sorted(REFUSED), ids=[f"{f}-{k}-refused" for f, k in sorted(REFUSED)])
def test_refused_at_once_in_one_line(cache, family, kind):
    base, _ = cache.model(family)
    with pytest.raises(CkptError, match=REFUSED[family, kind]) as info:
        scheduler.apply(copy.deepcopy(base), make_plan(family, kind, cache.graph(family)))
    assert "\n" not in str(info.value)
