"""The device a trace plans for (NOTE [ Trace targets ] in ``scheduler.tracing.target``,
NOTE [ CUDA attention dispatch ] in ``scheduler.tracing.attention``)."""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scheduler.cli import main
from scheduler.models import build
from scheduler.tracing.tracer import TraceError, capture
from scheduler.tracing.attention import cuda_sdpa_backend
from scheduler.tracing.roofline import DEVICES
from scheduler.tracing.target import CAPABILITY
from solvers import store_all_peak

transformers = pytest.importorskip("transformers")


# --------------------------------------------- meta traces for the CPU = CPU traces
def _tiny(name):
    """``(model, kwargs, loss)`` on the CPU: the zoo's attention models and three more, at tiny sizes."""
    from benchmarks import zoo

    torch.manual_seed(0)
    if name in ("bert", "t5", "vit"):
        model, _, kwargs, loss = getattr(zoo, name)()
        kwargs.pop("attention_mask", None)  # on meta its values are unknown: transformers would keep the mask
        small = {}  # ids and labels stay one tensor where they were
        return model, {k: small.setdefault(id(v), (v[:2, :32] if v.dim() == 2 else v[:2]).clone())
                       for k, v in kwargs.items()}, loss
    if name == "llama":
        ex = build("hf:llama-tiny", batch=2, seq=32)
        return ex.model, ex.kwargs, ex.loss
    if name == "gpt2":  # attention dropout 0.1: the CPU runs SDPA's math path
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=64)
        ids = torch.randint(0, 500, (2, 32))
        return transformers.GPT2LMHeadModel(cfg).train(), {"input_ids": ids, "labels": ids}, zoo._loss
    cfg = transformers.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     vocab_size=500, num_mel_bins=16, max_source_positions=32,
                                     max_target_positions=32, decoder_start_token_id=1, pad_token_id=0)
    kwargs = {"input_features": torch.randn(2, 16, 64), "labels": torch.randint(2, 500, (2, 16))}
    return transformers.WhisperForConditionalGeneration(cfg).train(), kwargs, zoo._loss


def _on_meta(model, kwargs):
    """The same model built on ``meta`` (``.to("meta")`` would untie tied weights) and the same inputs there."""
    with torch.device("meta"):
        twin = type(model)(model.config).train()
    moved = {}
    return twin, {k: moved.setdefault(id(v), v.to("meta")) for k, v in kwargs.items()}  # ids == labels: one tensor


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "t5", "vit", "whisper"])
def test_a_meta_trace_for_the_cpu_is_the_cpu_trace(name):
    model, kwargs, loss = _tiny(name)
    fast = dict(check=False, workspaces="none")  # both measured alike (test_targets_default_... checks workspaces)
    on_cpu = capture(model, (), kwargs, loss=loss, **fast).graph
    twin, meta_kwargs = _on_meta(model, kwargs)
    for_cpu = capture(twin, (), meta_kwargs, loss=loss, target="cpu", **fast).graph
    assert for_cpu.meta["target"]["kind"] == "cpu" and for_cpu.rng_state_bytes == on_cpu.rng_state_bytes > 0
    assert store_all_peak(for_cpu).peak_bytes == pytest.approx(store_all_peak(on_cpu).peak_bytes, rel=0.02)


# ------------------------------------------ what each CUDA kernel saves, by hand
class _Attention(nn.Module):
    """One attention: x -> q, k, v (one linear) -> SDPA -> sum."""

    def __init__(self, width, heads, *, kv_heads=None, mask=None, dropout=0.0, causal=False):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads or heads, width // heads
        self.qkv = nn.Linear(width, width + 2 * self.kv * self.d)
        self.mask, self.dropout, self.causal = mask, dropout, causal

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.kv * self.d, self.kv * self.d], -1)
        q = q.view(b, s, self.h, self.d).transpose(1, 2)
        k, v = (t.view(b, s, self.kv, self.d).transpose(1, 2) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=self.dropout,
                                             is_causal=self.causal, enable_gqa=self.kv != self.h)
        return out.sum()


B, S, H, W = 2, 40, 4, 64  # head size 16; S not a multiple of 32 (the memory-efficient logsumexp pads)


