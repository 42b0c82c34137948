"""Attention and dropout as PyTorch runs them on a CUDA device, traced on any device (NOTE [ Trace targets ]).

NOTE [ CUDA attention dispatch ]
    ``F.scaled_dot_product_attention`` is one composite op; on CUDA it runs
    the first of an ordered list of kernels whose checks pass (PyTorch's
    ``select_sdp_backend``, ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``):
    cuDNN first on sm90 and sm10x (``check_prefer_cudnn_attention``: CUDA 13
    wheels with cuDNN 9.15 or later; this table assumes such a build), then
    flash, memory-efficient, math. :func:`cuda_sdpa_backend` applies those
    checks to the shapes, strides, dtypes and flags of the call for a given
    compute capability (dense tensors; the build's kernels all compiled in;
    no backend disabled by the user); :func:`cuda_sdpa` then does what the
    composite does around the chosen kernel (head size padded to a multiple
    of 8 for flash, a boolean mask made additive, the mask padded for the
    memory-efficient kernel) and calls the kernel's ATen op. Their meta
    functions give the outputs (logsumexp in fp32: ``[B, H, S]`` for flash,
    ``[B, H, ceil(S/32)*32]`` memory-efficient, ``[B, H, S, 1]`` cuDNN; the
    Philox seed and offset), and autograd's formula for the op saves exactly
    what that kernel keeps for its backward.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["SDPA_FUNCTIONS", "DROPOUT_FUNCTIONS", "cuda_sdpa_backend", "cuda_sdpa", "cuda_dropout"]

aten = torch.ops.aten

#: What a model calls for attention: the functional (a builtin) and the op ``torch.export`` records.
SDPA_FUNCTIONS = (F.scaled_dot_product_attention, aten.scaled_dot_product_attention.default)
#: Out-of-place dropout as modules and graphs call it (``nn.Dropout`` calls ``F.dropout``).
DROPOUT_FUNCTIONS = (F.dropout, torch.dropout, aten.dropout.default)

_HALF = (torch.float16, torch.bfloat16)


def _sm(cap: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= tuple(cap) <= high


def _dense_4d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return q.dim() == k.dim() == v.dim() == 4 and q.shape[-2] > 0 and k.shape[-2] > 0


def _heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool, same_kv: bool) -> bool:
    """``check_batch_size_and_num_heads_dense`` with grouped heads supported."""
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        return False
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if not gqa:
        return hq == hk == hv
    if same_kv and hk != hv:
        return False
    return hq % hk == 0 and hq % hv == 0


def _last_stride_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     ignore_singleton: bool) -> bool:
    ok = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if ignore_singleton:
        ok = ok or q.shape[-1] == 1
    return ok and (mask is None or mask.stride(-1) == 1)


def _mask_shape(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """``check_attn_mask_shape`` (cuDNN)."""
    if mask is None:
        return True
    if mask.requires_grad or mask.shape[-2] not in (q.shape[2], 1) or mask.shape[-1] not in (k.shape[2], 1):
        return False
    if mask.dim() == 2:
        return True
    return mask.dim() == 4 and mask.shape[0] in (1, q.shape[0]) and mask.shape[1] in (1, q.shape[1])


def _cudnn(cap, q, k, v, mask, dropout_p, is_causal, gqa, grad) -> bool:  # noqa: ANN001
    if not (cap[0] in (9, 10) and _sm(cap, (8, 0), (12, 1))):  # preferred only there; else after math
        return False
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return False
    if not (_dense_4d(q, k, v) and q.dtype in _HALF and q.dtype == k.dtype == v.dtype):
        return False
    if not (_mask_shape(q, k, mask) and dropout_p * 16.0 == math.floor(dropout_p * 16.0)):
        return False
    if not (_last_stride_one(q, k, v, mask, True) and _heads(q, k, v, gqa, same_kv=False)):
        return False
    d_qk, d_v, s_q, s_k = q.shape[3], v.shape[3], q.shape[2], k.shape[2]
    if q.shape[0] > 65535 or q.shape[1] > 65535 or d_qk > 256 or d_v > 256 or d_qk % 8 or d_v % 8:
        return False
    if s_k == 1 or (dropout_p != 0.0 and s_q == 1):
        return False
    return not grad or (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))


def _flash(cap, q, k, v, mask, dropout_p, is_causal, gqa, grad) -> bool:  # noqa: ANN001
    if mask is not None or not _dense_4d(q, k, v):
        return False
    d = q.shape[-1]
    if not (d == k.shape[-1] == v.shape[-1] and d <= 256 and _sm(cap, (8, 0), (12, 1))):
        return False
    if grad and (_sm(cap, (8, 6), (8, 9)) or _sm(cap, (12, 0), (12, 1))) and not (d <= 192 or (dropout_p == 0 and d > 224)):
        return False
    if is_causal and q.shape[-2] != k.shape[-2]:
        return False
    if not (q.dtype in _HALF and q.dtype == k.dtype == v.dtype):
        return False
    return _heads(q, k, v, gqa, same_kv=True) and _last_stride_one(q, k, v, None, True)


def _gemm_alignment(cap: tuple[int, int], dtype: torch.dtype) -> int:
    """``minimum_gemm_alignment``: elements a head size must be a multiple of for the memory-efficient kernel."""
    half = dtype in _HALF
    tensor_cores = cap[0] >= 8 or (cap[0] >= 7 and half)
    align = 4 if cap[0] >= 8 else 1
    return max(align, 128 // (16 if half else 32)) if tensor_cores else align


def _efficient(cap, q, k, v, mask, dropout_p, is_causal, gqa, grad) -> bool:  # noqa: ANN001
    if not (_sm(cap, (5, 0), (12, 1)) and _dense_4d(q, k, v)):
        return False
    align = _gemm_alignment(cap, q.dtype)
    d, dv = q.shape[-1], v.shape[-1]
    if not (d == k.shape[-1] and d % align == 0 and dv % align == 0 and d > 0 and dv > 0):
        return False
    if cap[0] >= 8 and any(t.storage_offset() % align for t in (q, k, v)):
        return False
    if not (_last_stride_one(q, k, v, mask, False) and _heads(q, k, v, False, same_kv=True)):
        return False  # grouped heads: this torch's kernel (its backward) takes equal head counts only
    allowed = (torch.float16, torch.float32, torch.bfloat16) if cap[0] >= 8 else (torch.float16, torch.float32)
    return q.dtype in allowed and q.dtype == k.dtype == v.dtype


#: The CUDA kernels in dispatch order (NOTE [ CUDA attention dispatch ]).
_ORDER = (("cudnn", _cudnn), ("flash", _flash), ("efficient", _efficient))


def cuda_sdpa_backend(capability: tuple[int, int], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                      enable_gqa: bool = False) -> str:
    """The kernel SDPA runs on a CUDA device of ``capability``: ``cudnn``, ``flash``, ``efficient`` or ``math``."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    for name, usable in _ORDER:
        if usable(tuple(capability), query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, grad):
            return name
    return "math"


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the composite makes it additive (``convert_boolean_attn_mask``)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask, 0.0, torch.scalar_tensor(-math.inf, dtype=dtype, device=mask.device))


