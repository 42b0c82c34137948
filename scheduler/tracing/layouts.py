"""The memory layouts the target's kernels give, where torch's fake kernels give another.

NOTE [ Kernel layouts ]
    A trace runs on fake tensors, whose strides come from torch's meta
    kernels and decompositions. Where one of those lays out its output
    otherwise than the target's real kernel, every op downstream sees another
    layout in the trace than at run time, and whatever depends on the layout
    is measured wrong: which convolution backward reorders its arguments
    (a copy held inside the call, NOTE [ Op workspaces ]), whether
    ``AccumulateGrad`` copies a weight's gradient to the weight's strides.

    Known case: CPU group norm. The CPU kernel writes ``native_group_norm``'s
    output, and ``native_group_norm_backward``'s input gradient, in the
    input's suggested memory format (channels-last in, channels-last out);
    torch 2.14's decomposition (``torch._refs.native_group_norm``) returns a
    contiguous output (torch 2.13's does not). diffusers' UNet2DModel makes
    channels-last-strided activations (an attention's output reshaped back
    to an image) and normalises them: traced with torch 2.14, its 8-region
    plan measured 65,736 B above ``simulate`` (a ConvolutionBackward0
    reordering a channels-last gradient the trace had seen contiguous).

    :class:`KernelLayouts` runs below the recorder's modes, just above the
    fake mode, and gives such outputs the target kernel's strides (a fresh
    fake tensor; values mean nothing on fake tensors), so the watch, the
    workspace probe and autograd all see the run's layouts. It only acts
    when a rule's layout differs from the fake one (a no-op on a torch whose
    meta kernel agrees) and only for a CPU target: CUDA's group norm is not
    checked on a GPU here. ``tests/regressions/test_group_norm_layout.py`` compares the
    trace's strides with the real CPU kernels' op by op.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["KernelLayouts", "CPU_LAYOUT_RULES"]


def _input_format(x: torch.Tensor) -> torch.memory_format:
    """What ``Tensor::suggest_memory_format()`` answers for a strided tensor."""
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


def _like_input(position: int, source: int) -> Callable[[tuple, Any], Any]:
    """A rule: output ``position`` is laid out in the suggested format of argument ``source``."""

    def rule(args: tuple, out: Any) -> Any:
        x, y = args[source], out[position]
        fmt = _input_format(x)
        if not isinstance(y, torch.Tensor) or y.is_contiguous(memory_format=fmt):
            return out
        fixed = torch.empty_like(y, memory_format=fmt)
        return tuple(fixed if i == position else o for i, o in enumerate(out))

    return rule


#: op -> rule, for the CPU's kernels (NOTE [ Kernel layouts ]).
CPU_LAYOUT_RULES: dict[Any, Callable[[tuple, Any], Any]] = {
    torch.ops.aten.native_group_norm.default: _like_input(0, 0),
    # (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask): grad_input follows the input
    torch.ops.aten.native_group_norm_backward.default: _like_input(0, 1),
}


class KernelLayouts(TorchDispatchMode):
    """Gives the outputs of ``rules``' ops the target kernel's layout (NOTE [ Kernel layouts ])."""

    def __init__(self, rules: dict[Any, Callable[[tuple, Any], Any]]) -> None:
        super().__init__()
        self.rules = rules
        self.fixed = 0  # outputs given another layout than the fake kernel's

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        rule = self.rules.get(func)
        if rule is None:
            return out
        new = rule(args, out)
        if new is not out:
            self.fixed += 1
        return new


def layouts_for(kind: str) -> KernelLayouts | None:
    """The layout mode for a target of ``kind`` ("cpu", "cuda"...), or None where no rule is known."""
    return KernelLayouts(CPU_LAYOUT_RULES) if kind == "cpu" else None
