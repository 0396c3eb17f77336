"""Reference attention on any device: torch SDPA over K/V gathered from the paged pool.

Per step (init_forward_metadata) we build the gather index of every request's K/V, the
boolean mask and two reusable gather buffers; per layer we only scatter the new K/V into the
pool, gather K and V with one index_select each, and make one SDPA call.

Gathers work on 2-D views of the pool. The index selects rows of [slots * kv_heads, head_dim]
in (request, kv_head, position) order, so the gathered K/V come out as contiguous
[B, kv_heads, L, head_dim], the layout SDPA is fastest on. (index_select on the 3-D
[slots, kv_heads, head_dim] view, or into a fresh tensor each layer, is many times slower on
CPU.)

DECODE: one padded SDPA call for the whole batch with a key-padding mask. Queries are packed
per KV head ([B, kv_heads, group, D] against [B, kv_heads, L, D]) so grouped-query attention
needs no K/V expansion and the group acts as the query length.

EXTEND: new queries are the last extend_len positions of each sequence (an earlier prefix may
be cached). "padded" makes one SDPA call over [B, heads, max_extend, L] with a prefix-aware
causal mask; "loop" makes one call per request. Padding wastes work when lengths differ, and
an explicit mask also keeps SDPA off its causal kernel (which skips the blocks above the
diagonal); a loop pays Python overhead per request and layer. "auto" pads fresh prompts of one
length (no mask: the causal kernel) and batches of tiny requests (a padded square of at most
``PAD_MAX_AREA`` query x key positions, padding at most doubling the work); otherwise it loops.
Measured in the engine on one CPU core (SmolLM2-135M shape): prompts of 403 and 147 tokens in
one step took 1.15 s padded, 1.02 s in a loop (attention 0.27 vs 0.15 s); 434 and 234 tokens
1.36 vs 1.24 s; one request alone costs the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.forward_batch import ForwardBatch

EXTEND_STRATEGIES: tuple[str, ...] = ("auto", "padded", "loop")
PAD_WASTE_LIMIT = 2.0  # "auto": pad while padded area <= this x the real (queries x keys) area
PAD_MAX_AREA = 512  # "auto": ... and each request's padded square is this small (tiny requests)


@dataclass
class _Request:
    """One request of a per-request ("loop") extend step."""

    start: int  # first new token in the batch's T tokens
    extend_len: int
    seq_len: int
    kv_index: torch.Tensor  # [kv_heads * seq_len] rows of the 2-D head view of the pool
    causal: bool  # SDPA's own (top-left aligned) causal mask fits: no cached prefix
    mask: torch.Tensor | None  # [E, S] bottom-right aligned causal mask when there is a prefix


@dataclass
class TorchAttnMetadata:
    mode: ForwardMode
    max_len: int  # L = token_slots.shape[1]
    kv_index: torch.Tensor | None  # [B * kv_heads * L], (request, head, position) order
    # additive 0/-inf: decode [B,1,1,L] (None when no request is shorter than L);
    # padded extend [B,1,E,L] (None when SDPA's is_causal suffices)
    mask: torch.Tensor | None
    k_buf: torch.Tensor | None  # [B * kv_heads * L, head_dim], reused by every layer
    v_buf: torch.Tensor | None
    max_extend: int = 1  # E
    q_index: torch.Tensor | None = None  # [T] row of each new token in [B * E]; None if T == B * E
    requests: list[_Request] | None = None  # set instead of the above for the per-request loop
    causal: bool = False  # padded extend without padding or prefixes: is_causal, no mask


def _head_major_index(slots: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Rows of the [slots * kv_heads, head_dim] pool view for slots [..., L] -> [..., H, L]."""
    heads = torch.arange(kv_heads, device=slots.device).view(kv_heads, 1)
    return (slots.unsqueeze(-2) * kv_heads + heads).reshape(-1)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean "may attend" mask -> additive 0 / -inf mask. SDPA converts a boolean mask to this
    form on every call; converting once per step saves that work in every layer."""
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, float("-inf"))


class TorchAttnBackend(AttentionBackend):
    """Metadata from init_forward_metadata is valid until its next call (the gather buffers
    are shared between steps); steps run one after another."""

    decode_pads_to_longest = True  # one padded SDPA call: batch x longest context

    def __init__(self, extend_strategy: str = "auto") -> None:
        if extend_strategy not in EXTEND_STRATEGIES:
            raise ValueError(
                f"unknown extend_strategy {extend_strategy!r}; supported: {list(EXTEND_STRATEGIES)}"
            )
        self.extend_strategy = extend_strategy
        # One grow-only allocation for the K/V gather buffers, reused step after step:
        # fresh multi-MB tensors each step cost page faults comparable to the gather itself.
        self._gather_storage: torch.Tensor | None = None

    def _gather_buffers(
        self, rows: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        need = rows * head_dim
        st = self._gather_storage
        if st is None or st.numel() < 2 * need or st.dtype != dtype or st.device != device:
            st = self._gather_storage = torch.empty(2 * need, dtype=dtype, device=device)
        return st[:need].view(rows, head_dim), st[need : 2 * need].view(rows, head_dim)

    # ---- per step -------------------------------------------------------------------------
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pool = batch.kv_pool
        slots = batch.token_slots
        bsz, max_len = int(slots.shape[0]), int(slots.shape[1])
        device = slots.device
        seq_lens = batch.seq_lens.to(device)
        key_pos = torch.arange(max_len, device=device)

        if batch.mode == ForwardMode.EXTEND:
            ext_cpu = batch.extend_lens.tolist()
            seq_cpu = batch.seq_lens.tolist()
            max_ext = max(ext_cpu)
            real_area = sum(e * s for e, s in zip(ext_cpu, seq_cpu))
            uniform = batch.num_tokens == bsz * max_len  # fresh prompts of one length: no mask
            pad = self.extend_strategy == "padded" or (
                self.extend_strategy == "auto"
                and (uniform or (max_ext * max_len <= PAD_MAX_AREA
                                 and bsz * max_ext * max_len <= PAD_WASTE_LIMIT * real_area))
            )
            if not pad:
                batch.attn_metadata = self._loop_metadata(batch, ext_cpu, seq_cpu, key_pos)
                return

        rows = bsz * pool.kv_heads * max_len
        k_buf, v_buf = self._gather_buffers(rows, pool.head_dim, pool.dtype, device)
        kv_index = _head_major_index(slots, pool.kv_heads)
        if batch.mode == ForwardMode.DECODE:
            mask = None  # all requests equally long: nothing to mask
            if bool((batch.seq_lens != max_len).any()):  # CPU tensor: no device sync
                allowed = (key_pos[None, :] < seq_lens[:, None]).view(bsz, 1, 1, max_len)
                mask = _additive(allowed, pool.dtype)
            batch.attn_metadata = TorchAttnMetadata(
                batch.mode, max_len, kv_index, mask, k_buf, v_buf
            )
            return

        if batch.num_tokens == bsz * max_len:
            # Every request is a fresh prompt of the same length: SDPA's causal mode skips the
            # blocks above the diagonal, which an explicit mask cannot.
            batch.attn_metadata = TorchAttnMetadata(
                batch.mode, max_len, kv_index, None, k_buf, v_buf, max_ext, causal=True
            )
            return
        ext = batch.extend_lens.to(device)
        q_row = torch.arange(max_ext, device=device)
        # Query row e of request b sits at absolute position seq_len - extend_len + e and sees
        # keys at positions <= that. Padding rows (e >= extend_len) are pointed at key 0 so
        # that softmax never sees an all-masked row (NaN); their output is dropped anyway.
        qpos = (seq_lens - ext)[:, None] + q_row[None, :]  # [B, E]
        valid_row = q_row[None, :] < ext[:, None]
        mask = (key_pos[None, None, :] <= qpos[:, :, None]) & valid_row[:, :, None]
        mask[:, :, 0] |= ~valid_row
        meta = TorchAttnMetadata(
            batch.mode,
            max_len,
            kv_index,
            _additive(mask.unsqueeze(1), pool.dtype),
            k_buf,
            v_buf,
            max_ext,
        )
        if batch.num_tokens != bsz * max_ext:
            batch_idx = torch.repeat_interleave(torch.arange(bsz, device=device), ext)
            first = torch.cumsum(ext, 0) - ext
            within = torch.arange(batch.num_tokens, device=device) - first[batch_idx]
            meta.q_index = batch_idx * max_ext + within
        batch.attn_metadata = meta

    @staticmethod
    def _loop_metadata(
        batch: ForwardBatch, ext_cpu: list[int], seq_cpu: list[int], key_pos: torch.Tensor
    ) -> TorchAttnMetadata:
        kv_heads = batch.kv_pool.kv_heads
        requests: list[_Request] = []
        start = 0
        for b, (e, n) in enumerate(zip(ext_cpu, seq_cpu)):
            mask = None
            if n > e > 1:  # a cached prefix and several queries: bottom-right aligned causal
                mask = key_pos[None, :n] <= torch.arange(n - e, n, device=key_pos.device)[:, None]
            index = _head_major_index(batch.token_slots[b, :n], kv_heads)
            requests.append(_Request(start, e, n, index, causal=e > 1 and n == e, mask=mask))
            start += e
        return TorchAttnMetadata(
            batch.mode,
            int(batch.token_slots.shape[1]),
            None,
            None,
            None,
            None,
            max(ext_cpu),
            requests=requests,
        )

    # ---- per layer ------------------------------------------------------------------------
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        meta: TorchAttnMetadata = batch.attn_metadata
        pool = batch.kv_pool
        kv_heads, head_dim = pool.kv_heads, pool.head_dim
        k_cache, v_cache = pool.k_cache(layer_id), pool.v_cache(layer_id)
        # 2-D views: [slots, kv_heads * head_dim] for the store, [slots * kv_heads, head_dim]
        # for the head-major gather.
        num_new = k.shape[0]
        k_cache.view(-1, kv_heads * head_dim).index_copy_(
            0, batch.out_cache_loc, k.reshape(num_new, -1).to(pool.dtype)
        )
        v_cache.view(-1, kv_heads * head_dim).index_copy_(
            0, batch.out_cache_loc, v.reshape(num_new, -1).to(pool.dtype)
        )
        k_rows, v_rows = k_cache.view(-1, head_dim), v_cache.view(-1, head_dim)
        if meta.requests is not None:
            return self._extend_loop(q, k_rows, v_rows, meta, scale, kv_heads)

        assert meta.kv_index is not None and meta.k_buf is not None and meta.v_buf is not None
        torch.index_select(k_rows, 0, meta.kv_index, out=meta.k_buf)
        torch.index_select(v_rows, 0, meta.kv_index, out=meta.v_buf)
        bsz, max_len = batch.batch_size, meta.max_len
        keys = meta.k_buf.view(bsz, kv_heads, max_len, head_dim)
        values = meta.v_buf.view(bsz, kv_heads, max_len, head_dim)
        num_heads = q.shape[1]
        if meta.mode == ForwardMode.DECODE:
            # [B, Hq, D] -> [B, kv_heads, group, D]: query head h uses KV head h // group.
            qg = q.reshape(bsz, kv_heads, num_heads // kv_heads, head_dim).to(pool.dtype)
            out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=meta.mask, scale=scale)
            return out.reshape(bsz, num_heads * head_dim).to(q.dtype)

        max_ext = meta.max_extend
        if meta.q_index is None:
            qp = q.view(bsz, max_ext, num_heads, head_dim)
        else:
            qp = q.new_zeros(bsz * max_ext, num_heads, head_dim)
            qp[meta.q_index] = q
            qp = qp.view(bsz, max_ext, num_heads, head_dim)
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2).to(pool.dtype),
            keys,
            values,
            attn_mask=meta.mask,
            scale=scale,
            is_causal=meta.causal,
            enable_gqa=kv_heads != num_heads,
        )  # [B, Hq, E, D]
        out = out.transpose(1, 2).reshape(bsz * max_ext, num_heads * head_dim)
        if meta.q_index is not None:
            out = out[meta.q_index]
        return out.to(q.dtype)

    @staticmethod
    def _extend_loop(
        q: torch.Tensor,
        k_rows: torch.Tensor,
        v_rows: torch.Tensor,
        meta: TorchAttnMetadata,
        scale: float,
        kv_heads: int,
    ) -> torch.Tensor:
        num_heads, head_dim = q.shape[1], q.shape[2]
        out = q.new_empty(q.shape[0], num_heads * head_dim)
        assert meta.requests is not None
        for r in meta.requests:
            keys = k_rows.index_select(0, r.kv_index).view(1, kv_heads, r.seq_len, head_dim)
            values = v_rows.index_select(0, r.kv_index).view(1, kv_heads, r.seq_len, head_dim)
            # [1, Hq, E, D]: with a batch dimension SDPA takes its fused CPU kernel (3-D
            # inputs took the unfused one: ~2x the attention time of the padded path)
            qb = q[r.start : r.start + r.extend_len].transpose(0, 1).unsqueeze(0).to(keys.dtype)
            o = F.scaled_dot_product_attention(
                qb,
                keys,
                values,
                attn_mask=r.mask,
                is_causal=r.causal,
                scale=scale,
                enable_gqa=kv_heads != num_heads,
            )
            out[r.start : r.start + r.extend_len] = o[0].transpose(0, 1).reshape(r.extend_len, -1)
        return out
