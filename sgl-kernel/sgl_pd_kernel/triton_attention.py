"""Triton kernels for paged attention over the KVPool layout, one layer at a time.

Layout and slot-table conventions are the ones of ``reference.py`` (the torch versions these are
tested against): caches [slots, kv_heads, head_dim]; token i of request b sits in slot
``table[b, i // PAGE] * PAGE + i % PAGE``. PAGE is the pool's page size with a page table, or 1
with the per-token ``ForwardBatch.token_slots``.

- ``store_kv``: scatter new K/V rows to their slots; writes into dummy page 0 are dropped, so
  padded tokens (CUDA-graph padding points them there) keep page 0 zero.
- ``decode_attention``: one query per request, GQA: a program owns one (request, KV head, split)
  and all query heads of that KV head, so each K/V block is read once per KV head. The keys are
  cut into ``num_splits`` pieces (flash-decoding) so that small batches still fill the GPU; a
  second kernel merges the pieces by their log-sum-exp. Split bounds are computed in the kernel
  from seq_len, so one grid serves any context length (what CUDA-graph replay needs).
- ``extend_attention``: a program owns BLOCK_M queries of one request and one query head and
  walks the request's keys (cached prefix + new tokens, already stored) up to its last query's
  position, with the bottom-right aligned causal mask.

All softmax math is float32 (online softmax). Importing this module imports triton: only
``sglang_pd.engine.attention.triton_backend`` (inside its factory) and tests import it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The Triton interpreter (CPU) computes tl.dot of bfloat16/float16 operands wrongly (numpy has
# no bfloat16), so under it the operands are cast to float32 first; on a GPU they are not.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _dot_precision(dtype: torch.dtype) -> str | None:
    # float32 models must match the torch backend closely: no TF32 rounding inside tl.dot.
    # Half-precision operands take tl.dot's default (the option only concerns float32).
    return "ieee" if dtype == torch.float32 or INTERPRETED else None


def _upcast(dtype: torch.dtype) -> bool:
    return INTERPRETED and dtype != torch.float32


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(n))


@triton.jit
def _store_kv_kernel(K, V, KCache, VCache, Loc, stride_k, stride_v, stride_kc, stride_vc,
                     dummy_slots, ROW: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    loc = tl.load(Loc + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    # loc broadcast to the block first: a scalar-bool mask operand is rejected by the interpreter
    mask = (offs < ROW) & ((offs * 0 + loc) >= dummy_slots)
    k = tl.load(K + t * stride_k + offs, mask=mask)
    v = tl.load(V + t * stride_v + offs, mask=mask)
    tl.store(KCache + loc * stride_kc + offs, k.to(KCache.dtype.element_ty), mask=mask)
    tl.store(VCache + loc * stride_vc + offs, v.to(VCache.dtype.element_ty), mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out_loc: torch.Tensor, dummy_slots: int) -> None:
    """k_cache[out_loc[t]] = k[t] (and v), skipping out_loc[t] < dummy_slots (page 0)."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    # each token's [kv_heads * head_dim] row must be contiguous (slices of a fused qkv are)
    k2, v2 = k.reshape(num_tokens, -1), v.reshape(num_tokens, -1)
    k2 = k2 if k2.stride(1) == 1 else k2.contiguous()
    v2 = v2 if v2.stride(1) == 1 else v2.contiguous()
    row = k2.shape[1]
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("store_kv needs contiguous [slots, kv_heads, head_dim] caches")
    _store_kv_kernel[(num_tokens,)](k2, v2, k_cache, v_cache, out_loc, k2.stride(0), v2.stride(0),
                                    row, row, dummy_slots, ROW=row, BLOCK=triton.next_power_of_2(row))


