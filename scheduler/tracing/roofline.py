"""Roofline recompute costs (``capture(..., costs="roofline")``, the default).

NOTE [ Roofline costs ]
    FLOPs price a recompute badly wherever memory-bound ops matter: dropout,
    GELU, layer norm, softmax, BatchNorm and copies count almost no FLOPs yet
    take a large share of the time (NOTE [ Time costs ] in
    ``scheduler.tracing.timing``: on a CPU, dropout is 0.1 % of the built-in
    GPT's forward FLOPs and 28 % of its time). A solver minimising FLOPs then
    recomputes exactly the ops that cost time.

    So each traced node is priced by a roofline of the device it will run on
    (:class:`DevicePeaks`). The tracer records, per ATen kernel the node's
    forward runs (``OpRecord.kernels``; views and bare allocations run no
    kernel and are left out), its dtype, its FLOPs (``FlopCounterMode``),
    the bytes it moves: every tensor it reads (activations, parameters,
    buffers) plus every tensor it writes (outputs, its own saved buffers such
    as dropout's mask or layer norm's mean and rstd), and the random numbers
    it draws. A kernel takes

        max(FLOPs / peak FLOP/s[dtype], bytes / bandwidth,
            random numbers / random_per_s) + op_overhead_s

    The third roof is the CPU's: drawing dropout's mask there is slower than
    moving it (``bernoulli_`` measured at about 13 ns per element where an
    ``add`` takes 0.5 ns), so by bytes alone dropout came out 16 times too
    cheap; a GPU draws Philox numbers far faster than it moves them, so the
    named GPUs leave ``random_per_s`` unset (no such roof).
    The bandwidth itself is the CPU's per kernel class for the kernels of
    :data:`SLOW_CLASSES` (NOTE [ Slow elementwise kernels ] below).
    A node costs the sum over its kernels (for the usual node, one kernel:
    ``max(...) + op_overhead_s``; a node of views only costs nothing). The
    time is written as ``Node.fwd_cost`` in *FLOP-equivalents*: seconds times
    the peak FLOP/s of the model's dtype, so a compute-bound matmul costs about
    its FLOPs and totals stay comparable with FLOP graphs. ``meta["costs"]``
    records the model, the device and its peaks, and ``flops_per_s``, the rate
    that turns a cost back into seconds (``solvers.model.simulate`` reports
    ``recompute_time_s`` with it). Costs are not part of the fingerprint.

    Devices: named GPUs come from their datasheets (:data:`DEVICES`); the CPU
    is measured (a matmul per dtype, a large copy, random draws, a tiny op)
    and stored per machine and thread count (NOTE [ CPU calibration ] in
    ``scheduler.tracing.calibration``). Which device a trace is priced for is
    its target (NOTE [ Trace targets ] in ``scheduler.tracing.target``).

NOTE [ Slow elementwise kernels ]
    On a CPU the kernels of transcendental and row-wise ops are bound by
    their arithmetic, not by memory, though FlopCounterMode counts them at
    zero FLOPs: on this project's machine (AMD EPYC, one thread, 16 MiB
    float32 tensors, bytes read plus written per second) a copy or an add
    moved 21-26 GB/s, but GELU 8.3, SiLU 8.0, sigmoid 8.3, exp 7.7, softmax
    6.6, log-softmax 5.6, masked_fill 4.7, and tanh and the tanh GELU 2.2-2.5
    (four to ten times slower than a copy). Priced at the copy bandwidth, a
    GPT's GELUs came out 8.3x cheaper than measured, its softmaxes 2.8x,
    its cross-entropy 4.1x, so the plans' recompute was predicted 43 % short
    (``benchmarks/results/cost_models.md`` at ``1b5e188``). So the CPU
    calibration measures one call of each class of :data:`SLOW_CLASSES`
    (16 MiB tensors, rows of 1,024 for the row-wise ones) and stores its
    bytes per second (``class_bytes_per_s``); a kernel of the class moves at
    the lesser of that and the copy bandwidth. A class is an ATen op's base
    name (in-place variants alike); a GELU run with ``approximate="tanh"``
    is noted by the watch as its own (``gelu_tanh``: 3.7x slower than the
    exact one). Measured in float32 and used for every dtype. The named GPUs
    have no class rates: there these kernels are memory-bound.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from graphs import CkptError

if TYPE_CHECKING:  # torch is imported where measured: the CLI's help lists DEVICES without it
    import torch

    from .records import OpRecord

__all__ = ["DevicePeaks", "DEVICES", "DEFAULT_DEVICE", "UnknownDevice", "lookup_device",
           "kernel_time_s", "record_time_s", "roofline_records", "model_dtype", "OP_CLASSES", "op_class",
           "SLOW_CLASSES", "TANH_GELU", "slow_class"]

log = logging.getLogger(__name__)

#: The GPU a ``meta`` model plans for (``target="cuda"``), and the one priced for a GPU missing from :data:`DEVICES`.
DEFAULT_DEVICE = "H100"
#: ATen ops (base names) whose kernels a CPU runs below its copy bandwidth, by class
#: (NOTE [ Slow elementwise kernels ]); a GELU with ``approximate="tanh"`` is its own class (the watch notes it
#: on the op's name).
SLOW_CLASSES: Mapping[str, str] = {
    **{op: op.rstrip("_") for op in ("gelu", "gelu_", "silu", "silu_", "tanh", "tanh_", "sigmoid", "sigmoid_",
                                     "exp", "exp_", "erf", "erf_", "masked_fill", "masked_fill_")},
    "_softmax": "softmax", "_log_softmax": "log_softmax", "native_layer_norm": "layer_norm",
}
#: What the watch appends to a GELU's op name when it runs the tanh approximation.
TANH_GELU = " approximate=tanh"

# Op classes whose forward calls a CPU trace times at their shapes (NOTE [ Measured op classes ] in
#: ``scheduler.tracing.opclasses``): a call is of a class when the class's name is in its ATen overload's, or,
#: for ``matmul``, when the overload is a matrix product's (:data:`MATMUL_OPS`).
OP_CLASSES = ("convolution", "batch_norm", "max_pool", "matmul")
#: The ATen matrix products (base names) of the ``matmul`` class.
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm"})


def slow_class(op: str | None) -> str | None:
    """The :data:`SLOW_CLASSES` class of an ATen overload's name (``aten._softmax.default`` -> ``softmax``;
    a tanh-approximated GELU -> ``gelu_tanh``), or None."""
    if not op:
        return None
    parts = op.split(" ", 1)[0].split(".")
    cls = SLOW_CLASSES.get(parts[1] if len(parts) > 1 and parts[0] == "aten" else parts[0])
    return "gelu_tanh" if cls == "gelu" and op.endswith(TANH_GELU) else cls


def op_class(op: str) -> str | None:
    """The class of :data:`OP_CLASSES` an ATen overload (``aten.convolution.default``) is of, or None."""
    parts = op.split(" ", 1)[0].split(".")
    if len(parts) > 1 and parts[0] == "aten" and parts[1] in MATMUL_OPS:
        return "matmul"
    return next((c for c in OP_CLASSES if c != "matmul" and c in op), None)


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


class UnknownDevice(CkptError, ValueError):
    """A device name that is not in the table (the message lists the names)."""


@dataclass(frozen=True)
class DevicePeaks:
    """What one device can do at best: the roofline's parameters.

    Attributes:
        name: the table's name (``H100``) or ``cpu (MODEL, N threads)``.
        flops_per_s: dense peak FLOP/s per dtype (``float32``, ``bfloat16``,
            ``float16``); other dtypes use ``float32``'s.
        bytes_per_s: memory bandwidth (bytes read plus written per second).
        op_overhead_s: fixed time of one kernel (launch and dispatch).
        source: where the numbers come from.
        random_per_s: random numbers drawn per second, when drawing them
            can be slower than moving them (the CPU); None: no such roof.
        class_bytes_per_s: the bandwidth of the kernels of a class of
            :data:`SLOW_CLASSES` where it is below ``bytes_per_s`` (the CPU's,
            measured); a class not in it moves at ``bytes_per_s``.
    """

    name: str
    flops_per_s: Mapping[str, float]
    bytes_per_s: float
    op_overhead_s: float
    source: str = ""
    random_per_s: float | None = None
    class_bytes_per_s: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flops_per_s", dict(self.flops_per_s))
        object.__setattr__(self, "class_bytes_per_s", dict(self.class_bytes_per_s))
        if not all(_positive(v) for v in self.class_bytes_per_s.values()):
            raise ValueError(f"device {self.name!r}: class_bytes_per_s must be finite and positive")
        rates = list(self.flops_per_s.values()) + [self.bytes_per_s]
        if "float32" not in self.flops_per_s or not all(_positive(v) for v in rates):
            raise ValueError(f"device {self.name!r}: peaks must be finite and positive, with a float32 entry")
        if not (math.isfinite(self.op_overhead_s) and self.op_overhead_s >= 0):
            raise ValueError(f"device {self.name!r}: op_overhead_s must be finite and >= 0")
        if self.random_per_s is not None and not _positive(self.random_per_s):
            raise ValueError(f"device {self.name!r}: random_per_s must be finite and positive, or None")

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype`` (``float32``'s for a dtype the table lacks)."""
        return float(self.flops_per_s.get(dtype, self.flops_per_s["float32"]))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DevicePeaks":
        """Inverse of :meth:`to_dict`. Raises ValueError/TypeError/KeyError on a malformed entry."""
        return cls(name=str(d["name"]), flops_per_s={str(k): float(v) for k, v in dict(d["flops_per_s"]).items()},
                   bytes_per_s=float(d["bytes_per_s"]), op_overhead_s=float(d["op_overhead_s"]),
                   source=str(d.get("source", "")),
                   random_per_s=None if d.get("random_per_s") is None else float(d["random_per_s"]),
                   class_bytes_per_s={str(k): float(v) for k, v in dict(d.get("class_bytes_per_s") or {}).items()})


