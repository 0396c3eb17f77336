"""The models' fused-kernel path (models/fused.py: add+RMSNorm, merged gate/up + SiLU-and-mul,
in-place RoPE) against the plain torch path on the tiny models: same greedy tokens, logits equal
to float32 noise, checkpoint rows landing in the merged gate_up weight, and the switch
(SGLANG_PD_FUSED_KERNELS) obeyed. On CPU the kernels run under the Triton interpreter, forced on
with SGLANG_PD_FUSED_KERNELS=1 (by default the CPU never takes the fused path).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
pytest.importorskip("triton", reason="triton not installed (pip install triton: the gpu extra)",
                    exc_type=ImportError)

from model_helpers import TINY_ARCHS, PagedRequests, build_tiny_models, make_pool
from sgl_pd_kernel import triton_fused
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.torch_backend import TorchAttnBackend
from sglang_pd.models import load_model
from sglang_pd.models.fused import FUSED_ENV, fused_kernels_on

PROMPTS = [[5, 17, 300, 42, 7, 99, 1024], [3], [250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 8]]
NEW_TOKENS = 6
KERNELS = ("rmsnorm", "add_rmsnorm_", "silu_and_mul", "rope_qk_")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts launches of each fused kernel (the originals still run)."""
    seen: Counter[str] = Counter()
    for name in KERNELS:
        original = getattr(triton_fused, name)

        def counted(*args: Any, _name: str = name, _f: Any = original) -> Any:
            seen[_name] += 1
            return _f(*args)

        monkeypatch.setattr(triton_fused, name, counted)
    return seen


@torch.inference_mode()
def _greedy(model: Any, cfg: Any) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens of PROMPTS (prefill, then decode steps) and the prefill logits."""
    pool = make_pool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, num_pages=64, page_size=4)
    reqs = PagedRequests(pool, TorchAttnBackend("auto"))
    logits = model(reqs.batch(ForwardMode.EXTEND, dict(enumerate(PROMPTS))))
    first = logits.clone()
    got: list[list[int]] = [[] for _ in PROMPTS]
    for step in range(NEW_TOKENS):
        nxt = logits.argmax(-1).tolist()
        for out, t in zip(got, nxt):
            out.append(t)
        if step + 1 < NEW_TOKENS:
            logits = model(reqs.batch(ForwardMode.DECODE, {i: [t] for i, t in enumerate(nxt)}))
    return got, first


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_fused_path_gives_the_plain_path_tokens(
    tiny: dict[str, Path], arch: str, monkeypatch: pytest.MonkeyPatch, calls: Counter[str]
) -> None:
    monkeypatch.setenv(FUSED_ENV, "0")
    plain, cfg = load_model(tiny[arch], torch.float32)
    want, want_logits = _greedy(plain, cfg)
    assert not calls and not plain.model.layers[0].mlp.merged

    monkeypatch.setenv(FUSED_ENV, "1")
    fused, _ = load_model(tiny[arch], torch.float32)
    assert fused.model.layers[0].mlp.merged
    got, got_logits = _greedy(fused, cfg)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=5e-4, rtol=0)
    steps = NEW_TOKENS  # one prefill and NEW_TOKENS - 1 decode steps
    # per step: 2 per layer except layer 0's input norm, plus the final norm of decode steps
    assert calls["add_rmsnorm_"] == steps * (2 * cfg.num_layers - 1) + (steps - 1)
    assert calls["silu_and_mul"] == steps * cfg.num_layers
    assert calls["rope_qk_"] == steps * cfg.num_layers
    # layer 0's input norm, plus Qwen3's per-head q/k norms; a prefill's last norm is unfused
    qk = 2 * cfg.num_layers if cfg.qk_norm else 0
    assert calls["rmsnorm"] == steps * (1 + qk) + 1


def test_merged_gate_up_holds_the_checkpoint_rows(
    tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FUSED_ENV, "0")
    plain, cfg = load_model(tiny["llama"], torch.float32)
    monkeypatch.setenv(FUSED_ENV, "1")
    merged, _ = load_model(tiny["llama"], torch.float32)
    for layer in (0, cfg.num_layers - 1):
        a, b = plain.model.layers[layer].mlp, merged.model.layers[layer].mlp
        want = torch.cat((a.gate_proj.weight, a.up_proj.weight))
        assert torch.equal(b.gate_up_proj.weight, want)


def test_dummy_weights_do_not_depend_on_the_merge(
    tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FUSED_ENV, "0")
    plain, _ = load_model(tiny["llama"], torch.float32, load_format="dummy")
    monkeypatch.setenv(FUSED_ENV, "1")
    merged, _ = load_model(tiny["llama"], torch.float32, load_format="dummy")
    a, b = plain.model.layers[1].mlp, merged.model.layers[1].mlp
    assert torch.equal(b.gate_up_proj.weight, torch.cat((a.gate_proj.weight, a.up_proj.weight)))
    assert not torch.equal(a.gate_proj.weight, a.up_proj.weight)  # tiling continues across tensors


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FUSED_ENV, raising=False)
    assert not fused_kernels_on("cpu")  # the CPU default: plain torch
    monkeypatch.setenv(FUSED_ENV, "1")
    assert fused_kernels_on("cpu") == (os.environ.get("TRITON_INTERPRET") == "1")
    monkeypatch.setenv(FUSED_ENV, "0")
    assert not fused_kernels_on("cuda")
    monkeypatch.setenv(FUSED_ENV, "yes")
    with pytest.raises(ValueError, match=FUSED_ENV):
        fused_kernels_on("cpu")
