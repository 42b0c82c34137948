"""The whole training step's memory, split into the categories that decide it.

A step holds two kinds of memory:

* persistent state, alive for the whole step and independent of the batch
  and sequence: parameters, their gradients, the optimizer's state and, under
  mixed precision, the fp32 master copy of the weights;
* activations (with their gradients and the ops' workspace), which grow with
  the batch and sequence and are what a checkpoint plan trades for recompute.

NOTE [ Bytes per parameter ]
    With ``p`` trainable parameters, ``d`` the bytes of the model dtype and
    ``k`` the number of optimizer states per parameter (``budget.
    OPTIMIZER_STATES``: Adam/AdamW 2, SGD with momentum 1, SGD/none 0):

    * plain training in one dtype (fp32, or "pure" bf16/fp16, which is what
      ``torch.optim.Adam`` does to a model cast with ``.to(bfloat16)``):
      weights ``d``, gradients ``d``, optimizer state ``k * d``, no master.
      fp32 Adam: 4 + 4 + 8 = 16 bytes per parameter.
    * mixed precision (``mixed_precision=True``, dtype bf16 or fp16), counted
      as the ZeRO paper does (Rajbhandari et al. 2020, section 3.1): weights and
      gradients in the low dtype (2 + 2), optimizer state in fp32 (``4 * k``)
      and an fp32 master copy of the weights (4) that the optimizer updates.
      bf16 mixed precision with Adam: 2 + 2 + 8 + 4 = 16 bytes per parameter,
      the same as fp32: mixed precision halves activations, not state.

    ``optimizer="none"`` (forward and backward only) keeps no state and no
    master copy. Frozen parameters (``trainable < params``) cost their weights
    only.

NOTE [ Reserve ]
    The card's memory is not all usable by tensors. The CUDA context (CUDA
    runtime and libraries: a few hundred MiB) lives outside PyTorch's
    allocator; cuBLAS and cuDNN take their workspaces from the caching
    allocator on first use and keep them (32 MiB per cuBLAS handle on sm90;
    24-65 MB over a model's first step on an H200,
    ``benchmarks/results/cuda.md``); the caching allocator rounds every block
    up to 512 B (a trace for a CUDA target counts that: NOTE [ CUDA blocks ]
    in ``scheduler.tracing.records``) and hands out cached blocks whole
    (4.3 MB, 0.2 %, above the prediction once on an H200), and fragments
    (``memory_reserved`` exceeds
    ``max_memory_allocated`` by a few percent in steady training). ``DEFAULT_RESERVE`` holds back 5 % of the
    card for both: 1.2 GiB of a 24 GiB card, 4 GiB of 80 GiB, which covers a
    ~0.5 GiB context plus ~3 % fragmentation. Set another margin with
    ``reserve=`` (a fraction such as ``0.1`` / ``"10%"``, or a size such as
    ``"2GiB"``); ``0`` plans against the whole card.

The budget handed to a solver is what ``solvers.model.simulate`` measures (params,
param gradients, inputs, activations): the card minus the reserve, the
optimizer state and the master copy (:attr:`MemoryReport.solver_budget_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from graphs import Graph
from solvers import Simulation, activation_budget_bytes, format_bytes

from .budget import OPTIMIZER_STATES, BudgetError, BudgetSpec, optimizer_state_bytes, parse_size, read_budget
from ..report import table

__all__ = [
    "DTYPE_BYTES", "DEFAULT_RESERVE", "NothingFits", "PersistentState", "PlanMemory", "MemoryReport",
    "dtype_bytes", "dtype_name", "persistent_state", "parse_reserve", "plan_memory", "memory_report", "render_report",
    "levers", "check_state_fits", "graph_state", "step_budget_bytes", "parse_budget",
]

#: Bytes per element of the dtypes a model is trained in.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

#: Default share of the card held back for the CUDA context and allocator
#: fragmentation (NOTE [ Reserve ]).
DEFAULT_RESERVE = 0.05

_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}

ReserveSpec = Union[str, int, float, None]


class NothingFits(BudgetError):
    """Persistent state (or the smallest size) does not fit the card.

    Attributes:
        report: the :class:`MemoryReport` with the numbers.
        levers: sentences naming what would help, with numbers.
    """

    def __init__(self, message: str, report: "MemoryReport", levers: Sequence[str]) -> None:
        self.report = report
        self.levers = tuple(levers)
        helps = " What would help: " + " ".join(f"({i + 1}) {s}" for i, s in enumerate(levers)) if levers else ""
        super().__init__(message + helps)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``fp32``, ``bf16``, ``fp16`` or torch spellings).

    Raises:
        BudgetError: unknown dtype, naming the accepted ones.
    """
    key = _DTYPE_ALIASES.get(str(dtype).lower().removeprefix("torch."), str(dtype).lower())
    if key not in DTYPE_BYTES:
        raise BudgetError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


