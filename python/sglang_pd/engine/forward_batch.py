"""The per-step batch handed to the model: the contract between model runner, models and
attention backends.

Everything here is built once per step by the model runner (one loop per request, never per
token) and read by the model layers and the attention backend. Models never see requests or
pages: only token ids, positions, and where each new token's K/V goes in the paged pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from sglang_pd.core.step import ForwardMode  # the one definition (torch-free)

if TYPE_CHECKING:
    from sglang_pd.engine.attention.base import AttentionBackend
    from sglang_pd.engine.kv_pool import KVPool


@dataclass(eq=False)
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64: the new tokens of all requests, concatenated
    positions: torch.Tensor  # [T] int64: position of each new token in its sequence
    out_cache_loc: torch.Tensor  # [T] int64: KV slot (page * page_size + offset) per new token
    seq_lens: torch.Tensor  # [B] int64 (CPU): KV length of each request *after* this step
    extend_lens: torch.Tensor  # [B] int64 (CPU): new tokens of each request in this step
    # [B, max(seq_lens)] int64: KV slot of every token of each request (0 = dummy slot past the
    # end). Slot 0 lies in the reserved dummy page 0, which is never allocated.
    token_slots: torch.Tensor
    kv_pool: KVPool
    attn_backend: AttentionBackend
    attn_metadata: Any = field(default=None)  # filled by attn_backend.init_forward_metadata
    # [2, B] int64 on the model's device: seq_lens, extend_lens, copied by the model runner with
    # the step's other tensors (one host-to-device copy); None on CPU and in hand-built batches
    device_lens: torch.Tensor | None = field(default=None)
    # [B] on the model's device: each row's last real token when rows are padded to a fixed
    # length (short-prefill graphs, engine/prefill_graph.py); None: tokens are packed
    row_last: torch.Tensor | None = field(default=None)

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def last_token_indices(self) -> torch.Tensor:
        """Index into the T new tokens of each request's last new token ([B]). Computed on the
        model's device from ``device_lens`` when the runner put the lengths there: moving a
        host index over would be a blocking copy in the middle of the forward."""
        if self.row_last is not None:  # padded rows (short-prefill graphs)
            return self.row_last
        extend_lens = self.extend_lens if self.device_lens is None else self.device_lens[1]
        return torch.cumsum(extend_lens, 0) - 1
