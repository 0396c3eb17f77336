"""ModelConfig parsing and the RoPE building blocks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sglang_pd.models.config import ModelConfig
from sglang_pd.models.layers import RotaryEmbedding, apply_rope, rope_inv_freq

BASE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rope_theta": 500000.0,
    "eos_token_id": 7,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024,
}


def test_defaults_and_derived_fields() -> None:
    cfg = ModelConfig.from_dict(BASE, {"eos_token_id": [9, 7]})
    assert cfg.head_dim == 32 and cfg.q_size == 256 and cfg.kv_size == 64
    assert cfg.eos_token_ids == (7, 9)  # config first, generation_config appended, no duplicates
    assert cfg.rope_scaling is None and cfg.torch_dtype == torch.float32
    assert not (cfg.qkv_bias or cfg.o_bias or cfg.qk_norm or cfg.tie_word_embeddings)
    assert ModelConfig.from_dict({**BASE, "head_dim": 64}).head_dim == 64


def test_family_flags() -> None:
    assert ModelConfig.from_dict({**BASE, "attention_bias": True}).o_bias
    qwen2 = ModelConfig.from_dict({**BASE, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm
    qwen3 = ModelConfig.from_dict(
        {**BASE, "architectures": ["Qwen3ForCausalLM"], "attention_bias": False}
    )
    assert qwen3.qk_norm and not qwen3.qkv_bias


def test_rope_parameters_new_format_matches_old() -> None:
    old = ModelConfig.from_dict({**BASE, "rope_scaling": {**LLAMA3, "type": "llama3"}})
    new = ModelConfig.from_dict(
        {
            **{k: v for k, v in BASE.items() if k != "rope_theta"},
            "rope_parameters": {**LLAMA3, "rope_theta": 500000.0},
        }
    )
    assert old.rope_theta == new.rope_theta == 500000.0
    assert old.rope_scaling == new.rope_scaling == LLAMA3
    plain = ModelConfig.from_dict(
        {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    )
    assert plain.rope_scaling is None and plain.rope_theta == 1e4


@pytest.mark.parametrize(
    "patch,error",
    [
        ({"architectures": ["GPT2LMHeadModel"]}, r"supported: \['LlamaForCausalLM'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope type 'yarn'.*'llama3'"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"torch_dtype": "float8"}, "torch_dtype 'float8'"),
    ],
)
def test_unsupported_configs_are_explained(patch: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ModelConfig.from_dict({**BASE, **patch})


def test_missing_key_is_named() -> None:
    cfg = {k: v for k, v in BASE.items() if k != "intermediate_size"}
    with pytest.raises(ValueError, match="'intermediate_size'"):
        ModelConfig.from_dict(cfg)


@pytest.mark.parametrize("scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 2.0}])
def test_inv_freq_matches_transformers(scaling: dict[str, Any] | None) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = transformers.LlamaConfig(
        **{k: v for k, v in BASE.items() if k != "architectures"},
        rope_scaling=dict(scaling) if scaling else None,
    )
    rope_type = scaling["rope_type"] if scaling else "default"
    if rope_type == "default":
        want = 1.0 / (500000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
    else:
        want, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, "cpu")
    got = rope_inv_freq(32, 500000.0, scaling)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    if rope_type == "llama3":  # all three llama3 regimes are exercised by this config
        ratio = got / rope_inv_freq(32, 500000.0, None)
        assert (ratio == 1).any() and (ratio == 0.25).any() and ((ratio > 0.25) & (ratio < 1)).any()


def test_rope_rotates_pairs_of_halves() -> None:
    rope = RotaryEmbedding(head_dim=4, max_positions=16, theta=10000.0, scaling=None)
    pos = torch.tensor([0, 3])
    cos, sin = rope.cos_sin(pos, torch.float32)
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]], [[1.0, 2.0, 3.0, 4.0]]])
    out = apply_rope(x, cos, sin)
    torch.testing.assert_close(out[0], x[0])  # position 0: identity
    angle = 3 * torch.tensor([1.0, 1.0 / 100.0])  # inv_freq = theta^(-2i/d) for i = 0, 1
    c, s = angle.cos(), angle.sin()
    want = torch.cat(
        [
            torch.tensor([1.0, 2.0]) * c - torch.tensor([3.0, 4.0]) * s,
            torch.tensor([3.0, 4.0]) * c + torch.tensor([1.0, 2.0]) * s,
        ]
    )
    torch.testing.assert_close(out[1, 0], want)
    # positions past the table are rejected on the host by the model runner, never in the
    # forward (a device sync): test_forward_host_sync.py
