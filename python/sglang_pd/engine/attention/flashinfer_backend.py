"""Attention through FlashInfer's paged-KV wrappers (optional: ``pip install .[gpu]``).

The KVPool's per-layer K and V views [pages, page_size, kv_heads, head_dim] are FlashInfer's
"NHD" paged layout as they are, so nothing is copied. Per step we build FlashInfer's CSR page
table (indptr / last_page_len, and qo_indptr for every step but a pure decode: a mixed step's
decode rows are one-token extends) on the host from the host lengths (paged_index.py), gather
the used page ids on the device with one index of known size (no sync), and plan once (on the
first layer, when the softmax scale is known); per layer we store K/V with the Triton store
kernel and run the planned wrapper. Decode uses the tensor-core kernels for GQA groups of 4+.

No CUDA-graph support here (supports_cuda_graph stays False): "auto" picks triton while graphs
are on, and the engine reserves no graph memory for this backend.

NOT VERIFIED on a GPU yet: written against FlashInfer's documented wrapper API; docs/gpu.md.
Importing this module imports flashinfer and triton; the registry imports it inside its factory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flashinfer
import torch

from sgl_pd_kernel import triton_attention as kernels
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.attention.paged_index import (PagedPlanInputs, paged_plan_inputs,
                                                    use_tensor_cores)
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.forward_batch import ForwardBatch

WORKSPACE_BYTES = 128 << 20


@dataclass
class FlashInferMetadata:
    mode: ForwardMode
    plan: PagedPlanInputs  # host indptrs (plan() reads them there)
    kv_indices: torch.Tensor  # [sum pages] int32 on the device
    planned_scale: float | None = None


class FlashInferAttnBackend(AttentionBackend):
    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None
        self._decode: Any = None  # flashinfer wrapper, made on the first decode plan (needs the GQA group)
        self._prefill: Any = None

    def _workspace_on(self, device: torch.device) -> torch.Tensor:
        if self._workspace is None:
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspace

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.token_slots.device
        if device.type != "cuda":
            raise ValueError("the flashinfer attention backend runs on CUDA only (--device cuda)")
        ps = batch.kv_pool.page_size
        page_table = batch.token_slots[:, ::ps] // ps  # [B, width] page ids, on the device
        extend = None if batch.mode == ForwardMode.DECODE else batch.extend_lens.tolist()
        plan = paged_plan_inputs(batch.seq_lens.tolist(), extend, ps, int(page_table.shape[1]))
        rows = plan.page_rows.to(device, non_blocking=True)
        kv_indices = page_table.reshape(-1).index_select(0, rows).to(torch.int32)
        batch.attn_metadata = FlashInferMetadata(batch.mode, plan, kv_indices)

    def _plan(self, meta: FlashInferMetadata, batch: ForwardBatch, q: torch.Tensor, scale: float) -> None:
        pool, plan = batch.kv_pool, meta.plan
        workspace = self._workspace_on(q.device)
        common = dict(q_data_type=q.dtype, kv_data_type=pool.dtype, sm_scale=scale)
        if meta.mode == ForwardMode.DECODE:
            if self._decode is None:
                self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "NHD", use_tensor_cores=use_tensor_cores(q.shape[1], pool.kv_heads))
            self._decode.plan(plan.kv_indptr, meta.kv_indices, plan.kv_last_page_len, q.shape[1],
                              pool.kv_heads, pool.head_dim, pool.page_size, **common)
        else:
            if self._prefill is None:
                self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
            self._prefill.plan(plan.qo_indptr, plan.kv_indptr, meta.kv_indices,
                               plan.kv_last_page_len, q.shape[1], pool.kv_heads, pool.head_dim,
                               pool.page_size, causal=True, **common)
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
