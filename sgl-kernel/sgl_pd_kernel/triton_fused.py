"""Triton kernels that fuse the small element-wise steps of a decoder layer (what a decode step
at small batch spends its launches on): residual add + RMSNorm, SiLU-and-mul of a merged
gate/up output, and RoPE on q and k in place.

Each kernel reproduces the rounding of the torch code it replaces in ``sglang_pd.models.layers``
(every intermediate the torch code holds in the input dtype is rounded to it here too), so the
fused and plain paths differ only by float32 summation order in the RMSNorm mean. The torch
versions are in ``reference.py``.

Capture-safe: no host reads, outputs allocated from shapes only, grids from shapes only.
Importing this module imports triton: only ``sglang_pd.models.fused`` and tests import it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The Triton interpreter (CPU) casts float32 to bfloat16 by truncation; a GPU rounds to nearest
# even. Under the interpreter ``_cast`` rounds first, so CPU tests see the GPU's rounding.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _cast(x, dt: tl.constexpr, FIX_BF16: tl.constexpr):
    """float32 x -> dt, rounding to nearest even (NaN/inf not special-cased under the fix)."""
    if FIX_BF16 and dt == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dt)


@triton.jit
def _rmsnorm_kernel(X, Res, W, Out, stride_x, stride_res, stride_out, n_cols, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, FIX: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(Res + row * stride_res + cols, mask=mask, other=0.0)
        # the residual is kept in the input dtype, as `residual.add_(x)` keeps it
        x = _cast(x.to(tl.float32) + r.to(tl.float32), Res.dtype.element_ty, FIX)
        tl.store(Res + row * stride_res + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    normed = _cast(xf * tl.math.rsqrt(var + eps), Out.dtype.element_ty, FIX)  # cast, then scale
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = _cast(w.to(tl.float32) * normed.to(tl.float32), Out.dtype.element_ty, FIX)
    tl.store(Out + row * stride_out + cols, y, mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _norm_warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim: normalised in float32, cast to x.dtype, scaled."""
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    n = x2.shape[1]
    block = triton.next_power_of_2(n)
    if x2.shape[0]:
        _rmsnorm_kernel[(x2.shape[0],)](x2, x2, weight, out, x2.stride(0), x2.stride(0),
                                        out.stride(0), n, eps, HAS_RESIDUAL=False, BLOCK=block, FIX=INTERPRETED,
                                        num_warps=_norm_warps(block))
    return out.view(x.shape)


def add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """residual += x (in place, in residual's dtype); returns rmsnorm(residual) as ``rmsnorm``.

    x and residual are [T, hidden]; residual must have contiguous rows (it is written)."""
    if residual.dim() != 2 or residual.stride(1) != 1 or x.shape != residual.shape:
        raise ValueError(f"add_rmsnorm_: x {tuple(x.shape)} and residual {tuple(residual.shape)} "
                         "must be the same [T, hidden] with contiguous rows")
    x2 = _rows(x)
    out = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    n = residual.shape[1]
    block = triton.next_power_of_2(n)
    if residual.shape[0]:
        _rmsnorm_kernel[(residual.shape[0],)](x2, residual, weight, out, x2.stride(0),
                                              residual.stride(0), out.stride(0), n, eps,
                                              HAS_RESIDUAL=True, BLOCK=block, FIX=INTERPRETED,
                                              num_warps=_norm_warps(block))
    return out


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_x, stride_out, n_cols, BLOCK: tl.constexpr,
                         FIX: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(X + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    # silu is rounded to the dtype before the product, as F.silu(gate).mul_(up) rounds it
    act = _cast(g / (1.0 + tl.exp(-g)), Out.dtype.element_ty, FIX).to(tl.float32)
    tl.store(Out + row * stride_out + cols, _cast(act * u, Out.dtype.element_ty, FIX), mask=mask)


def silu_and_mul(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """[T, 2I] (gate | up) -> silu(gate) * up, [T, I]."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"silu_and_mul: want [T, 2I], got {tuple(x.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    inter = x.shape[1] // 2
    out = torch.empty((x.shape[0], inter), dtype=x.dtype, device=x.device)
    block = min(block, triton.next_power_of_2(inter))
    if x.shape[0]:
        grid = (x.shape[0], triton.cdiv(inter, block))
        _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), inter, BLOCK=block, FIX=INTERPRETED,
                                   num_warps=4)
    return out


@triton.jit
def _rope_heads(X, stride_t, stride_h, t, heads, c, s, d_offs, h_offs,
                HALF: tl.constexpr, BLOCK_H: tl.constexpr, FIX: tl.constexpr):
    mask = (h_offs[:, None] < heads) & (d_offs[None, :] < HALF)
    ptr = X + t * stride_t + h_offs[:, None] * stride_h + d_offs[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    # x * cos + swap_halves(x) * signed_sin with each product and the sum rounded to the dtype
    a1 = _cast(x1 * c, dt, FIX).to(tl.float32)
    b1 = _cast(x2 * s, dt, FIX).to(tl.float32)
    a2 = _cast(x2 * c, dt, FIX).to(tl.float32)
    b2 = _cast(x1 * s, dt, FIX).to(tl.float32)
    tl.store(ptr, _cast(a1 - b1, dt, FIX), mask=mask)
    tl.store(ptr + HALF, _cast(a2 + b2, dt, FIX), mask=mask)


@triton.jit
def _rope_kernel(Q, K, Pos, Cos, Sin, stride_qt, stride_qh, stride_kt, stride_kh, q_heads, k_heads,
                 HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr,
                 BLOCK_HK: tl.constexpr, FIX: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    dt = Q.dtype.element_ty
    # the float32 table entries rounded to the model dtype, as cos_sin(positions, dtype) does
    c = _cast(tl.load(Cos + pos * HALF + d, mask=dmask, other=0.0), dt, FIX).to(tl.float32)[None, :]
    s = _cast(tl.load(Sin + pos * HALF + d, mask=dmask, other=0.0), dt, FIX).to(tl.float32)[None, :]
    _rope_heads(Q, stride_qt, stride_qh, t, q_heads, c, s, d, tl.arange(0, BLOCK_HQ), HALF, BLOCK_HQ,
                FIX)
    _rope_heads(K, stride_kt, stride_kh, t, k_heads, c, s, d, tl.arange(0, BLOCK_HK), HALF, BLOCK_HK,
                FIX)


def rope_qk_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place (split-halves/NeoX layout) at
    ``positions`` [T] with float32 tables cos/sin [max_positions, D // 2].

    q and k may be strided views (slices of a fused qkv output); each head's D values must be
    contiguous. Positions are not range-checked here (no host read): the caller validates them."""
    t, _, d = q.shape
    if k.shape[0] != t or k.shape[2] != d or d % 2 or cos.shape[1] != d // 2:
        raise ValueError(f"rope_qk_: q {tuple(q.shape)}, k {tuple(k.shape)}, table "
                         f"{tuple(cos.shape)} disagree")
    if q.stride(2) != 1 or k.stride(2) != 1 or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError("rope_qk_: head rows and tables must be contiguous")
    if t == 0:
        return
    half = d // 2
    _rope_kernel[(t,)](q, k, positions, cos, sin, q.stride(0), q.stride(1), k.stride(0),
                       k.stride(1), q.shape[1], k.shape[1], HALF=half,
                       BLOCK_D=triton.next_power_of_2(half),
                       BLOCK_HQ=triton.next_power_of_2(q.shape[1]),
                       BLOCK_HK=triton.next_power_of_2(k.shape[1]), FIX=INTERPRETED,
                       num_warps=4)