def _gpu(name: str, fp32: float, half: float, tb_per_s: float, source: str) -> DevicePeaks:
    # Eager PyTorch spends a few microseconds per kernel on launch and dispatch (no datasheet
    # states it); 5 us is our estimate for every GPU.
    return DevicePeaks(name, {"float32": fp32 * 1e12, "bfloat16": half * 1e12, "float16": half * 1e12},
                       tb_per_s * 1e12, 5e-6, source)


#: Named GPUs: float32 (no tensor cores: PyTorch's default for float32 matmuls), bfloat16/float16
#: dense tensor-core peaks (without sparsity; FP32 accumulate on GeForce cards), memory bandwidth.
DEVICES: Mapping[str, DevicePeaks] = {d.name: d for d in (
    _gpu("A100-40GB", 19.5, 312, 1.555, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)"),
    _gpu("A100-80GB", 19.5, 312, 2.039, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)"),
    _gpu("H100", 67, 989, 3.35, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)"),
    _gpu("H200", 67, 989, 4.8, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
    _gpu("L4", 30.3, 121, 0.3, "NVIDIA L4 Tensor Core GPU datasheet"),
    _gpu("RTX4090", 82.6, 165.2, 1.008, "NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090)"),
    _gpu("RTX3090", 35.6, 71, 0.936, "NVIDIA Ampere GA102 GPU architecture whitepaper (GeForce RTX 3090)"),
)}


def _normal(name: str) -> str:
    text = name.lower().replace("nvidia", "").replace("geforce", "")
    return "".join(c for c in text if c.isalnum())


def lookup_device(name: str) -> DevicePeaks | None:
    """The table's entry for a device name, or None.

    Accepts the table's names in any case and spelling (``h100``, ``RTX 4090``)
    and what ``torch.cuda.get_device_name`` reports (``NVIDIA A100-SXM4-40GB``,
    ``NVIDIA H100 80GB HBM3``, ``NVIDIA GeForce RTX 3090``).
    """
    n = _normal(name)
    if not n:
        return None
    for key, peaks in DEVICES.items():
        if n == _normal(key):
            return peaks
    if "a100" in n:
        return DEVICES["A100-40GB" if "40gb" in n else "A100-80GB"]
    for key in ("H200", "H100", "RTX4090", "RTX3090"):
        if _normal(key).replace("rtx", "") in n:
            return DEVICES[key]
    if n in ("l4", "l4tensorcoregpu"):
        return DEVICES["L4"]
    return None


# ------------------------------------------------------------------ pricing
def kernel_time_s(flops: int, nbytes: int, dtype: str, peaks: DevicePeaks, randoms: int = 0,
                  op: str | None = None) -> float:
    """One kernel's roofline time (NOTE [ Roofline costs ]).

    Args:
        flops: its FLOPs; nbytes: bytes read plus written; dtype: picks the
        peak FLOP/s; peaks: the device; randoms: random numbers it draws;
        op: its ATen overload, whose :func:`slow_class` may move fewer bytes per second.
    """
    draw = randoms / peaks.random_per_s if peaks.random_per_s else 0.0
    bandwidth = min(peaks.bytes_per_s, peaks.class_bytes_per_s.get(slow_class(op) or "", math.inf))
    return max(flops / peaks.peak(dtype), nbytes / bandwidth, draw) + peaks.op_overhead_s


def record_time_s(record: OpRecord, peaks: DevicePeaks) -> float:
    """A traced node's roofline time: the sum over the kernels it runs (0 for views); the kernels of a class
    timed at their shapes take the measured time instead (NOTE [ Measured op classes ])."""
    timed = dict(record.class_times)
    ops: Sequence[str | None] = record.kernel_ops
    if len(ops) != len(record.kernels):
        if timed:
            return sum(kernel_time_s(f, b, dt, peaks, r) for dt, f, b, r in record.kernels)
        ops = [None] * len(record.kernels)
    rest = sum(kernel_time_s(f, b, dt, peaks, r, op) for (dt, f, b, r), op in zip(record.kernels, ops)
               if op is None or op_class(op) not in timed)
    return rest + sum(timed.values())


def roofline_records(records: Sequence[OpRecord], peaks: DevicePeaks, dtype: str, recompute_op_s: float = 0.0
                     ) -> tuple[list[OpRecord], dict[str, Any]]:
    """``records`` with ``fwd_cost`` set to their roofline time in FLOP-equivalents.

    Args:
        records: the measured nodes (with ``kernels``).
        peaks: the device priced for.
        dtype: the model's dtype; its peak FLOP/s converts seconds to FLOP-equivalents.
        recompute_op_s: added per kernel: what running it again inside a checkpoint region costs beyond the
            kernel (NOTE [ Plan overheads ] in ``solvers.model.overheads``; 0: none).

    Returns:
        ``(records, meta)``: ``meta`` is what goes in ``Graph.meta["costs"]``.
    """
    rate = peaks.peak(dtype)
    forward = [record_time_s(r, peaks) for r in records]
    times = [t + recompute_op_s * len(r.kernels) for t, r in zip(forward, records)]
    out = [dataclasses.replace(r, fwd_cost=int(round(t * rate))) for r, t in zip(records, times)]
    meta = {"model": "roofline", "device": peaks.name, "peaks": peaks.to_dict(), "dtype": dtype,
            "flops_per_s": rate, "forward_s": sum(forward), "recompute_op_s": recompute_op_s}
    log.info("roofline costs on %s: forward %.3g ms predicted", peaks.name, 1e3 * sum(forward))
    return out, meta


def model_dtype(tensors: Sequence[torch.Tensor]) -> str:
    """The floating dtype holding the most bytes among ``tensors`` (``float32`` when none is floating)."""
    import torch

    size: dict[str, int] = {}
    for t in tensors:
        if t.is_floating_point():
            k = str(t.dtype).replace("torch.", "")
            size[k] = size.get(k, 0) + t.numel() * t.element_size()
    return max(size, key=lambda k: size[k]) if size else "float32"

