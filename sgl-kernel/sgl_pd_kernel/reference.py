"""Torch reference versions of the Triton kernels in ``triton_attention.py``: plain per-request
loops in float32, slow and obviously right. Tests compare the kernels against these.

Shared conventions (the KVPool layout, per layer):
  k_cache, v_cache: [slots, kv_heads, head_dim] with slot = page * page_size + offset.
  slot_table: [B, W] int; token i of request b sits in slot
      slot_table[b, i // page_size] * page_size + i % page_size
  (pass a page table with the pool's page_size, or a per-token slot table with page_size=1).
  Slots below ``page_size`` of the pool (dummy page 0) are never written by ``store_kv``.
"""

from __future__ import annotations

import torch


def token_slots_of(slot_table: torch.Tensor, page_size: int, seq_len: int, b: int) -> torch.Tensor:
    pos = torch.arange(seq_len, device=slot_table.device)
    return slot_table[b, pos // page_size].long() * page_size + pos % page_size


def store_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out_loc: torch.Tensor, dummy_slots: int) -> None:
    """k_cache[out_loc[t]] = k[t] (same for v), except where out_loc[t] < dummy_slots."""
    keep = out_loc >= dummy_slots
    k_cache[out_loc[keep]] = k[keep].to(k_cache.dtype)
    v_cache[out_loc[keep]] = v[keep].to(v_cache.dtype)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """q [E, Hq, D] are the last E positions of a sequence with keys/values [S, Hkv, D]."""
    e, s = q.shape[0], keys.shape[0]
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)  # query head h reads KV head h // group
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("ehd,shd->hes", q.float(), k) * scale
    allowed = torch.arange(s, device=q.device)[None, :] <= torch.arange(s - e, s, device=q.device)[:, None]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hes,shd->ehd", probs, v)


def decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         slot_table: torch.Tensor, page_size: int, seq_lens: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """q [B, Hq, D]: one new query per request, already stored at position seq_len - 1."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        slots = token_slots_of(slot_table, page_size, n, b)
        out[b] = _attend(q[b : b + 1], k_cache[slots], v_cache[slots], scale)[0].to(q.dtype)
    return out


def extend_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         slot_table: torch.Tensor, page_size: int, seq_lens: torch.Tensor,
                         extend_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, Hq, D]: each request's extend_len new queries (concatenated) are the last positions
    of its seq_len tokens, whose K/V (cached prefix + new) are all in the cache already."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    start = 0
    for b, (n, e) in enumerate(zip(seq_lens.tolist(), extend_lens.tolist())):
        slots = token_slots_of(slot_table, page_size, n, b)
        out[start : start + e] = _attend(q[start : start + e], k_cache[slots], v_cache[slots], scale).to(q.dtype)
        start += e
    return out


# --- the fused element-wise kernels of ``triton_fused.py`` -----------------------------------
# These are the plain torch steps of ``sglang_pd.models.layers`` they replace, op for op.


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> torch.Tensor:
    """residual += x in place; returns rmsnorm_ref(residual)."""
    residual.add_(x)
    return rmsnorm_ref(residual, weight, eps)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rope_qk_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q [T, Hq, D] and k [T, Hkv, D] (split halves) from float32 tables
    [max_positions, D // 2], with the tables rounded to q's dtype first."""
    c, s = cos[positions].to(q.dtype), sin[positions].to(q.dtype)
    full_cos, signed_sin = torch.cat((c, c), -1)[:, None], torch.cat((-s, s), -1)[:, None]

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * full_cos + torch.cat((x2, x1), dim=-1) * signed_sin

    return rot(q), rot(k)