# ``stride_tb`` is not specialised on: a per-token slot table is as wide as the step's longest
# request, and Triton would compile a variant per "width divisible by 16 or not" mid-serving.
@triton.jit(do_not_specialize=["stride_tb"])
def _decode_split_kernel(Q, K, V, Table, SeqLens, OutPart, LsePart, stride_qb, stride_qh,
                         stride_ks, stride_kh, stride_vs, stride_vh, stride_tb,
                         stride_ob, stride_oh, stride_os, stride_lb, stride_lh, scale,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
                         NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, BLOCK_D)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(K.dtype.element_ty)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_ok = pos < end
        page = tl.load(Table + b * stride_tb + pos // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = page * PAGE + pos % PAGE
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(K + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new
    has_keys = l_i > 0  # an empty split (short sequence) contributes weight exp(-inf) = 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    base = b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    tl.store(OutPart + base, out, mask=g_ok[:, None] & d_ok[None, :])
    tl.store(LsePart + b * stride_lb + heads * stride_lh + split, lse, mask=g_ok)


@triton.jit
def _decode_merge_kernel(OutPart, LsePart, Out, stride_ob, stride_oh, stride_os, stride_lb,
                         stride_lh, stride_fb, stride_fh, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < NUM_SPLITS
    lse = tl.load(LsePart + b * stride_lb + h * stride_lh + s, mask=s_ok, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))  # split 0 always holds keys: the max is finite
    w = w / tl.sum(w, 0)
    part = tl.load(OutPart + b * stride_ob + h * stride_oh + s[:, None] * stride_os + d[None, :],
                   mask=s_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    out = tl.sum(part * w[:, None], 0)
    tl.store(Out + b * stride_fb + h * stride_fh + d, out.to(Out.dtype.element_ty), mask=d < HEAD_DIM)


def decode_splits(batch_size: int, kv_heads: int, max_len: int, num_sms: int = 132,
                  block_n: int = 64) -> int:
    """Enough splits for about two programs per SM, never more than key blocks (power of 2)."""
    want = max(1, -(-2 * num_sms // max(1, batch_size * kv_heads)))
    blocks = max(1, -(-max_len // block_n))
    return min(triton.next_power_of_2(want), triton.next_power_of_2(blocks), 64)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot_table: torch.Tensor, page_size: int, seq_lens: torch.Tensor, scale: float,
                     num_splits: int = 1, block_n: int = 64, out: torch.Tensor | None = None,
                     scratch: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hq, D]; ``seq_lens`` on q's device. ``out``/``scratch`` (partial
    outputs [B, Hq, splits, D] and lse [B, Hq, splits], float32) may be preallocated so that a
    captured CUDA graph allocates nothing."""
    bsz, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {kv_heads} KV heads")
    group = num_heads // kv_heads
    if scratch is None:
        scratch = (torch.empty(bsz, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device),
                   torch.empty(bsz, num_heads, num_splits, dtype=torch.float32, device=q.device))
    part, lse = scratch
    if out is None:
        out = torch.empty_like(q)
    block_d = _pow2(head_dim)
    _decode_split_kernel[(bsz, kv_heads, num_splits)](
        q, k_cache, v_cache, slot_table, seq_lens, part, lse, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), slot_table.stride(0),
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1), scale,
        GROUP=group, GROUP_PAD=_pow2(group), HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=block_n,
        PAGE=page_size, NUM_SPLITS=num_splits, PRECISION=_dot_precision(k_cache.dtype),
        UPCAST=_upcast(k_cache.dtype))
    _decode_merge_kernel[(bsz, num_heads)](
        part, lse, out, part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1), HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits))
    return out


@triton.jit(do_not_specialize=["stride_tb"])  # the table's width changes every step (above)
def _extend_kernel(Q, K, V, Out, Table, SeqLens, ExtLens, QStart, stride_qt, stride_qh,
                   stride_ks, stride_kh, stride_vs, stride_vh, stride_tb, stride_ot, stride_oh, scale,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mblk = tl.program_id(2)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    ext = tl.load(ExtLens + b).to(tl.int32)
    q_start = tl.load(QStart + b).to(tl.int64)
    kvh = h // GROUP
    m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < ext
    qpos = seq_len - ext + m  # absolute position of each query
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    rows = q_start + m
    q = tl.load(Q + rows[:, None] * stride_qt + h * stride_qh + d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(K.dtype.element_ty)
    # keys up to the block's last query (causal); none for a block past this request's queries
    end = tl.minimum(seq_len, seq_len - ext + (mblk + 1) * BLOCK_M)
    end = tl.where(mblk * BLOCK_M < ext, end, 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_ok = pos < end
        page = tl.load(Table + b * stride_tb + pos // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = page * PAGE + pos % PAGE
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(K + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), PRECISION, UPCAST) * scale
        # key 0 <= every query's position, so no row of the first block is fully masked
        s = tl.where(n_ok[None, :] & (pos[None, :] <= qpos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + rows[:, None] * stride_ot + h * stride_oh + d[None, :],
             out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slot_table: torch.Tensor, page_size: int, seq_lens: torch.Tensor,
                     extend_lens: torch.Tensor, q_start: torch.Tensor, max_extend: int, scale: float,
                     block_m: int = 64, block_n: int = 64, out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D] -> [T, Hq, D]. seq_lens/extend_lens/q_start ([B], first query row of each
    request) live on q's device; ``max_extend`` (host int) sizes the grid."""
    _num_tokens, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {kv_heads} KV heads")
    if out is None:
        out = torch.empty_like(q)
    bsz = seq_lens.shape[0]
    block_m = min(block_m, _pow2(max_extend))
    _extend_kernel[(bsz, num_heads, triton.cdiv(max_extend, block_m))](
        q, k_cache, v_cache, out, slot_table, seq_lens, extend_lens, q_start, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), slot_table.stride(0),
        out.stride(0), out.stride(1), scale, GROUP=num_heads // kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=_pow2(head_dim), BLOCK_M=block_m, BLOCK_N=block_n, PAGE=page_size,
        PRECISION=_dot_precision(k_cache.dtype), UPCAST=_upcast(k_cache.dtype))
    return out
