"""Write a tiny, deterministic Hugging Face checkpoint directory for tests and demos.

    python -m sglang_pd.tools.make_tiny_model OUT --arch {llama,qwen2,qwen3}

The directory is a real HF model (config.json, generation_config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with a ChatML chat template, special_tokens_map.json),
loadable by transformers and by sglang_pd. Every file is byte-identical on every machine:
weights come from numpy's PCG64 stream through exact float32 arithmetic, the byte-level BPE
tokenizer is trained on the corpus shipped in ``tools/corpus``, and JSON is written with sorted
keys. test/unit/test_tiny_model.py pins a sha256 of every file.

The random weights are shaped so that greedy decoding is robust and informative:
- logits are widely spread (final norm weight scaled up), so the top-1 / top-2 gap dwarfs
  float32 noise and greedy parity against transformers is not flaky;
- embeddings are small next to what the layers add to the residual stream, so tied models
  do not simply predict the current token again and generations depend on the context;
- q/k projections are scaled up so attention is peaked and position-dependent, which makes
  RoPE, masking and KV-cache bugs change the output instead of hiding in a uniform average.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SEED = 20240601
CORPUS_DIR = Path(__file__).parent / "corpus"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

# ChatML. Content may be a string or a list of OpenAI-style parts (only text parts render).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class TinySpec:
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 688
    vocab_size: int = 6144
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6


@dataclass(frozen=True)
class ArchSpec:
    hf_class: str
    model_type: str
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    extra: tuple[tuple[str, Any], ...] = ()


ARCHS: dict[str, ArchSpec] = {
    # llama3 rope scaling with original_max 1024 puts the 16 RoPE frequencies of head_dim 32
    # in all three regimes (kept, smoothly interpolated, divided by factor).
    "llama": ArchSpec(
        "LlamaForCausalLM",
        "llama",
        500000.0,
        tie_word_embeddings=False,
        qkv_bias=False,
        qk_norm=False,
        extra=(
            (
                "rope_scaling",
                {
                    "rope_type": "llama3",
                    "factor": 4.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 1024,
                },
            ),
            ("attention_bias", False),
            ("mlp_bias", False),
            ("pretraining_tp", 1),
        ),
    ),
    "qwen2": ArchSpec(
        "Qwen2ForCausalLM",
        "qwen2",
        1000000.0,
        tie_word_embeddings=True,
        qkv_bias=True,
        qk_norm=False,
        extra=(("use_sliding_window", False), ("sliding_window", 4096), ("max_window_layers", 4)),
    ),
    "qwen3": ArchSpec(
        "Qwen3ForCausalLM",
        "qwen3",
        1000000.0,
        tie_word_embeddings=True,
        qkv_bias=False,
        qk_norm=True,
        extra=(
            ("attention_bias", False),
            ("use_sliding_window", False),
            ("sliding_window", None),
            ("max_window_layers", 4),
        ),
    ),
}


def _dump_json(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def train_tokenizer(vocab_size: int) -> str:
    """Train the byte-level BPE on the shipped corpus; returns tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Sorted files, fixed order. BPE merge ties are broken by token id, so the result does not
    # depend on thread count or hash seeds (checked by generating in separate processes).
    texts = [p.read_text(encoding="utf-8") for p in sorted(CORPUS_DIR.glob("*.txt"))]
    if not texts:
        raise FileNotFoundError(f"no corpus *.txt files in {CORPUS_DIR}")
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"corpus too small: BPE reached {tok.get_vocab_size()} tokens, wanted {vocab_size}"
        )
    return tok.to_str(pretty=True)


def _uniform(
    rng: np.random.Generator, shape: tuple[int, ...], std: float, mean: float = 0.0
) -> np.ndarray:
    # float32 uniform in [mean - a, mean + a) with the given std; exact float32 arithmetic only,
    # so the bytes do not depend on the platform's libm.
    a = np.float32(std * math.sqrt(3.0))
    u = rng.random(shape, dtype=np.float32)
    return (u * np.float32(2.0) - np.float32(1.0)) * a + np.float32(mean)


