"""ModelConfig: the subset of a HF config.json that our models need, validated once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# architectures entry -> family flags. The model class for each lives in registry.py.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    # None for plain RoPE, else a dict with "rope_type" ("linear" or "llama3") and its params
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    o_bias: bool  # bias on o_proj (Llama with attention_bias only)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # config.json's, then generation_config.json's, deduplicated
    torch_dtype: torch.dtype  # the checkpoint's dtype (what "auto" would load)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_pretrained(cls, model_path: str | Path) -> ModelConfig:
        path = Path(model_path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"no config.json in model directory {path}")
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        gen_file = path / "generation_config.json"
        gen = json.loads(gen_file.read_text(encoding="utf-8")) if gen_file.is_file() else {}
        return cls.from_dict(cfg, gen)

    @classmethod
    def from_dict(
        cls, cfg: dict[str, Any], generation_config: dict[str, Any] | None = None
    ) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported model architecture {archs!r} (config.json 'architectures'); "
                f"supported: {list(SUPPORTED_ARCHITECTURES)}"
            )

        def req(key: str) -> Any:
            if key not in cfg:
                raise ValueError(f"config.json of {arch} is missing required key {key!r}")
            return cfg[key]

        hidden, heads = int(req("hidden_size")), int(req("num_attention_heads"))
        head_dim = cfg.get("head_dim") or hidden // heads
        if cfg.get("head_dim") is None and hidden % heads:
            raise ValueError(
                f"hidden_size {hidden} is not divisible by num_attention_heads {heads}"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r}; supported: ['silu']")
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=true is not supported")
        if cfg.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window=true) is not supported")
        theta, scaling = _rope_params(cfg)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        attention_bias = bool(cfg.get("attention_bias", False))
        eos = _eos_ids(cfg.get("eos_token_id")) + _eos_ids(
            (generation_config or {}).get("eos_token_id")
        )
        dtype_name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
        if dtype_name not in _DTYPES:
            raise ValueError(
                f"unsupported torch_dtype {dtype_name!r}; supported: {sorted(_DTYPES)}"
            )
        return cls(
            architecture=arch,
            model_type=str(cfg.get("model_type", "")),
            hidden_size=hidden,
            num_layers=int(req("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate_size=int(req("intermediate_size")),
            vocab_size=int(req("vocab_size")),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=(not is_qwen2) and attention_bias,
            qk_norm=arch == "Qwen3ForCausalLM",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(dict.fromkeys(eos)),
            torch_dtype=_DTYPES[dtype_name],
            raw=cfg,
        )


def _eos_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _rope_params(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    # transformers >= 5 writes "rope_parameters" (theta inside); older files "rope_theta" and
    # "rope_scaling" (which may also say "type" instead of "rope_type").
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling: dict[str, Any] | None = dict(params)
    else:
        theta = float(cfg.get("rope_theta", 10000.0))
        scaling = dict(cfg["rope_scaling"]) if cfg.get("rope_scaling") else None
    if scaling is None:
        return theta, None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope type {rope_type!r}; supported: {list(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    scaling.pop("type", None)
    scaling.pop("rope_theta", None)
    scaling["rope_type"] = rope_type
    return theta, scaling