def _sdpa_node(target, dtype, **kw):
    with torch.device("meta"):
        model = _Attention(W, H, **kw).to(dtype)
    x = torch.randn(B, S, W, device="meta", dtype=dtype)
    graph = capture(model, (x,), granularity="op", target=target).graph
    (node,) = [nd for nd in graph.nodes if "scaled_dot_product_attention" in nd.op]
    qkv = next(nd for nd in graph.nodes if nd.module == "qkv" and nd.out_bytes)
    return graph, node, qkv


def _blocks(*storages: int) -> int:
    """Bytes of these storages on a card: each a whole 512-B block of the caching allocator (NOTE [ CUDA blocks ])."""
    return sum(-(-n // 512) * 512 for n in storages)


@pytest.mark.parametrize("target, dtype, kw, kernel, own", [
    # flash: logsumexp [B, H, S] fp32, rng_state uint64[2], unused uint64[] (its ATen signature)
    ("A100-80GB", torch.bfloat16, {"causal": True}, "flash", (B * H * S * 4, 2 * 8, 8)),
    ("A100-80GB", torch.float16, {"kv_heads": 2, "causal": True}, "flash", (B * H * S * 4, 2 * 8, 8)),
    ("H100", torch.bfloat16, {"dropout": 0.1}, "flash", (B * H * S * 4, 2 * 8, 8)),  # 0.1 is no 1/16: not cuDNN
    # memory-efficient: logsumexp [B, H, ceil(S/32)*32] fp32, seed and offset int64[] each
    ("A100-80GB", torch.float32, {}, "efficient", (B * H * 64 * 4, 8, 8)),
    # ... with a boolean mask: the additive mask it makes in the query's dtype is saved too
    ("A100-80GB", torch.bfloat16, {"mask": "bool"}, "efficient", (B * H * 64 * 4, 8, 8, S * S * 2)),
    # cuDNN (preferred on sm90): logsumexp [B, H, S, 1] fp32, seed and offset int64[] each
    ("H100", torch.bfloat16, {}, "cudnn", (B * H * S * 4, 8, 8)),
])
def test_a_cuda_target_saves_what_the_kernel_signature_saves(target, dtype, kw, kernel, own):
    if kw.get("mask") == "bool":
        kw = dict(kw, mask=torch.ones(S, S, dtype=torch.bool, device="meta").tril())
    graph, node, qkv = _sdpa_node(target, dtype, **kw)
    assert graph.meta["target"]["attention"] == {kernel: 1}
    assert node.out_bytes == _blocks(B * H * S * (W // H) * dtype.itemsize)  # the output, saved (the kernel's `out`)
    assert node.saves_output and set(node.saves_inputs) == {qkv.name}  # q, k, v: views of the projection
    assert node.saved_bytes == _blocks(*own)


def test_a_cpu_target_runs_the_cpu_flash_kernel_on_meta():
    graph, node, _ = _sdpa_node("cpu", torch.bfloat16, causal=True)
    assert node.saved_bytes == B * H * S * 4 and "flash_attention_for_cpu" in " ".join(node.dispatch)


def test_cudas_last_resort_is_the_math_path_which_saves_the_scores():
    with torch.device("meta"):
        model = _Attention(24, H)  # fp32 head size 6: no fused CUDA kernel takes it
    graph = capture(model, (torch.randn(B, S, 24, device="meta"),), granularity="op", target="A100-80GB").graph
    (node,) = [nd for nd in graph.nodes if "scaled_dot_product_attention" in nd.op]
    assert graph.meta["target"]["attention"] == {"math": 1} and node.saved_bytes >= B * H * S * S * 4


def _meta(*shape, dtype=torch.bfloat16, grad=True):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


@pytest.mark.parametrize("gpu, q, k, kw, kernel", [
    ("A100-80GB", (2, 8, 64, 64), (2, 8, 64, 64), {}, "flash"),
    ("A100-80GB", (2, 8, 64, 64), (2, 2, 64, 64), {"enable_gqa": True}, "flash"),
    ("A100-80GB", (2, 8, 64, 12), (2, 8, 64, 12), {}, "flash"),  # head size padded to 16
    ("A100-80GB", (2, 8, 64, 264), (2, 8, 64, 264), {}, "efficient"),  # flash stops at 256
    ("A100-80GB", (2, 8, 64, 64), (2, 8, 32, 64), {"is_causal": True}, "efficient"),  # causal, S_q != S_k
    ("A100-80GB", (2, 8, 64, 64), (2, 2, 64, 64), {"enable_gqa": True, "attn_mask": "mask"}, "math"),
    ("A100-80GB", (8, 64, 64), (8, 64, 64), {}, "math"),  # not 4-D
    ("RTX3090", (2, 8, 64, 200), (2, 8, 64, 200), {}, "efficient"),  # sm86 trains flash only to 192
    ("H100", (2, 8, 64, 64), (2, 8, 64, 64), {"dropout_p": 0.125}, "cudnn"),
    ("H100", (2, 8, 64, 64), (2, 8, 64, 64), {"dropout_p": 0.1}, "flash"),
])
def test_cuda_dispatch_order_and_checks(gpu, q, k, kw, kernel):
    if kw.get("attn_mask") == "mask":
        kw = dict(kw, attn_mask=torch.empty(q[-2], k[-2], dtype=torch.bool, device="meta"))
    assert cuda_sdpa_backend(CAPABILITY[gpu], _meta(*q), _meta(*k), _meta(*k), **kw) == kernel


#: What ``torch.ops.aten._fused_sdp_choice`` chose on an NVIDIA H200 (torch 2.11.0+cu130, 2026-12-04; the
#: GPU suite's diagnostics): q [2, 16, 256, 64], k and v with 16 heads or (GQA) 4, no mask, no dropout, causal
#: or not. 2 = memory-efficient, 0 = math, 3 = cuDNN.
H200_CHOICES = {(torch.float32, False): "efficient", (torch.float32, True): "math",
                (torch.bfloat16, False): "cudnn", (torch.bfloat16, True): "cudnn"}


@pytest.mark.parametrize("dtype, gqa", list(H200_CHOICES))
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_dispatch_is_what_an_h200_chose(dtype, gqa, causal):
    q = _meta(2, 16, 256, 64, dtype=dtype)
    kv = _meta(2, 4 if gqa else 16, 256, 64, dtype=dtype)
    got = cuda_sdpa_backend(CAPABILITY["H200"], q, kv, kv, is_causal=causal, enable_gqa=gqa)
    assert got == H200_CHOICES[dtype, gqa]


def test_a_meta_llama_for_a_gpu_runs_the_kernel_its_eager_forward_would():
    """transformers skips a causal mask it does not need and then passes grouped heads to SDPA (enable_gqa), which
    in fp32 only the math kernel takes on CUDA; the trace must decide as eager does, not as export does (which
    keeps the mask, repeats the heads and picks the memory-efficient kernel: a Llama planned so on meta measured
    16.2 GB on an H200 for a 6.7 GB prediction)."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).train()
    ids = torch.zeros(2, 64, dtype=torch.long, device="meta")
    graph = capture(model, (), {"input_ids": ids, "labels": ids}, loss=lambda out: out.loss, target="H200").graph
    assert graph.meta["target"]["attention"] == {"math": 2}


def test_mask_decisions_read_tracing_as_eager_in_older_transformers_too():
    """transformers 5.17 asks ``is_tracing(padding_mask)`` (true under export even for no mask); 5.2x asks
    ``is_torchdynamo_exporting()``. With no mask, either answers as in eager while the decision runs."""
    import types

    from scheduler.tracing.eager_branches import _as_eager_without_values

    for names in (("is_tracing",), ("is_torchdynamo_exporting", "is_tracing")):
        masking = types.SimpleNamespace(**{n: (lambda *a, **k: True) for n in names})

        def decide(padding_mask, *rest, masking=masking, names=names):
            return not any(getattr(masking, n)(padding_mask) if n == "is_tracing" else getattr(masking, n)()
                           for n in names)

        wrapped = _as_eager_without_values(masking, False, "_ignore_causal_mask_sdpa", decide)
        assert wrapped(None) is True  # skipped, as eager skips it
        assert wrapped(torch.ones(2, 4)) is False  # a mask with values: the library's own decision
        assert all(getattr(masking, n)(None) is True for n in names)  # put back


def test_fp32_alignment_and_every_named_gpu_has_a_capability():
    assert set(CAPABILITY) == set(DEVICES)
    a100 = CAPABILITY["A100-80GB"]
    assert cuda_sdpa_backend(a100, *(_meta(2, 4, 32, 8, dtype=torch.float32) for _ in range(3))) == "efficient"
    assert cuda_sdpa_backend(a100, *(_meta(2, 4, 32, 6, dtype=torch.float32) for _ in range(3))) == "math"


# ----------------------------------------------------------------- dropout
def test_dropout_saves_a_bool_mask_on_cuda_and_an_input_dtype_mask_on_the_cpu():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.1), nn.Linear(32, 1))
    x = torch.randn(16, 32, device="meta")
    own = {}
    for target in ("cuda", "cpu"):
        graph = capture(model, (x,), granularity="op", target=target).graph
        (drop,) = [nd for nd in graph.nodes if nd.stochastic]
        own[target] = drop.saved_bytes
    assert own == {"cuda": 16 * 32 * 1, "cpu": 16 * 32 * 4}


# ---------------------------------------------------- defaults, names, errors
def test_targets_default_to_the_models_device_and_cuda_on_meta(caplog):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(4, 8)
    on_cpu = capture(model, (x,)).graph
    assert on_cpu.meta["target"] == {"device": "cpu", "kind": "cpu", "reason": "the model's device"}
    assert on_cpu.rng_state_bytes == torch.get_rng_state().numel()
    model.to("meta")
    with caplog.at_level(logging.INFO, logger="scheduler.tracing.target"):
        on_meta = capture(model, (x.to("meta"),)).graph
    assert on_meta.meta["target"]["device"] == "H100" and "default for a meta model" in caplog.text
    assert on_meta.meta["costs"]["device"] == "H100" and on_meta.rng_state_bytes == 0
    assert on_meta.fingerprint() == capture(model, (x.to("meta"),), target="H200").graph.fingerprint()
    for_cpu = capture(model, (x.to("meta"),), target="cpu").graph
    assert for_cpu.meta["workspaces"] == "cpu" and for_cpu.rng_state_bytes == on_cpu.rng_state_bytes


def test_cost_device_is_the_former_name_of_target_and_errors_say_what_to_pass():
    model, x = nn.Linear(8, 1), torch.randn(4, 8)
    assert capture(model, (x,), cost_device="L4").graph.meta["target"]["device"] == "L4"
    with pytest.raises(TraceError, match="cost_device is the former name of target"):
        capture(model, (x,), target="H100", cost_device="L4")
    with pytest.raises(TraceError, match="unknown target 'tpu'.*cpu, cuda.*RTX3090"):
        capture(model, (x,), target="tpu")
    with pytest.raises(TraceError, match="workspaces='measure' runs the target's kernels"):
        capture(model, (x,), target="cuda", workspaces="measure")
    assert "workspaces" not in capture(model, (x,), target="cuda").graph.meta  # auto: none to run here


def test_cli_trace_says_what_it_plans_for(capsys):
    gpt = ["trace", "gpt", "--layers", "1", "--width", "32", "--heads", "2", "--seq", "16", "--device", "meta"]
    code = main(gpt)
    assert code == 0 and "planned for: H100 (CUDA sm 9.0; the default for a meta model" in capsys.readouterr().out
    code = main(gpt + ["--cost-device", "a100-40gb"])  # the former flag
    assert code == 0 and "planned for: A100-40GB (CUDA sm 8.0; target='a100-40gb'" in capsys.readouterr().out


def test_a_plan_for_one_kind_of_device_is_refused_on_another_with_the_fix():
    import solvers

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.1), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    x = torch.randn(16, 32, device="meta")
    for_cuda = capture(model, (x,), granularity="op").graph
    for_cpu = capture(model, (x,), granularity="op", target="cpu").graph
    plan = solvers.solve(for_cuda, solvers.store_all_peak(for_cuda).peak_bytes, solver="dp")
    plan.check_graph(capture(model, (x,), granularity="op", target="A100-40GB").graph)  # same kernels: accepted
    with pytest.raises(solvers.PlanMismatch, match="solved for H100 and this graph is traced for cpu.*--target cpu"):
        plan.check_graph(for_cpu)
