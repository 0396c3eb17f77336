"""Rank-to-rank KV writes of PD with TP: which bytes each prefill rank writes where (no torch).

A pool is [layers, 2, pages, page_size, kv_heads, head_dim] (kv_layout.py) holding the rank's
own KV heads. One ``HeadSlice`` (tp_mapping.head_mapping) of a chunk becomes one NIXL WRITE from
prefill rank ``src_rank``'s pool to decode rank ``dst_rank``'s pool: heads [head_lo, head_hi)
of every layer's K and V of the chunk's pages. When the slice is all the heads of both pools,
a page is one contiguous run (one descriptor per layer, kind, page); otherwise the heads of a
token are a strided piece of the page (one descriptor per layer, kind, page, token slot).

Completion: the chunk's usual notification (messages.kv_notif) rides on the slice prefill rank
0 writes to decode rank 0 (there always is one: both hold head 0), posted only after every other
slice of the chunk is done; every other slice carries ``partial_notif(room)``, which the decode
rank it lands on counts. Decode decodes a room once each of its ranks has counted
``partials_expected`` for it (tp_sides.py).
"""

from __future__ import annotations

import numpy as np

from sglang_pd.disaggregation.kv_layout import KVLayout
from sglang_pd.disaggregation.tp_mapping import HeadSlice, rank_heads

_PARTIAL = b"kvp|"


def partial_notif(room: int) -> bytes:
    return _PARTIAL + str(room).encode()


def parse_partial(data: bytes) -> int | None:
    """The room of a partial-slice notification, or None (another kind of notification)."""
    if not data.startswith(_PARTIAL):
        return None
    try:
        return int(data[len(_PARTIAL):])
    except ValueError:
        return None


def local_range(num_kv_heads: int, tp_size: int, rank: int, s: HeadSlice) -> int:
    """Where global head ``s.head_lo`` sits in rank ``rank``'s pool."""
    return s.head_lo - rank_heads(num_kv_heads, tp_size, rank).start


def slice_table(layout: KVLayout, pages: np.ndarray, head_lo: int, width: int,
                whole: bool) -> np.ndarray:
    """Nx3 uint64 (addr, len, dev) rows covering local heads [head_lo, head_lo + width) of every
    layer's K and V of ``pages``, layer-major then page then slot, so two sides' tables pair up
    row by row. ``whole``: both sides hold exactly these heads, so rows are whole pages."""
    slabs = np.arange(layout.num_layers * 2, dtype=np.uint64)[:, None] * np.uint64(layout.num_pages)
    page_addr = np.uint64(layout.base_addr) + (slabs + pages.astype(np.uint64)[None, :]) * \
        np.uint64(layout.page_bytes)
    if whole:
        addr = page_addr.reshape(-1)
        length = layout.page_bytes
    else:
        head_bytes = layout.head_dim * layout.itemsize
        slots = np.arange(layout.page_size, dtype=np.uint64) * np.uint64(layout.kv_heads)
        offs = (slots + np.uint64(head_lo)) * np.uint64(head_bytes)
        addr = (page_addr[:, :, None] + offs[None, None, :]).reshape(-1)
        length = width * head_bytes
    table = np.empty((addr.size, 3), dtype=np.uint64)
    table[:, 0] = addr
    table[:, 1] = length
    table[:, 2] = layout.device_id
    return table


def partials_expected(slices: list[HeadSlice], dst_rank: int, chunks: int) -> int:
    """Partial notifications decode rank ``dst_rank`` receives for a room of ``chunks`` chunks:
    one per slice into it and chunk, except rank 0's slice from prefill rank 0 (it carries the
    chunk's own notification)."""
    per_chunk = sum(1 for s in slices if s.dst_rank == dst_rank
                    and not (s.src_rank == 0 and s.dst_rank == 0))
    return per_chunk * chunks


def slice_bytes(layout: KVLayout, s: HeadSlice, num_pages: int) -> int:
    """Bytes one slice moves for ``num_pages`` pages."""
    return layout.num_layers * 2 * num_pages * layout.page_size * s.width * layout.head_dim * \
        layout.itemsize