def dtype_name(dtype: str) -> str:
    """``dtype`` as ``fp32``, ``bf16`` or ``fp16`` (from those or torch spellings).

    Raises:
        BudgetError: unknown dtype, naming the accepted ones.
    """
    dtype_bytes(dtype)
    return _DTYPE_ALIASES.get(str(dtype).lower().removeprefix("torch."), str(dtype).lower())


@dataclass(frozen=True)
class PersistentState:
    """Memory alive for the whole step (NOTE [ Bytes per parameter ]).

    Attributes:
        params: number of parameters.
        trainable: number of parameters that get gradients and optimizer state.
        dtype: model dtype (``fp32``, ``bf16``, ``fp16``).
        optimizer: optimizer name (a key of ``budget.OPTIMIZER_STATES``).
        mixed_precision: low-precision weights with fp32 master and state.
        param_bytes: the weights in the model dtype.
        grad_bytes: their gradients (model dtype).
        optimizer_bytes: optimizer state (fp32 under mixed precision).
        master_bytes: the fp32 master copy (mixed precision only).
    """

    params: int
    trainable: int
    dtype: str
    optimizer: str
    mixed_precision: bool
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    master_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.master_bytes

    @property
    def outside_simulation_bytes(self) -> int:
        """What ``simulate`` does not count: optimizer state and master copy."""
        return self.optimizer_bytes + self.master_bytes


def persistent_state(params: int, *, trainable: int | None = None, dtype: str = "fp32",
                     optimizer: str | None = "adam", mixed_precision: bool = False) -> PersistentState:
    """Persistent bytes of a step for ``params`` parameters.

    Args:
        params: number of parameters of the model.
        trainable: how many of them are trained (default: all).
        dtype: dtype of the weights and activations.
        optimizer: ``adam``, ``adamw``, ``sgd``, ``sgd-momentum`` or ``none``.
        mixed_precision: fp32 master copy and fp32 optimizer state beside
            low-precision weights (needs ``dtype`` bf16 or fp16).

    Returns:
        A :class:`PersistentState`.

    Raises:
        BudgetError: unknown dtype or optimizer, ``trainable > params``, or
            mixed precision with fp32 weights.
    """
    name = dtype_name(dtype)
    opt = (optimizer or "none").lower()
    if opt not in OPTIMIZER_STATES:
        raise BudgetError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZER_STATES)}")
    trainable = params if trainable is None else int(trainable)
    if not 0 <= trainable <= params:
        raise BudgetError(f"trainable parameters ({trainable}) must be between 0 and the parameter count ({params})")
    if mixed_precision and name == "fp32":
        raise BudgetError("mixed precision keeps bf16/fp16 weights beside an fp32 master copy; "
                          "pass dtype bf16 or fp16 with it (fp32 weights need no master copy)")
    d = DTYPE_BYTES[name]
    state_d = 4 if mixed_precision else d
    master = 4 * trainable if mixed_precision and opt != "none" else 0
    return PersistentState(
        params=int(params), trainable=trainable, dtype=name, optimizer=opt, mixed_precision=bool(mixed_precision),
        param_bytes=d * int(params), grad_bytes=d * trainable,
        optimizer_bytes=OPTIMIZER_STATES[opt] * state_d * trainable, master_bytes=master,
    )


