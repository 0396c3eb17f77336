"""The paged KV pool: one contiguous buffer, the layout NIXL registers.

Shape [num_layers, 2 (K, V), num_pages, page_size, kv_heads, head_dim]. Page p of layer l,
kind kv starts at byte ((l * 2 + kv) * num_pages + p) * page_bytes, so a request's pages can be
sent to another host as (layer, kind, page) descriptors of one registered region.
Page 0 is the dummy page: never allocated, target of padding slots, always zero.
Which pages are free is the allocator's business (page_allocator.py), not this tensor's.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
    ) -> None:
        if num_pages < 2:
            raise ValueError(f"KV pool needs at least 2 pages (1 dummy + 1 usable), got {num_pages}")
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        # zeros (calloc: lazily committed on CPU) so that masked-out garbage can never be NaN
        self.kv_buffer = torch.zeros(
            (num_layers, 2, num_pages, page_size, kv_heads, head_dim), dtype=dtype, device=device
        )
        num_slots = num_pages * page_size
        self._k = [self.kv_buffer[l, 0].view(num_slots, kv_heads, head_dim) for l in range(num_layers)]
        self._v = [self.kv_buffer[l, 1].view(num_slots, kv_heads, head_dim) for l in range(num_layers)]

    def k_cache(self, layer_id: int) -> torch.Tensor:
        """[num_pages * page_size, kv_heads, head_dim] view of layer ``layer_id``'s keys."""
        return self._k[layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._v[layer_id]

    @property
    def page_bytes(self) -> int:
        return self.page_size * self.kv_heads * self.head_dim * self.kv_buffer.element_size()

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
