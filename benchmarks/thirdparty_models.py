"""The models of ``benchmarks/thirdparty.py``: each as its library builds it, with its batch, loss and reload.

Small configs with random weights (offline), dropout or stochastic depth on
where the model has it; image models at shapes whose activations exceed their
parameters' bytes where that stays quick, so that a plan can beat store-all.
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Case", "CASES", "QUICK", "LOSS_NAMES"]

BATCH, SEQ, SIDE = 2, 32, 32

@dataclasses.dataclass(frozen=True)
class Case:
    """One model as its library ships it.

    Attributes:
        library: the distribution the model needs (skipped when it does not import).
        build: the model with random weights, as its library builds it.
        inputs: ``(args, kwargs, target)``: a batch and the loss's target (None where the model computes its loss).
        loss: ``loss(output, target) -> scalar``.
        reload: the model as the library reloads saved weights (``from_pretrained``: eval mode),
            given the built model and a scratch folder.
    """

    library: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[tuple, dict, Any]]
    loss: Callable[[Any, Any], torch.Tensor]
    reload: Callable[[nn.Module, Path], nn.Module]


def _model_loss(out: Any, target: Any) -> torch.Tensor:
    return out.loss


def _classify(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target)


def _regress(out: Any, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(getattr(out, "sample", out), target)


#: Why the models trained with ``F.mse_loss`` run over their predictions (not fixed: see the report).
LOSS_NAMES = {_model_loss: "out.loss", _classify: "F.cross_entropy", _regress: "F.mse_loss"}


def _from_pretrained(model: nn.Module, folder: Path) -> nn.Module:
    """transformers and diffusers: ``save_pretrained`` then ``from_pretrained`` (which returns eval mode)."""
    model.save_pretrained(folder)
    return type(model).from_pretrained(folder)


def _state_dict_reload(build: Callable[[], nn.Module]) -> Callable[[nn.Module, Path], nn.Module]:
    """timm, torchvision, monai, smp: build, ``load_state_dict`` of the saved weights, ``eval()``."""
    def reload(model: nn.Module, folder: Path) -> nn.Module:
        torch.save(model.state_dict(), folder / "weights.pt")
        fresh = build()
        fresh.load_state_dict(torch.load(folder / "weights.pt"))
        return fresh.eval()
    return reload


def _hf(config: str, cls: str, inputs: Callable[[Any], dict], **kw: Any) -> Case:
    def build() -> nn.Module:
        import transformers
        return getattr(transformers, cls)(getattr(transformers, config)(**kw))

    def batch() -> tuple[tuple, dict, Any]:
        import transformers
        return (), inputs(getattr(transformers, config)(**kw)), None
    return Case("transformers", build, batch, _model_loss, _from_pretrained)


def _causal(cfg: Any) -> dict:
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    return {"input_ids": ids, "labels": ids}


def _seq2seq(cfg: Any) -> dict:
    return {"input_ids": torch.randint(0, cfg.vocab_size, (BATCH, SEQ)),
            "labels": torch.randint(0, cfg.vocab_size, (BATCH, SEQ // 2))}


def _pixels(cfg: Any) -> dict:
    return {"pixel_values": torch.randn(BATCH, 3, cfg.image_size, cfg.image_size), "labels": torch.randint(0, cfg.num_labels, (BATCH,))}


def _image_case(library: str, build: Callable[[], nn.Module], *, classes: int | None = 10, side: int = SIDE * 2,
                batch_size: int = BATCH) -> Case:
    """A model called on an image batch: classes -> cross entropy on labels, None -> MSE against an image."""
    def batch() -> tuple[tuple, dict, Any]:
        x = torch.randn(batch_size, 3, side, side)
        target = torch.randint(0, classes, (batch_size,)) if classes else torch.randn(batch_size, 2, side, side)
        return (x,), {}, target
    return Case(library, build, batch, _classify if classes else _regress, _state_dict_reload(build))


def _timm(name: str, side: int, batch_size: int, **kw: Any) -> Case:
    def build() -> nn.Module:
        import timm
        return timm.create_model(name, pretrained=False, num_classes=10, **kw)
    return _image_case("timm", build, side=side, batch_size=batch_size)


def _torchvision() -> Case:
    def build() -> nn.Module:
        import torchvision
        return torchvision.models.resnet18(weights=None, num_classes=10)
    return _image_case("torchvision", build, side=SIDE * 4, batch_size=4)


def _diffusers() -> Case:
    def build() -> nn.Module:
        from diffusers import UNet2DModel
        return UNet2DModel(sample_size=SIDE // 2, in_channels=3, out_channels=3, block_out_channels=(16, 32),
                           layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                           up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, dropout=0.1)

    def batch() -> tuple[tuple, dict, Any]:
        side = SIDE // 2
        return (torch.randn(BATCH, 3, side, side), torch.tensor([10, 500])), {}, torch.randn(BATCH, 3, side, side)
    return Case("diffusers", build, batch, _regress, _from_pretrained)


_GPT2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=SEQ * 2, use_cache=False)


def _peft() -> Case:
    """A LoRA adapter (dropout 0.1) on GPT-2's attention; the base frozen, as ``get_peft_model`` leaves it."""
    def config() -> Any:
        from peft import LoraConfig
        return LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.1, fan_in_fan_out=True)

    def build() -> nn.Module:
        import transformers
        from peft import get_peft_model
        return get_peft_model(transformers.GPT2LMHeadModel(transformers.GPT2Config(**_GPT2)), config())

    def reload(model: nn.Module, folder: Path) -> nn.Module:  # the usual start: a pretrained base, a new adapter
        import transformers
        from peft import get_peft_model
        transformers.GPT2LMHeadModel(transformers.GPT2Config(**_GPT2)).save_pretrained(folder)
        return get_peft_model(transformers.GPT2LMHeadModel.from_pretrained(folder), config())

    def batch() -> tuple[tuple, dict, Any]:
        return (), _causal(types.SimpleNamespace(**_GPT2)), None
    return Case("peft", build, batch, _model_loss, reload)