def parse_reserve(spec: ReserveSpec, device_bytes: int) -> int:
    """Bytes held back from a card of ``device_bytes`` (NOTE [ Reserve ]).

    Args:
        spec: ``None`` (the default, 5 %), a fraction in [0, 1) (``0.05``,
            ``"0.05"``, ``"5%"``) or a size (``"2GiB"``, an int of bytes).

    Raises:
        BudgetError: malformed spec, or a reserve that takes the whole card.
    """
    if spec is None:
        spec = DEFAULT_RESERVE
    if isinstance(spec, bool):
        raise BudgetError(f"reserve must be a fraction or a size, got {spec!r}")
    if isinstance(spec, str):
        text = spec.strip()
        try:
            spec = float(text[:-1]) / 100 if text.endswith("%") else float(text) if "." in text or text == "0" else text
        except ValueError:
            raise BudgetError(f"cannot read reserve {text!r}; write a share such as '5%' or 0.05, or a size such as '2GiB'") from None
    if isinstance(spec, float):
        if not 0 <= spec < 1:
            raise BudgetError(f"a reserve share must be in [0, 1), got {spec!r}")
        value = int(spec * device_bytes)
    elif isinstance(spec, int):
        value = spec
    elif str(spec).strip() == "0":
        value = 0
    else:
        try:
            value = parse_size(spec)
        except BudgetError:
            raise BudgetError(f"cannot read reserve {spec!r}; write a share such as '5%' or 0.05, or a size such as "
                              "'2GiB'") from None
    if value < 0 or value >= device_bytes:
        raise BudgetError(f"a reserve of {format_bytes(value)} leaves nothing of a {format_bytes(device_bytes)} card")
    return value


@dataclass(frozen=True)
class PlanMemory:
    """Activations at the peak under one plan, and what that makes of the step.

    Attributes:
        solver: solver name (``store-all`` for no checkpointing).
        peak_bytes: ``simulate``'s whole-step peak (params, param grads,
            inputs, activations, activation grads, workspace).
        activation_bytes: ``peak_bytes`` minus params, all param gradients and
            inputs: activations, their gradients and workspace at the peak
            (so that the categories add up to the step's total).
        recompute_ratio: recompute FLOPs over the un-checkpointed step's FLOPs.
        fits: whether the step's total fits the card.
        min_feasible_bytes: for a solver that found no plan, the least
            ``simulate`` budget it would need (else None).
        stopped: the solver stopped without an answer (a time limit, an error), so "no plan" is not "none fits".
    """

    solver: str
    peak_bytes: int | None
    activation_bytes: int | None
    recompute_ratio: float | None
    fits: bool
    min_feasible_bytes: int | None = None
    stopped: bool = False


def plan_memory(solver: str, sim: Simulation, grad_bytes: int, budget_bytes: int) -> PlanMemory:
    """Summarise ``sim`` (a simulation of the graph under ``solver``'s plan)."""
    act = sim.peak_bytes - sim.breakdown["params"] - sim.breakdown["inputs"] - grad_bytes
    return PlanMemory(solver=solver, peak_bytes=sim.peak_bytes, activation_bytes=max(0, act),
                      recompute_ratio=sim.recompute_ratio, fits=sim.peak_bytes <= budget_bytes)


@dataclass(frozen=True)
class MemoryReport:
    """The step's memory by category against one card.

    Attributes:
        device_bytes: the card's memory.
        reserve_bytes: held back (NOTE [ Reserve ]).
        state: the persistent state.
        input_bytes: the model inputs at this size.
        plans: activations at the peak, store-all first, then each solver.
        size: what was traced (e.g. ``{"batch": 8, "seq": 1024}``).
    """

    device_bytes: int
    reserve_bytes: int
    state: PersistentState
    input_bytes: int = 0
    plans: tuple[PlanMemory, ...] = ()
    size: Mapping[str, int] = field(default_factory=dict)

    @property
    def persistent_bytes(self) -> int:
        """Persistent state plus the reserve."""
        return self.state.total_bytes + self.reserve_bytes

    @property
    def solver_budget_bytes(self) -> int:
        """The whole-step budget a solver plans against (as ``simulate`` counts)."""
        return self.device_bytes - self.reserve_bytes - self.state.outside_simulation_bytes

    @property
    def activation_room_bytes(self) -> int:
        """What the card leaves for activations (negative: persistent state alone does not fit)."""
        return self.device_bytes - self.persistent_bytes - self.input_bytes

    def total_bytes(self, plan: PlanMemory) -> int | None:
        """The step's total on the card under ``plan`` (None if it has no plan)."""
        if plan.activation_bytes is None:
            return None
        return self.persistent_bytes + self.input_bytes + plan.activation_bytes