def make_weights(spec: TinySpec, arch: ArchSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    qd, kvd = spec.num_heads * d, spec.num_kv_heads * d
    w: dict[str, np.ndarray] = {}
    embed_std = 0.02
    w["model.embed_tokens.weight"] = _uniform(rng, (spec.vocab_size, h), embed_std)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = _uniform(rng, (h,), 0.1, 1.0)
        # 2x gain on q and k: attention scores of std ~4, i.e. peaked attention.
        w[p + "self_attn.q_proj.weight"] = _uniform(rng, (qd, h), 2.0 / math.sqrt(h))
        w[p + "self_attn.k_proj.weight"] = _uniform(rng, (kvd, h), 2.0 / math.sqrt(h))
        w[p + "self_attn.v_proj.weight"] = _uniform(rng, (kvd, h), 1.0 / math.sqrt(h))
        if arch.qkv_bias:
            # big enough that a dropped bias changes every logit, small enough that the
            # constant v bias does not push all outputs towards a few tokens
            w[p + "self_attn.q_proj.bias"] = _uniform(rng, (qd,), 0.3)
            w[p + "self_attn.k_proj.bias"] = _uniform(rng, (kvd,), 0.3)
            w[p + "self_attn.v_proj.bias"] = _uniform(rng, (kvd,), 0.1)
        if arch.qk_norm:
            # q/k are RMS-normalised per head; weights ~2 restore the peaked scores.
            w[p + "self_attn.q_norm.weight"] = _uniform(rng, (d,), 0.3, 2.0)
            w[p + "self_attn.k_norm.weight"] = _uniform(rng, (d,), 0.3, 2.0)
        w[p + "self_attn.o_proj.weight"] = _uniform(rng, (h, qd), 1.0 / math.sqrt(qd))
        w[p + "post_attention_layernorm.weight"] = _uniform(rng, (h,), 0.1, 1.0)
        w[p + "mlp.gate_proj.weight"] = _uniform(rng, (inter, h), 1.0 / math.sqrt(h))
        w[p + "mlp.up_proj.weight"] = _uniform(rng, (inter, h), 1.0 / math.sqrt(h))
        w[p + "mlp.down_proj.weight"] = _uniform(rng, (h, inter), 1.0 / math.sqrt(inter))
    # logits std ~ embed_std * sqrt(hidden) * norm_scale ~ 0.02 * 16 * 40 ~ 13.
    w["model.norm.weight"] = _uniform(rng, (h,), 4.0, 40.0)
    if not arch.tie_word_embeddings:
        w["lm_head.weight"] = _uniform(rng, (spec.vocab_size, h), embed_std)
    return w


def make_config(spec: TinySpec, arch: ArchSpec) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "torch_dtype": "float32",
        "use_cache": True,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "pad_token_id": ENDOFTEXT_ID,
    }
    cfg.update(dict(arch.extra))
    return cfg


def _tokenizer_files(out: Path, tokenizer_json: str, spec: TinySpec) -> None:
    (out / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    _dump_json(
        {
            "add_bos_token": False,
            "add_eos_token": False,
            "added_tokens_decoder": added,
            "additional_special_tokens": [SPECIAL_TOKENS[1], SPECIAL_TOKENS[2]],
            "bos_token": SPECIAL_TOKENS[0],
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": SPECIAL_TOKENS[2],
            "errors": "replace",
            "model_max_length": spec.max_position_embeddings,
            "pad_token": SPECIAL_TOKENS[0],
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None,
        },
        out / "tokenizer_config.json",
    )
    _dump_json(
        {
            "additional_special_tokens": [SPECIAL_TOKENS[1], SPECIAL_TOKENS[2]],
            "bos_token": SPECIAL_TOKENS[0],
            "eos_token": SPECIAL_TOKENS[2],
            "pad_token": SPECIAL_TOKENS[0],
        },
        out / "special_tokens_map.json",
    )


def make_tiny_model(
    out_dir: str | Path, arch: str = "llama", tokenizer_json: str | None = None,
    spec: TinySpec | None = None,
) -> Path:
    """Write the tiny ``arch`` model into ``out_dir`` (created if needed); returns its path.

    ``tokenizer_json`` lets a caller building several archs train the tokenizer once
    (``train_tokenizer(TinySpec().vocab_size)``); it is the same for every arch. ``spec``
    changes the shapes (e.g. ``TinySpec(num_kv_heads=1)``: fewer KV heads than tensor-parallel
    ranks); the pinned hashes hold for the default only.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; supported: {sorted(ARCHS)}")
    from safetensors.numpy import save_file

    spec, aspec = spec or TinySpec(), ARCHS[arch]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _dump_json(make_config(spec, aspec), out / "config.json")
    _dump_json(
        {
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
            "pad_token_id": ENDOFTEXT_ID,
        },
        out / "generation_config.json",
    )
    seed = SEED + sorted(ARCHS).index(arch)
    save_file(
        make_weights(spec, aspec, seed), str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    _tokenizer_files(out, tokenizer_json or train_tokenizer(spec.vocab_size), spec)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--arch", default="llama", choices=sorted(ARCHS))
    args = ap.parse_args(argv)
    print(make_tiny_model(args.out_dir, args.arch))


if __name__ == "__main__":
    main()
