"""The tiny test models: byte-identical everywhere, loadable, with a working tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from model_helpers import TINY_ARCHS, build_tiny_models
from sglang_pd.models.config import ModelConfig
from sglang_pd.tools.make_tiny_model import CHAT_TEMPLATE, IM_END_ID, SPECIAL_TOKENS, TinySpec

# sha256 of every file make_tiny_model writes. If you change the generator, the corpus or a
# dependency changes its output format, regenerate these and say why in the commit.
_SHARED = {
    "tokenizer.json": "ebd8e340cf69da9a827a5c6dda60b696a45e4dc570c321db66c22421ffa67a97",
    "tokenizer_config.json": "f9414e6ef4d33223ca6b70f7a1a4a87818979761a56e20a7ad07adba04d329de",
    "special_tokens_map.json": "3c46466384202c6d77330e0065906689abd4a89a6de0d572748f694f439b311b",
    "generation_config.json": "d66ea78f026b3fd867da89c6701c915bcc48bce8727169b0d0434100ea7e4f76",
}
EXPECTED_SHA256: dict[str, dict[str, str]] = {
    "llama": {
        **_SHARED,
        "config.json": "96be97b757caf98ebb55a0269ea2d932019a2ca65024028936615226cd428144",
        "model.safetensors": "66de483ddaab1e6837429429c85bfe6fb60ffd01631775a5da6dc6df97587c29",
    },
    "qwen2": {
        **_SHARED,
        "config.json": "12c80ff6235a8cb70eb37c1f775a001f030b795bac04e444390a47f9019b5176",
        "model.safetensors": "e61399f7599e214f857e1bebb7b0be8c70f5eabf53639cd082b45638325f104c",
    },
    "qwen3": {
        **_SHARED,
        "config.json": "4b7c133f37414fc2b351845f1a261e69f49e2c5659ea261d18ccb55efc93e506",
        "model.safetensors": "1fa3d638e755763174119b4cea76dd2596d8ac8602494a3134fb4cc4d4cc2404",
    },
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_checksums(tiny: dict[str, Path], arch: str) -> None:
    files = {p.name: _sha256(p) for p in sorted(tiny[arch].iterdir())}
    assert files == EXPECTED_SHA256[arch]


def test_same_bytes_in_a_fresh_process(tmp_path: Path) -> None:
    # Tokenizer training is the part most likely to vary (threads, hash seeds).
    import subprocess
    import sys

    out = tmp_path / "again"
    subprocess.run(
        [sys.executable, "-m", "sglang_pd.tools.make_tiny_model", str(out), "--arch", "qwen2"],
        check=True,
        capture_output=True,
        env={"PYTHONHASHSEED": "123", "RAYON_NUM_THREADS": "2", **_base_env()},
    )
    assert {p.name: _sha256(p) for p in out.iterdir()} == EXPECTED_SHA256["qwen2"]


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "RAYON_NUM_THREADS")}


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_config_shapes(tiny: dict[str, Path], arch: str) -> None:
    cfg = ModelConfig.from_pretrained(tiny[arch])
    spec = TinySpec()
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        spec.hidden_size,
        spec.num_layers,
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
    )
    assert cfg.vocab_size == spec.vocab_size and cfg.max_position_embeddings == 4096
    assert cfg.eos_token_ids == (IM_END_ID, 0)
    assert cfg.qkv_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    assert cfg.tie_word_embeddings == (arch != "llama")
    assert (cfg.rope_scaling or {}).get("rope_type") == ("llama3" if arch == "llama" else None)


def test_tokenizer_round_trips(tiny: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny["llama"] / "tokenizer.json"))
    assert tok.get_vocab_size() == TinySpec().vocab_size
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i
    texts = [
        "Hello, my name is Nora. The future of computing is small.",
        "def add(a, b):\n    return a + b\n",
        "Unicode survives byte-level BPE: café, naïve, 東京, emoji 🙂, tabs\tand  spaces.",
        "<|im_start|>user\nHi<|im_end|>\n",
    ]
    for text in texts:
        ids = tok.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
    # common words are single tokens: the corpus is varied enough for a real vocabulary
    assert len(tok.encode(" the river and the mountain").ids) == 5
    assert tok.encode("<|im_end|>").ids == [IM_END_ID]


def test_chat_template_renders(tiny: dict[str, Path]) -> None:
    import jinja2

    cfg = json.loads((tiny["llama"] / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHAT_TEMPLATE and cfg["eos_token"] == "<|im_end|>"
    template = jinja2.Environment().from_string(cfg["chat_template"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert template.render(messages=messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(messages=messages[1:], add_generation_prompt=False) == (
        "<|im_start|>user\nHi there<|im_end|>\n"
    )
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert template.render(messages=parts) == "<|im_start|>user\nab<|im_end|>\n"


def test_transformers_loads_tokenizer_and_template(tiny: dict[str, Path]) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(tiny["qwen3"])
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (
        "<|im_end|>",
        "<|endoftext|>",
        "<|endoftext|>",
    )
    ids = tok("Hello world")["input_ids"]
    assert tok.decode(ids) == "Hello world"  # no BOS/EOS added
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
