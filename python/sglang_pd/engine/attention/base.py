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
from sglang_pd.engine.kv_pool import KVPool


class AttentionBackend(ABC):
    # CUDA-graph hooks (engine/cuda_graph.py) below are optional: a backend that sets this True
    # implements all three; the runner never calls them otherwise.
    supports_cuda_graph: bool = False
    # short-prefill graphs (engine/prefill_graph.py): init_forward_metadata on an extend batch
    # whose lengths are constant device tensors builds metadata a graph can capture
    supports_prefill_graph: bool = False
    # decode attention computes over batch x longest context (padded), not the sum of contexts:
    # the decode cost model then keys a step by that (PolicyConfig.decode_attention_padded)
    decode_pads_to_longest: bool = False

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

    # ---- optional CUDA-graph hooks (only when supports_cuda_graph) ---------------------------
    def init_cuda_graph_state(self, max_bs: int, max_context_len: int, kv_pool: KVPool) -> None:
        """Allocate the static buffers that captured graphs read their metadata from, sized
        for ``max_bs`` requests of at most ``max_context_len`` tokens in ``kv_pool``."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_capture(self, batch: ForwardBatch) -> None:
        """Like init_forward_metadata, but every tensor the layers read lives in the static
        buffers (``batch`` itself is built on the graph runner's static inputs)."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_replay(self, batch: ForwardBatch, padded_bs: int) -> None:
        """Before a replay: refresh the static buffers in place from the real ``batch`` (its
        rows first, then padding rows up to the captured ``padded_bs`` that read and write only
        dummy page 0), without allocating or changing any shape."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