def memory_report(state: PersistentState, device_bytes: int, *, reserve: ReserveSpec = None, input_bytes: int = 0,
                  plans: Sequence[PlanMemory] = (), size: Mapping[str, int] | None = None) -> MemoryReport:
    """Build a :class:`MemoryReport` (``reserve`` as in :func:`parse_reserve`)."""
    return MemoryReport(device_bytes=int(device_bytes), reserve_bytes=parse_reserve(reserve, device_bytes),
                        state=state, input_bytes=int(input_bytes), plans=tuple(plans), size=dict(size or {}))


def render_report(report: MemoryReport) -> str:
    """The category table: persistent rows, then activations per plan, then the verdicts."""
    s = report.state
    card = report.device_bytes
    pct = lambda b: f"{100 * b / card:.1f}%"  # noqa: E731
    opt = s.optimizer if s.optimizer != "none" else "no optimizer"
    state_dtype = "fp32" if s.mixed_precision else s.dtype
    rows = [
        (f"parameters ({s.params:,} x {s.dtype})", format_bytes(s.param_bytes), pct(s.param_bytes)),
        (f"gradients ({s.trainable:,} trainable x {s.dtype})", format_bytes(s.grad_bytes), pct(s.grad_bytes)),
        (f"optimizer state ({opt}, {OPTIMIZER_STATES[s.optimizer]} x {state_dtype} per parameter)",
         format_bytes(s.optimizer_bytes), pct(s.optimizer_bytes)),
    ]
    if s.mixed_precision:
        rows.append(("fp32 master weights (mixed precision)", format_bytes(s.master_bytes), pct(s.master_bytes)))
    rows.append(("framework reserve", format_bytes(report.reserve_bytes), pct(report.reserve_bytes)))
    rows.append(("persistent total", format_bytes(report.persistent_bytes), pct(report.persistent_bytes)))
    if report.size and (report.input_bytes or report.plans):
        what = ", ".join(f"{k} {v}" for k, v in report.size.items())
        rows.append((f"inputs ({what})", format_bytes(report.input_bytes), pct(report.input_bytes)))
    for p in report.plans:
        label = f"activations at peak, {p.solver}"
        if p.activation_bytes is None:
            need = "stopped without a plan" if p.stopped else "no plan fits"
            if p.min_feasible_bytes is not None:
                need += f" (needs {format_bytes(p.min_feasible_bytes + s.outside_simulation_bytes + report.reserve_bytes)} card)"
            rows.append((label, "-", "", need))
            continue
        total = report.total_bytes(p) or 0
        verdict = "fits" if total <= card else f"over by {format_bytes(total - card)}"
        extra = f", recompute +{100 * (p.recompute_ratio or 0):.1f}%" if p.solver != "store-all" else ""
        rows.append((label, format_bytes(p.activation_bytes), pct(p.activation_bytes),
                     f"step total {format_bytes(total)}: {verdict}{extra}"))
    rows = [r + ("",) * (4 - len(r)) for r in rows]
    if report.activation_room_bytes < 0:
        head = f"card {format_bytes(card)}; the persistent state alone is over it: nothing is left for activations"
    else:
        head = (f"card {format_bytes(card)}; solvers plan against {format_bytes(report.solver_budget_bytes)} "
                "(card - reserve - optimizer state - master weights)")
    return head + "\n" + table(rows, ["category", "bytes", "of card", ""])


