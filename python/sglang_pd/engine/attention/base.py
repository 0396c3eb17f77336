"""Attention backend interface.

A backend (1) prepares per-step metadata from the ForwardBatch once, before the layers run,
and (2) for each layer stores the new tokens' K/V into the paged pool at
``batch.out_cache_loc`` and attends every new query token to its request's whole KV
(cached prefix + new tokens), causally.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from sglang_pd.engine.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Build whatever the backend needs for this step into ``batch.attn_metadata``."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_q_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        layer_id: int,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor:
        """Store k/v of the new tokens, attend, and return [T, num_q_heads * head_dim]."""
