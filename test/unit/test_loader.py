"""load_model: safetensors mapping and its errors, sharded checkpoints, dummy weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model_helpers import PagedRequests, build_tiny_models, make_pool
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.torch_backend import TorchAttnBackend
from sglang_pd.models import load_model
from sglang_pd.models.config import ModelConfig
from sglang_pd.tools.make_dummy_config import PRESETS, make_dummy_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


def _copy_with(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """Copy a model dir, passing its tensors through edit(dict) -> dict."""
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    save_file(edit(tensors), str(dst / "model.safetensors"))
    return dst


def _logits(model, cfg, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    reqs = PagedRequests(
        make_pool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim), TorchAttnBackend()
    )
    with torch.inference_mode():
        return model(reqs.batch(ForwardMode.EXTEND, {0: ids}))


def test_missing_tensor_is_named(tiny: dict[str, Path], tmp_path: Path) -> None:
    name = "model.layers.2.mlp.up_proj.weight"
    bad = _copy_with(
        tiny["llama"], tmp_path / "m", lambda t: {k: v for k, v in t.items() if k != name}
    )
    with pytest.raises(
        ValueError, match=r"missing 1 tensor\(s\): model\.layers\.2\.mlp\.up_proj\.weight"
    ):
        load_model(bad, torch.float32)


def test_missing_bias_is_named(tiny: dict[str, Path], tmp_path: Path) -> None:
    name = "model.layers.0.self_attn.k_proj.bias"
    bad = _copy_with(
        tiny["qwen2"], tmp_path / "m", lambda t: {k: v for k, v in t.items() if k != name}
    )
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_model(bad, torch.float32)


def test_unexpected_tensor_is_named(tiny: dict[str, Path], tmp_path: Path) -> None:
    extra = "model.layers.7.mlp.up_proj.weight"
    bad = _copy_with(tiny["llama"], tmp_path / "m", lambda t: {**t, extra: torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"does not use: model\.layers\.7\.mlp\.up_proj\.weight"):
        load_model(bad, torch.float32)


def test_wrong_shape_is_named(tiny: dict[str, Path], tmp_path: Path) -> None:
    name = "model.norm.weight"
    bad = _copy_with(tiny["llama"], tmp_path / "m", lambda t: {**t, name: torch.ones(7)})
    with pytest.raises(ValueError, match=r"'model\.norm\.weight'.*shape \(7,\).*\(256,\)"):
        load_model(bad, torch.float32)


def test_unsupported_architecture(tiny: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(tiny["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MixtralForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ValueError, match=r"MixtralForCausalLM.*supported: .*LlamaForCausalLM.*Qwen3ForCausalLM"
    ):
        load_model(d, torch.float32)


def test_bad_load_format_and_missing_checkpoint(tmp_path: Path) -> None:
    d = make_dummy_config("smollm2-135m", tmp_path / "cfg")
    with pytest.raises(ValueError, match=r"load_format 'pt'.*\['auto', 'dummy'\]"):
        load_model(d, torch.float32, load_format="pt")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors.*load_format='dummy'"):
        load_model(d, torch.float32)


def test_sharded_checkpoint_and_tied_lm_head_copy(tiny: dict[str, Path], tmp_path: Path) -> None:
    src = tiny["qwen2"]
    d = tmp_path / "sharded"
    d.mkdir()
    for f in ("config.json", "generation_config.json"):
        shutil.copy(src / f, d / f)
    tensors = load_file(str(src / "model.safetensors"))
    # exporters sometimes write lm_head.weight even for tied models; it must be accepted
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(d / fname))
        weight_map.update(dict.fromkeys(keys, fname))
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    sharded, cfg = load_model(d, torch.float32)
    single, _ = load_model(src, torch.float32)
    for (name, a), (_, b) in zip(sharded.state_dict().items(), single.state_dict().items()):
        assert torch.equal(a, b), name
    ids = [5, 17, 300, 41, 9]
    # the weights are bit-equal (above); the forward need not be: CPU matmul kernels may take
    # other vector paths for differently aligned buffers (atol=0 failed now and then)
    torch.testing.assert_close(
        _logits(sharded, cfg, ids), _logits(single, cfg, ids), atol=1e-6, rtol=1e-6
    )


def test_bfloat16_load(tiny: dict[str, Path]) -> None:
    model, cfg = load_model(tiny["qwen3"], "bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not any(p.requires_grad for p in model.parameters())
    ref, _ = load_model(tiny["qwen3"], torch.float32)
    ids = list(range(100, 120))
    got, want = _logits(model, cfg, ids), _logits(ref, cfg, ids)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()


def test_dummy_load_from_config_only_dir(tmp_path: Path) -> None:
    d = make_dummy_config("smollm2-135m", tmp_path / "smol")
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "generation_config.json"]
    model, cfg = load_model(d, torch.float32, load_format="dummy")
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # SmolLM2-135M, tied
    logits = _logits(model, cfg, [1, 2, 3, 4, 5, 6, 7])
    assert logits.shape == (1, 49152) and torch.isfinite(logits).all()
    again, _ = load_model(d, torch.float32, load_format="dummy")  # fixed seed: same weights
    assert torch.equal(
        again.model.layers[3].mlp.down_proj.weight, model.model.layers[3].mlp.down_proj.weight
    )


@pytest.mark.parametrize(
    "preset,shape",
    [
        ("smollm2-135m", ("LlamaForCausalLM", 576, 30, 9, 3, 64, 1536, 49152, True, False)),
        ("qwen2.5-0.5b", ("Qwen2ForCausalLM", 896, 24, 14, 2, 64, 4864, 151936, True, True)),
        ("llama-3-8b", ("LlamaForCausalLM", 4096, 32, 32, 8, 128, 14336, 128256, False, False)),
    ],
)
def test_dummy_presets_have_real_shapes(
    tmp_path: Path, preset: str, shape: tuple[object, ...]
) -> None:
    cfg = ModelConfig.from_pretrained(make_dummy_config(preset, tmp_path / preset))
    assert (
        cfg.architecture,
        cfg.hidden_size,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
        cfg.tie_word_embeddings,
        cfg.qkv_bias,
    ) == shape
    assert set(PRESETS) == {"smollm2-135m", "qwen2.5-0.5b", "llama-3-8b"}