def _padded_bias(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask``: strides aligned to 8 elements (else padded, then sliced back), expanded to 4-D."""
    aligned = mask.stride(-1) == 1 and all(mask.stride(i) % 8 == 0 for i in range(mask.dim() - 1))
    if not aligned:
        last = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def cuda_sdpa(capability: tuple[int, int], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False) -> tuple[torch.Tensor, str]:
    """``F.scaled_dot_product_attention`` through the kernel CUDA picks: ``(output, kernel name)``."""
    kernel = cuda_sdpa_backend(capability, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if kernel == "flash":
        d = query.shape[-1]
        og_scale = scale if scale is not None else 1.0 / math.sqrt(d)
        pad = (8 - d % 8) % 8
        q, k, v = (F.pad(t, (0, pad)) if pad else t for t in (query, key, value))
        out = aten._scaled_dot_product_flash_attention.default(q, k, v, dropout_p, is_causal, False, scale=og_scale)[0]
        return (out[..., :d] if pad else out), kernel
    mask = _additive(attn_mask, query.dtype)
    if kernel == "cudnn":
        out = aten._scaled_dot_product_cudnn_attention.default(query, key, value, mask, grad, dropout_p, is_causal,
                                                               False, scale=scale)[0]
        return out, kernel
    if kernel == "efficient":
        bias = None if mask is None else _padded_bias(mask, query, key)
        out = aten._scaled_dot_product_efficient_attention.default(query, key, value, bias, grad, dropout_p,
                                                                   is_causal, scale=scale)[0]
        return out, kernel
    out = aten._scaled_dot_product_attention_math.default(query, key, value, mask, dropout_p, is_causal, None,
                                                          scale=scale, enable_gqa=enable_gqa)[0]
    return out, kernel


def cuda_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *,
                 train: bool | None = None) -> torch.Tensor:
    """Dropout as on CUDA: out of place, training and ``0 < p < 1``, ``native_dropout`` (a bool mask);
    otherwise what ``F.dropout`` does everywhere (in place it uses the input's dtype on CUDA too)."""
    training = training if train is None else train
    if training and not inplace and 0.0 < p < 1.0 and input.numel() > 0:
        return aten.native_dropout.default(input, p, True)[0]
    return F.dropout(input, p, training, inplace)