def check_state_fits(report: MemoryReport, *, what: str = "card") -> None:
    """Refuse a step whose persistent state (and reserve) leaves nothing for activations.

    Raises:
        NothingFits: the state alone is over (or all of) the ``what`` (``card`` or ``budget``), with the levers.
    """
    if report.activation_room_bytes >= 0:
        return
    s, card = report.state, report.device_bytes
    over = report.persistent_bytes - card
    raise NothingFits(
        f"nothing fits: the persistent state alone ({format_bytes(report.persistent_bytes)} = weights "
        f"{format_bytes(s.param_bytes)} + gradients {format_bytes(s.grad_bytes)} + optimizer state "
        f"{format_bytes(s.optimizer_bytes)} + master weights {format_bytes(s.master_bytes)} + reserve "
        f"{format_bytes(report.reserve_bytes)}) is {'over' if over > 0 else 'all of'} the {format_bytes(card)} "
        f"{what}{f' by {format_bytes(over)}' if over > 0 else ''}, before any activation"
        + ("." if what == "card" else "; raise the budget (`ckpt fit` names what else would help)"),
        report, levers(report) if what == "card" else ())


def graph_state(graph: Graph, *, optimizer: str | None = None, mixed_precision: bool = False) -> PersistentState:
    """The persistent state of the step ``graph`` was traced for (its parameter count and dtype from its meta,
    else fp32 parameters of ``graph.param_bytes``); frozen parameters (``graph.frozen_param_bytes``) are
    trained by no optimizer."""
    dtype = str(graph.meta.get("dtype", "fp32"))
    dtype = dtype_name(dtype) if dtype.lower().removeprefix("torch.") in (*DTYPE_BYTES, *_DTYPE_ALIASES) else "fp32"
    params = graph.meta.get("parameters")
    if not isinstance(params, int) or isinstance(params, bool) or params < 0:
        params = graph.param_bytes // DTYPE_BYTES[dtype]
    trainable = min(params, (graph.param_bytes - graph.frozen_param_bytes) // DTYPE_BYTES[dtype])
    return persistent_state(params, trainable=trainable if graph.frozen_param_bytes else None, dtype=dtype,
                            optimizer=optimizer, mixed_precision=mixed_precision)


def parse_budget(spec: BudgetSpec, graph: Graph | None = None, *, optimizer: str | None = None) -> int:
    """The whole-step budget in bytes that ``simulate``'s ``peak_bytes`` must not exceed.

    Args:
        spec: ``"6GiB"``, ``"512MiB"``, ``"1.5GB"``, an integer number of
            bytes, or a fraction in (0, 1] (float or string such as ``"0.3"``
            or ``"3e-1"``) of the store-all activations (needs ``graph``;
            NOTE [ Fractional budgets ] in ``scheduler.sizing.budget``).
        graph: the graph the budget applies to (for fractions).
        optimizer: when given, its state is subtracted from a byte budget
            (:func:`step_budget_bytes`, which also takes
            mixed precision and a reserve).

    Raises:
        BudgetError: malformed spec, a bare number above 1 that is no byte
            count (with a hint), a fraction without a graph (or with an
            optimizer), or persistent state that leaves nothing for the step.
    """
    if optimizer and graph is not None:
        return step_budget_bytes(spec, graph, optimizer=optimizer)
    kind, value = read_budget(spec)
    if kind == "fraction":
        if graph is None:
            raise BudgetError(f"a fractional budget ({spec!r}) needs the graph to know the store-all peak")
        return activation_budget_bytes(graph, value)
    return int(value)


def step_budget_bytes(spec: BudgetSpec, graph: Graph, *, optimizer: str | None = None, mixed_precision: bool = False,
                      reserve: ReserveSpec = 0) -> int:
    """The budget a solver plans ``graph`` against: ``spec`` for the whole step, less what ``simulate`` does not
    count (optimizer state, the fp32 master copy) and the reserve, as ``fit`` does for a card (NOTE [ Bytes per
    parameter ], NOTE [ Reserve ]; the default reserve here is 0: the budget is the tensors' own).

    A fraction (NOTE [ Fractional budgets ]) is a share of the activations: none of the terms applies to it.

    Raises:
        BudgetError: an unreadable budget or term, or a term given with a fraction.
        NothingFits: with a term given, the persistent state alone is over the budget (without one, the
            solver refuses a budget under the least feasible one and names it).
    """
    kind, value = read_budget(spec)
    terms = [t for t, on in (("an optimizer", optimizer not in (None, "none")), ("mixed precision", mixed_precision),
                             ("a reserve", reserve not in (None, 0, "0"))) if on]
    if kind == "fraction":
        if optimizer is not None:
            optimizer_state_bytes(0, optimizer)  # an unknown name is an error whatever the budget
        if terms:
            raise BudgetError(f"a fractional budget ({spec}) is a share of the store-all activations; "
                              f"{' and '.join(terms)} {'belongs' if len(terms) == 1 else 'belong'} to a budget in "
                              f"bytes for the whole step: give one (e.g. 6GiB), or leave {'it' if len(terms) == 1 else 'them'} out")
        return parse_budget(spec, graph)
    if not terms:  # the budget is the tensors' own: a too-small one is the solver's to refuse, naming the floor
        return parse_budget(spec, graph)
    state = graph_state(graph, optimizer=optimizer, mixed_precision=mixed_precision)
    report = memory_report(state, int(value), reserve=reserve)
    check_state_fits(report, what="budget")
    return report.solver_budget_bytes


def levers(report: MemoryReport) -> list[str]:
    """What would make the step fit, with numbers, most effective first.

    When the persistent state alone exceeds the card, a smaller batch or
    sequence cannot help, and the list says so; otherwise it leads with the
    levers that shrink activations.
    """
    s = report.state
    room = report.device_bytes - report.reserve_bytes - report.input_bytes
    out: list[str] = []
    if s.optimizer != "none":
        zero1 = s.optimizer_bytes + s.master_bytes
        fixed = s.param_bytes + s.grad_bytes
        if fixed < room:
            n = math.ceil(zero1 / (room - fixed)) if zero1 else 1
            out.append(f"shard the optimizer state and master weights ({format_bytes(zero1)}) across GPUs with "
                       f"ZeRO-1/2 (DeepSpeed) or FSDP SHARD_GRAD_OP: at least {max(n, 2)} cards of this size, before activations.")
        n3 = math.ceil(s.total_bytes / room) if room > 0 else None
        if n3:
            out.append(f"shard everything (ZeRO-3 / FSDP FULL_SHARD, {format_bytes(s.total_bytes)} of state): "
                       f"at least {max(n3, 2)} cards of this size, before activations.")
    if s.dtype == "fp32" or s.mixed_precision:
        pure = persistent_state(s.params, trainable=s.trainable, dtype="bf16", optimizer=s.optimizer)
        out.append(f"train in pure bf16 (bf16 weights, gradients and optimizer state, no fp32 master copy): "
                   f"{format_bytes(pure.total_bytes)} of state instead of {format_bytes(s.total_bytes)} "
                   "(mixed precision with an fp32 master copy does not shrink Adam's state; it halves activations).")
    if s.optimizer in ("adam", "adamw"):
        sgd = persistent_state(s.params, trainable=s.trainable, dtype=s.dtype, optimizer="sgd-momentum",
                               mixed_precision=s.mixed_precision)
        out.append(f"an optimizer with less state (SGD with momentum: {format_bytes(sgd.total_bytes)}; 8-bit Adam "
                   "stores its two states in 1 byte each).")
    if s.trainable:
        lora = persistent_state(s.params, trainable=max(1, s.params // 100), dtype=s.dtype, optimizer=s.optimizer,
                                mixed_precision=s.mixed_precision)
        out.append(f"fewer trainable parameters (freeze layers, or LoRA adapters): with 1% trainable the state is "
                   f"{format_bytes(lora.total_bytes)}.")
    if report.activation_room_bytes < 0:
        out.append("a smaller batch or sequence cannot help here: it only shrinks activations, and the persistent "
                   "state alone is over the card.")
    else:
        act = [
            f"a smaller batch or shorter sequence: activations are what is over the "
            f"{format_bytes(report.activation_room_bytes)} the persistent state leaves.",
        ]
        if s.dtype == "fp32":
            act.append("bf16 mixed precision, which halves activations.")
        out = act + out
    return out
