"""Attention through FlashInfer's paged-KV wrappers (optional: ``pip install .[gpu]``).

The KVPool's per-layer K and V views [pages, page_size, kv_heads, head_dim] are FlashInfer's
"NHD" paged layout as they are, so nothing is copied: per step we derive FlashInfer's CSR page
table (indptr / indices / last_page_len) from ``batch.token_slots`` and plan once (on the first
layer, when the softmax scale is known); per layer we store K/V with the Triton store kernel and
run the planned wrapper.

NOT VERIFIED: written against FlashInfer's documented wrapper API on a machine without a GPU or
flashinfer; docs/gpu.md lists it among the things to check on a GPU first. Importing this module
imports flashinfer and triton; the registry imports it inside its factory only.
"""

from __future__ import annotations

from dataclasses import dataclass

import flashinfer
import torch

from sgl_pd_kernel import triton_attention as kernels
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.forward_batch import ForwardBatch, ForwardMode

WORKSPACE_BYTES = 128 << 20


@dataclass
class FlashInferMetadata:
    mode: ForwardMode
    kv_indptr: torch.Tensor  # [B + 1] int32
    kv_indices: torch.Tensor  # [sum pages] int32
    last_page_len: torch.Tensor  # [B] int32
    qo_indptr: torch.Tensor | None  # [B + 1] int32, extend only
    planned_scale: float | None = None


class FlashInferAttnBackend(AttentionBackend):
    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None
        self._decode: object | None = None
        self._prefill: object | None = None

    def _wrappers(self, device: torch.device) -> None:
        if self._workspace is None:
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")
            self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.token_slots.device
        if device.type != "cuda":
            raise ValueError("the flashinfer attention backend runs on CUDA only (--device cuda)")
        self._wrappers(device)
        ps = batch.kv_pool.page_size
        seq_lens = batch.seq_lens.tolist()  # host tensor
        pages = [-(-n // ps) for n in seq_lens]
        page_table = torch.div(batch.token_slots[:, ::ps], ps, rounding_mode="floor")
        width = page_table.shape[1]
        used = torch.arange(width, device=device)[None, :] < torch.tensor(pages, device=device)[:, None]
        indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * ps for n, p in zip(seq_lens, pages)], dtype=torch.int32)
        qo_indptr = None
        if batch.mode == ForwardMode.EXTEND:
            qo_indptr = torch.cat([torch.zeros(1, dtype=torch.int32),
                                   batch.extend_lens.to(torch.int32).cumsum(0, dtype=torch.int32)])
            qo_indptr = qo_indptr.to(device)
        batch.attn_metadata = FlashInferMetadata(
            batch.mode, indptr.to(device), page_table[used].to(torch.int32), last.to(device), qo_indptr)

    def _plan(self, meta: FlashInferMetadata, batch: ForwardBatch, q: torch.Tensor, scale: float) -> None:
        pool = batch.kv_pool
        common = dict(q_data_type=q.dtype, kv_data_type=pool.dtype, sm_scale=scale)
        if meta.mode == ForwardMode.DECODE:
            self._decode.plan(meta.kv_indptr, meta.kv_indices, meta.last_page_len, q.shape[1],
                              pool.kv_heads, pool.head_dim, pool.page_size, **common)
        else:
            self._prefill.plan(meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.last_page_len,
                               q.shape[1], pool.kv_heads, pool.head_dim, pool.page_size, causal=True,
                               **common)
        meta.planned_scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch, scale: float) -> torch.Tensor:
        meta: FlashInferMetadata = batch.attn_metadata
        pool = batch.kv_pool
        k_cache, v_cache = pool.k_cache(layer_id), pool.v_cache(layer_id)
        kernels.store_kv(k_cache, v_cache, k, v, batch.out_cache_loc, pool.page_size)
        if meta.planned_scale != scale:
            self._plan(meta, batch, q, scale)
        shape = (pool.num_pages, pool.page_size, pool.kv_heads, pool.head_dim)
        paged = (k_cache.view(shape), v_cache.view(shape))
        wrapper = self._decode if meta.mode == ForwardMode.DECODE else self._prefill
        out = wrapper.run(q.contiguous(), paged)
        return out.reshape(q.shape[0], -1)
