"""HF ``architectures`` name -> model class."""

from __future__ import annotations

from torch import nn

from sglang_pd.models.config import SUPPORTED_ARCHITECTURES
from sglang_pd.models.llama import LlamaForCausalLM

# Qwen2/Qwen3 are the Llama implementation with ModelConfig flags (qkv_bias, qk_norm).
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}
assert set(MODEL_REGISTRY) == set(SUPPORTED_ARCHITECTURES)


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"unsupported model architecture {architecture!r}; supported: {sorted(MODEL_REGISTRY)}"
        )
    return MODEL_REGISTRY[architecture]
