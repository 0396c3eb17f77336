"""Attention through the Triton kernels of ``sgl_pd_kernel.triton_attention``.

Per step (init_forward_metadata) it needs only device copies of the lengths and, for extend,
each request's first query row; the kernels read K/V straight from the pool through the
per-token slot table ``batch.token_slots`` (page size 1 in the kernels' terms), so nothing is
gathered. Per layer: one store kernel, then one decode (split-KV + merge) or extend kernel.

On CPU the kernels run only under the Triton interpreter (TRITON_INTERPRET=1): correct, slow,
for tests. Importing this module imports triton; the registry imports it inside its factory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_pd_kernel import triton_attention as kernels
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.kv_pool import KVPool


@dataclass
class TritonAttnMetadata:
    mode: ForwardMode
    seq_lens: torch.Tensor  # [B] on the pool's device
    extend_lens: torch.Tensor  # [B] on the pool's device
    q_start: torch.Tensor | None  # [B] first row of each request's queries (extend only)
    max_extend: int  # host int: sizes the extend grid
    num_splits: int  # decode: key splits per (request, KV head)
    # where the kernels find token slots: batch.token_slots per token (page 1), or under CUDA
    # graphs the static page table with the pool's page size
    slot_table: torch.Tensor | None = None
    table_page: int = 1


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # interpreter: splits only cost time


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True
    # extend metadata reads device_lens (constant per short-prefill bucket) and the host
    # extend_lens for the grid size only: no host data changes between replays
    supports_prefill_graph = True

    def __init__(self) -> None:
        self._graph_pages: torch.Tensor | None = None  # [max_bs, max_pages] int32, graphs only
        self._graph_lens: torch.Tensor | None = None  # [2, max_bs] int64: seq_lens, extend_lens
        self._graph_max_context = 0

    def _metadata(self, batch: ForwardBatch, split_len: int) -> TritonAttnMetadata:
        device = batch.token_slots.device
        if batch.device_lens is not None:  # the runner's one host-to-device copy
            seq_lens, extend_lens = batch.device_lens[0], batch.device_lens[1]
        else:
            seq_lens, extend_lens = batch.seq_lens.to(device), batch.extend_lens.to(device)
        pool = batch.kv_pool
        if batch.mode == ForwardMode.DECODE:
            splits = kernels.decode_splits(batch.batch_size, pool.kv_heads, split_len, _num_sms(device))
            return TritonAttnMetadata(batch.mode, seq_lens, extend_lens, None, 1, splits)
        q_start = torch.cumsum(extend_lens, 0) - extend_lens
        max_extend = int(batch.extend_lens.max())  # host tensor: no device sync
        return TritonAttnMetadata(batch.mode, seq_lens, extend_lens, q_start, max_extend, 1)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.token_slots.device.type != "cuda" and not kernels.INTERPRETED:
            raise ValueError("the triton attention backend runs on CUDA; on CPU only under the Triton "
                             "interpreter (TRITON_INTERPRET=1 before start-up: slow, for tests)")
        batch.attn_metadata = self._metadata(batch, int(batch.token_slots.shape[1]))

    # ---- CUDA graphs (decode) ---------------------------------------------------------------
    # Captured kernels read lengths and a page table from static buffers owned here; split
    # bounds come from seq_len inside the kernel, so the one fixed choice per graph is the split
    # count, sized for the longest context a replay may see.
    def init_cuda_graph_state(self, max_bs: int, max_context_len: int, kv_pool: KVPool) -> None:
        device = kv_pool.kv_buffer.device
        self._graph_max_context = max_context_len
        max_pages = -(-max_context_len // kv_pool.page_size)
        self._graph_pages = torch.zeros(max_bs, max_pages, dtype=torch.int32, device=device)
        self._graph_lens = torch.ones(2, max_bs, dtype=torch.int64, device=device)

    def init_forward_metadata_capture(self, batch: ForwardBatch) -> None:
        if self._graph_pages is None or self._graph_lens is None:
            raise RuntimeError("init_cuda_graph_state must run before capture")
        if batch.mode != ForwardMode.DECODE:
            raise ValueError("Triton graphs capture decode steps only")
        bs, pool = batch.batch_size, batch.kv_pool
        lens = self._graph_lens[:, :bs]
        splits = kernels.decode_splits(bs, pool.kv_heads, self._graph_max_context,
                                       _num_sms(self._graph_pages.device))
        batch.attn_metadata = TritonAttnMetadata(batch.mode, lens[0], lens[1], None, 1, splits,
                                                 self._graph_pages[:bs], pool.page_size)

    def init_forward_metadata_replay(self, batch: ForwardBatch, padded_bs: int) -> None:
        """Rows past the real batch get length 1 and page 0: they read the zero dummy page."""
        assert self._graph_pages is not None and self._graph_lens is not None
        bs, ps = batch.batch_size, batch.kv_pool.page_size
        pages = batch.token_slots[:, ::ps] // ps  # [B, ceil(L / ps)]: slot -> page
        self._graph_pages[:bs, : pages.shape[1]] = pages
        self._graph_pages[bs:padded_bs] = 0
        lens = batch.device_lens if batch.device_lens is not None else torch.stack(
            [batch.seq_lens, batch.extend_lens]).to(self._graph_lens.device)
        self._graph_lens[:, :bs] = lens
        self._graph_lens[:, bs:padded_bs] = 1

    # ---- per layer ------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch, scale: float) -> torch.Tensor:
        meta: TritonAttnMetadata = batch.attn_metadata
        pool = batch.kv_pool
        k_cache, v_cache = pool.k_cache(layer_id), pool.v_cache(layer_id)
        # slots below page_size are dummy page 0: padded tokens' writes are dropped there
        kernels.store_kv(k_cache, v_cache, k, v, batch.out_cache_loc, pool.page_size)
        if q.stride(-1) != 1:
            q = q.contiguous()
        if meta.mode == ForwardMode.DECODE:
            table, page = (batch.token_slots, 1)
            if meta.slot_table is not None:
                table, page = meta.slot_table, meta.table_page
            out = kernels.decode_attention(q, k_cache, v_cache, table, page, meta.seq_lens, scale,
                                           num_splits=meta.num_splits)
        else:
            assert meta.q_start is not None
            out = kernels.extend_attention(q, k_cache, v_cache, batch.token_slots, 1, meta.seq_lens,
                                           meta.extend_lens, meta.q_start, meta.max_extend, scale)
        return out.reshape(q.shape[0], -1)
