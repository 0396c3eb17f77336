"""The fused element-wise kernels (sgl-kernel/sgl_pd_kernel/triton_fused.py) against their torch
references: residual add + RMSNorm, SiLU-and-mul, RoPE on q and k in place.

On a CPU-only host they run under the Triton interpreter at small shapes (head_dim 128, GQA 4
included). bfloat16 results must match the reference exactly except for RMSNorm, whose float32
mean may sum in another order (at most one bfloat16 step apart).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton not installed (pip install triton: the gpu extra)",
                    exc_type=ImportError)

from sgl_pd_kernel import reference as ref
from sgl_pd_kernel import triton_fused as tf

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


def _norm_tol(dtype: torch.dtype) -> dict[str, float]:
    # float32: summation order only; bfloat16: one rounding step of the normed value
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 8e-3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [128, 96])  # a power of two, and one the block masks
def test_add_rmsnorm_matches_reference(dtype: torch.dtype, hidden: int) -> None:
    x = _randn(5, hidden, dtype=dtype, seed=1)
    residual = _randn(5, hidden, dtype=dtype, seed=2, scale=3.0)
    weight = _randn(hidden, dtype=dtype, seed=3)
    want_res = residual.clone()
    want = ref.add_rmsnorm_ref(x, want_res, weight, 1e-6)
    got = tf.add_rmsnorm_(x, residual, weight, 1e-6)
    assert torch.equal(residual, want_res)  # the residual add rounds exactly as torch's add_
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **_norm_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_without_residual_matches_reference(dtype: torch.dtype) -> None:
    x = _randn(3, 4, 128, dtype=dtype, seed=4, scale=2.0)
    weight = _randn(128, dtype=dtype, seed=5)
    got = tf.rmsnorm(x, weight, 1e-5)
    assert got.shape == x.shape
    torch.testing.assert_close(got, ref.rmsnorm_ref(x, weight, 1e-5), **_norm_tol(dtype))


def test_add_rmsnorm_rejects_mismatched_shapes() -> None:
    x, residual = torch.zeros(2, 8, device=DEVICE), torch.zeros(3, 8, device=DEVICE)
    with pytest.raises(ValueError, match="same"):
        tf.add_rmsnorm_(x, residual, torch.ones(8, device=DEVICE), 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [256, 40])  # several column blocks; a masked partial block
def test_silu_and_mul_matches_reference_exactly(dtype: torch.dtype, inter: int) -> None:
    x = _randn(4, 2 * inter, dtype=dtype, seed=6, scale=3.0)
    got = tf.silu_and_mul(x, block=64)
    want = ref.silu_and_mul_ref(x)
    assert got.shape == (4, inter)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    else:  # exp may differ in the last float32 bit
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(32, 8, 128), (4, 1, 24)])  # GQA 4 at head_dim 128; odd half
def test_rope_in_place_on_fused_qkv_views(dtype: torch.dtype, heads: tuple[int, int, int]) -> None:
    hq, hkv, d = heads
    t, max_pos = 3, 64
    qkv = _randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=7)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)  # strided views, as the model has
    q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    cos, sin = freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)
    positions = torch.tensor([0, 17, 63], device=DEVICE)
    v_before = v.clone()
    want_q, want_k = ref.rope_qk_ref(q, k, positions, cos, sin)
    tf.rope_qk_(q, k, positions, cos, sin)
    tol = {"atol": 0.0, "rtol": 0.0} if dtype == torch.bfloat16 else {"atol": 1e-6, "rtol": 1e-6}
    torch.testing.assert_close(q, want_q, **tol)
    torch.testing.assert_close(k, want_k, **tol)
    assert torch.equal(v, v_before)  # v, between k and the next token's q, is untouched
    assert not torch.equal(q[1], _randn(t, (hq + 2 * hkv) * d, dtype=dtype, seed=7)[1, : hq * d].view(hq, d))
