"""Write config.json (+ generation_config.json) with the real shapes of a known model.

    python -m sglang_pd.tools.make_dummy_config {smollm2-135m,qwen2.5-0.5b,llama-3-8b} OUT

No weights and no tokenizer: the directory is meant for ``load_format="dummy"`` (random weights
from a fixed seed), to benchmark and size real model shapes without downloading checkpoints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_LLAMA_COMMON: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "pretraining_tp": 1,
    "rope_scaling": None,
    "use_cache": True,
}

PRESETS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        **_LLAMA_COMMON,
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "initializer_range": 0.041666666666666664,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": 24,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    "llama-3-8b": {
        **_LLAMA_COMMON,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
}


def make_dummy_config(preset: str, out_dir: str | Path) -> Path:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; supported: {sorted(PRESETS)}")
    cfg = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}
    (out / "generation_config.json").write_text(
        json.dumps(gen, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out_dir")
    args = ap.parse_args(argv)
    print(make_dummy_config(args.preset, args.out_dir))


if __name__ == "__main__":
    main()
