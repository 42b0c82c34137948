"""A stand-in for this machine's CPU measurement (NOTE [ CPU calibration ] in ``scheduler.tracing.calibration``)."""

import copy

#: What the stand-in measures, at any thread count.
FAKE_CPU = {"flops_per_s": {"float32": 1e11, "bfloat16": 2e11, "float16": 2e11}, "bytes_per_s": 2e10,
            "op_overhead_s": 3e-6, "random_per_s": 1e8, "class_bytes_per_s": {"gelu": 5e9, "softmax": 4e9}}


def figures(scale=1.0, bf16=None, overhead=3e-6):
    """:data:`FAKE_CPU` with its rates scaled (bf16's set), and the per-op overhead."""
    fig = copy.deepcopy(FAKE_CPU)
    fig["flops_per_s"] = {k: v * scale for k, v in fig["flops_per_s"].items()}
    if bf16 is not None:
        fig["flops_per_s"]["bfloat16"] = bf16
    fig["bytes_per_s"] *= scale
    fig["class_bytes_per_s"] = {k: v * scale for k, v in fig["class_bytes_per_s"].items()}
    fig["op_overhead_s"] = overhead
    return fig