_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=500, max_position_embeddings=SEQ * 4)


def _peft_prefix() -> Case:
    """peft's prefix tuning on Llama: every decoder layer gets a key/value cache filled with the trained prefix
    (NOTE [ Filled caches replayed ] in ``scheduler.applying.caches``), the base frozen."""
    def config() -> Any:
        from peft import PrefixTuningConfig
        return PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8)

    def build() -> nn.Module:
        import transformers
        from peft import get_peft_model
        return get_peft_model(transformers.LlamaForCausalLM(transformers.LlamaConfig(**_LLAMA)), config())

    def reload(model: nn.Module, folder: Path) -> nn.Module:
        import transformers
        from peft import get_peft_model
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**_LLAMA)).save_pretrained(folder)
        return get_peft_model(transformers.LlamaForCausalLM.from_pretrained(folder), config())

    def batch() -> tuple[tuple, dict, Any]:
        return (), _causal(types.SimpleNamespace(**_LLAMA)), None
    return Case("peft", build, batch, _model_loss, reload)


def _speech(cfg: Any) -> dict:
    return {"input_features": torch.randn(BATCH, cfg.num_mel_bins, 2 * cfg.max_source_positions),
            "labels": torch.randint(3, cfg.vocab_size, (BATCH, SEQ // 2))}


def _monai() -> Case:
    def build() -> nn.Module:
        from monai.networks.nets import BasicUNet
        return BasicUNet(spatial_dims=2, in_channels=3, out_channels=2, features=(8, 8, 16, 32, 64, 8), dropout=0.1)
    return _image_case("monai", build, classes=None)


def _smp() -> Case:
    def build() -> nn.Module:
        import segmentation_models_pytorch as smp
        return smp.Unet("resnet18", encoder_weights=None, classes=2)
    return _image_case("segmentation_models_pytorch", build, classes=None)


CASES: dict[str, Callable[[], Case]] = {
    "gpt2": lambda: _hf("GPT2Config", "GPT2LMHeadModel", _causal, **_GPT2),
    "llama": lambda: _hf("LlamaConfig", "LlamaForCausalLM", _causal, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                         attention_dropout=0.1, use_cache=False),
    "bert": lambda: _hf("BertConfig", "BertForMaskedLM", _causal, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128, vocab_size=500),
    "t5": lambda: _hf("T5Config", "T5ForConditionalGeneration", _seq2seq, d_model=64, d_ff=128, num_layers=2,
                      num_heads=4, d_kv=16, vocab_size=500, decoder_start_token_id=0, pad_token_id=0),
    # use_cache as shipped (on): a region drops the cache (NOTE [ Caches under recompute ]), the trace keeps it
    "gpt-neox": lambda: _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", _causal, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, vocab_size=500),
    "qwen3": lambda: _hf("Qwen3Config", "Qwen3ForCausalLM", _causal, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=500),
    "mixtral": lambda: _hf("MixtralConfig", "MixtralForCausalLM", _causal, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, vocab_size=500),
    "vit": lambda: _hf("ViTConfig", "ViTForImageClassification", _pixels, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=128, image_size=SIDE * 2, patch_size=8, num_labels=10,
                       hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
    # activations above the parameters' bytes, or no plan beats store-all (ViT-S: 86 MB of weights)
    "timm-vit-s": lambda: _timm("vit_small_patch16_224", SIDE * 4, 4, img_size=SIDE * 4, drop_rate=0.1,
                                attn_drop_rate=0.1, drop_path_rate=0.1),
    "timm-resnet50": lambda: _timm("resnet50", SIDE * 4, 4, drop_path_rate=0.1),
    "timm-convnext": lambda: _timm("convnext_atto", SIDE * 2, BATCH, drop_path_rate=0.1),
    "timm-efficientnet": lambda: _timm("efficientnet_b0", SIDE * 2, BATCH, drop_path_rate=0.1),
    "tv-resnet18": _torchvision,
    "diffusers-unet": _diffusers,
    "whisper": lambda: _hf("WhisperConfig", "WhisperForConditionalGeneration", _speech, vocab_size=500, d_model=64,
                           encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                           encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=SEQ,
                           max_target_positions=SEQ, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[]),
    "peft-lora": _peft,
    "peft-prefix": _peft_prefix,
    "monai-basicunet": _monai,
    "smp-unet": _smp,
}
QUICK = ("gpt2",)
