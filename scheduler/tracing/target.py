"""The device a trace plans for (``capture(..., target=)``, ``ckpt trace --target``).

NOTE [ Trace targets ]
    What autograd saves depends on the kernels that run, and PyTorch picks
    some kernels by device. ``F.scaled_dot_product_attention`` is the large
    case: on the CPU it runs the CPU flash kernel (it saves the output and a
    logsumexp) unless dropout is on; on CUDA the flash, cuDNN or
    memory-efficient kernel (output, an fp32 logsumexp, the RNG seed and
    offset); on ``meta`` nothing is fused and the math path runs, which
    saves S x S fp32 score matrices no real device keeps (``hf:llama-tiny``,
    bf16, batch 2, seq 1024: store-all 140.3 MiB traced on meta, 44.6 MiB on
    the CPU). Dropout is the second: out of place on CUDA it is
    ``native_dropout`` (a bool mask), elsewhere a mask in the input's dtype.

    So every trace names its target (:class:`Target`, ``graph.meta["target"]``):
    ``cpu``, ``cuda`` (:data:`~scheduler.tracing.roofline.DEFAULT_DEVICE`) or
    a named GPU of :data:`~scheduler.tracing.roofline.DEVICES`. By default a
    trace plans for the device its model is on; a ``meta`` model plans for
    CUDA (logged, and recorded in the graph). The target also prices the
    roofline (it replaces ``cost_device``), sets the graph's RNG-state bytes
    and says where op workspaces can be measured. How the kernels follow it:

    * a ``cpu`` target runs the fake tensors on the CPU: a ``meta`` model's
      parameters, inputs and constants become fake CPU tensors, and device
      constants the tracer recorded (``torch.export`` writes
      ``device=meta`` into ``arange``) are read as ``cpu``, so every op
      decomposes as on a CPU, SDPA and dropout included;
    * a CUDA target cannot do that on a CPU-only build (a fake CUDA tensor
      that requires grad aborts the process), so the tensors stay where
      they are and the two ops whose CUDA kernels differ are replaced where
      they are called: SDPA by the kernel PyTorch's CUDA dispatch picks for
      the target's compute capability, dtype, head size, mask, dropout and
      grouped heads (``scheduler.tracing.attention``), called through its
      ATen op, whose meta function gives its outputs and whose autograd
      formula saves what that kernel saves; dropout by ``native_dropout``
      (except on a real CUDA model, where it already is).

    Checked and equal across devices (no replacement): linear/matmul, conv
    (the inputs and weight are saved; workspaces differ and are measured
    only on the target's own kernels), layer norm (the meta function's fp32
    mean and rstd are CUDA's; a real CPU keeps them in the input's dtype),
    batch norm (cuDNN's reserve space is empty for plain batch norm),
    embedding, softmax and cross entropy. Not modelled: the math path's own
    dropout on CUDA (math is CUDA's last resort) and fused RMSNorm kernels.
    ``tests/scheduler/tracing/test_target.py`` holds meta traces targeting
    the CPU to CPU traces and counts the flash kernel's saved bytes by hand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from graphs import TARGET_META, CkptError

from .calibration import cpu_peaks
from .roofline import DEFAULT_DEVICE, DEVICES, DevicePeaks, lookup_device

__all__ = ["Target", "TargetError", "CAPABILITY", "TARGET_META", "resolve_target", "target_peaks", "fake_device", "meta_branch_message",
           "TargetKernels", "describe_targets", "check_target_for_costs", "rng_state_bytes"]

log = logging.getLogger(__name__)

#: CUDA compute capability of each named GPU (what SDPA's CUDA dispatch checks).
CAPABILITY: dict[str, tuple[int, int]] = {
    "A100-40GB": (8, 0), "A100-80GB": (8, 0), "H100": (9, 0), "H200": (9, 0), "L4": (8, 9), "RTX4090": (8, 9),
    "RTX3090": (8, 6)}


class TargetError(CkptError, ValueError):
    """A target that cannot be planned for here (the message says which and what to pass)."""


@dataclass(frozen=True)
class Target:
    """The device a trace plans for (NOTE [ Trace targets ]).

    Attributes:
        device: ``cpu``, a name of ``DEVICES`` (``H100``), or a real GPU's own name when the table lacks it.
        kind: ``cpu`` or ``cuda``.
        capability: the CUDA compute capability (``(9, 0)``); None for the CPU.
        reason: why this target: the model's device, the default for a meta model, or the caller's choice.
    """

    device: str
    kind: str
    capability: tuple[int, int] | None = None
    reason: str = ""

    def to_meta(self) -> dict[str, Any]:
        """What ``graph.meta["target"]`` records."""
        out: dict[str, Any] = {"device": self.device, "kind": self.kind, "reason": self.reason}
        if self.capability is not None:
            out["capability"] = f"{self.capability[0]}.{self.capability[1]}"
        return out

    def describe(self) -> str:
        """``H100 (CUDA sm90, the default for a meta model)``."""
        if self.kind == "cpu":
            return f"cpu ({self.reason})" if self.reason else "cpu"
        sm = f"sm{self.capability[0]}{self.capability[1]}" if self.capability else "CUDA"
        return f"{self.device} (CUDA {sm}{', ' + self.reason if self.reason else ''})"


def describe_targets() -> str:
    """The values ``--target`` takes, for help texts and errors."""
    return f"cpu, cuda (= {DEFAULT_DEVICE}), or a GPU: {', '.join(DEVICES)}"


def _named_gpu(name: str, reason: str) -> Target:
    peaks = lookup_device(name)
    if peaks is None:
        raise TargetError(f"unknown target {name!r}; plan for {describe_targets()}")
    return Target(peaks.name, "cuda", CAPABILITY[peaks.name], reason)


def _local_gpu(device: torch.device, reason: str) -> Target:
    """The real GPU the model is on: its table name when known, else its own name and capability."""
    name = torch.cuda.get_device_name(device)
    peaks = lookup_device(name)
    capability = tuple(torch.cuda.get_device_capability(device))
    return Target(peaks.name if peaks else name, "cuda", capability, reason)  # type: ignore[arg-type]


def resolve_target(target: str | None, device: torch.device) -> Target:
    """The target of a trace of a model on ``device`` (NOTE [ Trace targets ]).

    Args:
        target: ``cpu``, ``cuda``, a GPU name (``H100``, ``a100-80gb``, what
            ``torch.cuda.get_device_name`` reports), or None: the model's
            device (``cuda`` for a ``meta`` model).
        device: where the model's parameters and inputs are.

    Raises:
        TargetError: an unknown name (the message lists the known ones).
    """
    if target is None:
        if device.type == "cpu":
            return Target("cpu", "cpu", None, "the model's device")
        if device.type == "cuda":
            return _local_gpu(device, "the model's device")
        chosen = _named_gpu(DEFAULT_DEVICE, f"the default for a {device.type} model")
        log.info("planning for %s: pass target= (--target) to plan for %s", chosen.describe(), describe_targets())
        return chosen
    text = str(target).strip()
    if text.lower() == "cpu":
        return Target("cpu", "cpu", None, f"target={text!r}")
    if text.lower() == "cuda":
        if device.type == "cuda":
            return _local_gpu(device, f"target={text!r}")
        return _named_gpu(DEFAULT_DEVICE, f"target={text!r}")
    return _named_gpu(text, f"target={text!r}")


def target_peaks(target: Target) -> DevicePeaks:
    """The roofline's device for ``target``: the measured CPU, or the GPU's table entry (else the default's)."""
    if target.kind == "cpu":
        return cpu_peaks()
    peaks = DEVICES.get(target.device)
    if peaks is None:
        log.warning("no peaks known for GPU %r; costing for %s (pass target= to choose)", target.device, DEFAULT_DEVICE)
        return DEVICES[DEFAULT_DEVICE]
    return peaks


def fake_device(target: Target, device: torch.device) -> torch.device | None:
    """The device the tracer's fake tensors of a model on ``device`` live on: the CPU for a
    ``meta`` model traced for the CPU; None (where the model is) otherwise."""
    if target.kind == "cpu" and device.type == "meta":
        return torch.device("cpu")
    return None


def meta_branch_message(model: Any, target: Target, exc: BaseException) -> str:
    """Why a ``meta`` model traced for the CPU failed where its graph runs on fake CPU tensors (:func:`fake_device`):
    the graph was captured on ``meta``, so a forward that reads its device took meta's branch (transformers' MoE
    routing calls ``histc`` on ints unless the device is the CPU, which the CPU's kernel refuses)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (f"{type(model).__name__} built on meta could not be traced for {target.describe()}: an op of the graph "
            f"captured on meta fails on the CPU ({first}). Its forward may take another branch on meta than on the "
            "CPU (it reads the device). Build the model on the CPU to trace it for the CPU, or trace the meta model "
            "for the GPU you plan for (target='H100')")


class TargetKernels(TorchFunctionMode):
    """Calls made as the target device would make them (NOTE [ Trace targets ]).

    Args:
        target: the trace's target.
        moved: the device fake tensors were moved to from ``meta`` (device
            constants naming ``meta`` are read as it), or None.
        real_cuda: the fake tensors are CUDA tensors (a real GPU's dispatch
            already picks CUDA's dropout).
    """

    def __init__(self, target: Target, moved: torch.device | None = None, real_cuda: bool = False):
        super().__init__()
        self.target = target
        self.moved = moved
        self.real_cuda = real_cuda
        self.attention: dict[str, int] = {}  # kernel -> calls (graph.meta["target"]["attention"])
        self._replace: dict[Any, Callable[..., Any]] = {}
        if target.kind == "cuda":
            from . import attention

            for fn in attention.SDPA_FUNCTIONS:
                self._replace[fn] = self._sdpa
            if not real_cuda:
                for fn in attention.DROPOUT_FUNCTIONS:
                    self._replace[fn] = attention.cuda_dropout

    def _sdpa(self, *args: Any, **kwargs: Any) -> Any:
        from .attention import cuda_sdpa

        out, kernel = cuda_sdpa(self.target.capability or CAPABILITY[DEFAULT_DEVICE], *args, **kwargs)
        self.attention[kernel] = self.attention.get(kernel, 0) + 1
        return out

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.moved is not None:
            args, kwargs = pytree.tree_map_only(torch.device, self._device, (args, kwargs))
        replace = self._replace.get(func)
        if replace is not None:
            return replace(*args, **kwargs)
        return func(*args, **kwargs)

    def _device(self, d: torch.device) -> torch.device:
        return self.moved if d.type == "meta" else d  # type: ignore[return-value]


def check_target_for_costs(target: Target, device: torch.device, costs: str) -> None:
    """``costs="time"`` measures this machine: the target must be the model's own device."""
    if costs != "time":
        return
    if device.type == "meta":
        raise TargetError("costs='time' times the forward on this machine, and a model on the meta device runs "
                          "nothing: use costs='roofline' (the default) to price it for its target")
    if target.kind != device.type:
        raise TargetError(f"costs='time' times this machine's {device.type}; it cannot price a trace for "
                          f"{target.describe()}: use costs='roofline', or trace the model where it runs")


def rng_state_bytes(target: Target) -> int:
    """Bytes of the generator state a stochastic region stores, in the target's memory (NOTE [ RNG state
    per region ] in ``solvers.model.terms``): the CPU generator's state on a CPU; 0 on CUDA (the states
    ``preserve_rng_state`` stores are host tensors, outside the GPU's memory)."""
    return int(torch.get_rng_state().numel()) if target.kind == "cpu" else 0
