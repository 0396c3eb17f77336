"""The KV-pool memory layout shared by the engine and the KV transports.

The engine owns one contiguous tensor ``kv_buffer`` of shape
``[num_layers, 2, num_pages, page_size, kv_heads, head_dim]`` (2 = K, V).
Page 0 is a reserved dummy page and is never transferred. A request's KV is
a list of page ids; the same page id indexes every layer's K and V, so the
bytes of (layer l, kind kv, page p) start at

    base_addr + ((l * 2 + kv) * num_pages + p) * page_bytes

This module is the single place that formula lives. It imports no torch at
module level so bootstrap messages (which embed a KVLayout) stay cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

if TYPE_CHECKING:
    import torch

# Item sizes of the dtypes a KV pool may use; the string is what travels on the
# wire, so both sides agree without importing torch.
DTYPE_ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

RESERVED_PAGE = 0


class KVLayout(msgspec.Struct, frozen=True):
    num_layers: int
    num_pages: int
    page_size: int
    kv_heads: int
    head_dim: int
    dtype: str
    base_addr: int
    device: str  # "cpu" or "cuda:N"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_ITEMSIZE:
            raise ValueError(
                f"KVLayout dtype {self.dtype!r} is not supported; allowed: {sorted(DTYPE_ITEMSIZE)}"
            )
        for name in ("num_layers", "num_pages", "page_size", "kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KVLayout.{name} must be > 0, got {getattr(self, name)}")
        if self.num_pages < 2:
            # Page 0 is the dummy page, so a usable pool needs at least one more.
            raise ValueError(
                f"KVLayout.num_pages must be >= 2 (page 0 is reserved), got {self.num_pages}"
            )
        if self.device != "cpu" and not (
            self.device.startswith("cuda:") and self.device[5:].isdigit()
        ):
            raise ValueError(f"KVLayout.device must be 'cpu' or 'cuda:N', got {self.device!r}")

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of one layer's K (or V)."""
        return self.page_size * self.kv_heads * self.head_dim * self.itemsize

    @property
    def region_bytes(self) -> int:
        """Bytes of the whole kv_buffer."""
        return self.num_layers * 2 * self.num_pages * self.page_bytes

    @property
    def bytes_per_page_all_layers(self) -> int:
        """Bytes moved when one page id is transferred (all layers, K and V)."""
        return self.num_layers * 2 * self.page_bytes

    @property
    def num_descriptors(self) -> int:
        """One transfer descriptor per (layer, kind, page)."""
        return self.num_layers * 2 * self.num_pages

    @property
    def device_id(self) -> int:
        return 0 if self.device == "cpu" else int(self.device[5:])

    @property
    def mem_type(self) -> str:
        """NIXL memory segment name for this buffer."""
        return "DRAM" if self.device == "cpu" else "VRAM"

    def page_offset(self, layer: int, kv: int, page: int) -> int:
        return ((layer * 2 + kv) * self.num_pages + page) * self.page_bytes

    def compatible_with(self, other: KVLayout) -> str | None:
        """None if pages can be copied byte-for-byte between the two pools.

        num_pages, base_addr and device may differ; everything that shapes a
        page must match, else the bytes would be reinterpreted wrongly.
        """
        diffs = [
            f"{name}: local={getattr(self, name)!r} remote={getattr(other, name)!r}"
            for name in ("page_size", "dtype", "kv_heads", "head_dim", "num_layers")
            if getattr(self, name) != getattr(other, name)
        ]
        if not diffs:
            return None
        return (
            "KV layout mismatch (" + "; ".join(diffs) + "). Prefill and decode must use the "
            "same page_size, dtype, kv_heads (per rank), head_dim and num_layers; "
            "only num_pages may differ."
        )

    def descriptor_table(self) -> np.ndarray:
        """Nx3 uint64 array (addr, len, dev_id), row r = (layer*2+kv)*num_pages + page."""
        rows = np.arange(self.num_descriptors, dtype=np.uint64)
        addr = np.uint64(self.base_addr) + rows * np.uint64(self.page_bytes)
        table = np.empty((self.num_descriptors, 3), dtype=np.uint64)
        table[:, 0] = addr
        table[:, 1] = self.page_bytes
        table[:, 2] = self.device_id
        return table

    def descriptor_indices(self, pages: np.ndarray) -> np.ndarray:
        """Rows of descriptor_table() covering every layer's K and V of ``pages``.

        Ordered layer-major, so equal-length page lists on two sides pair up
        descriptor-by-descriptor, and runs of adjacent pages stay adjacent
        (NIXL coalesces adjacent descriptors into one RMA).
        """
        slabs = np.arange(self.num_layers * 2, dtype=np.int64)[:, None] * self.num_pages
        idx = (slabs + pages.astype(np.int64)[None, :]).reshape(-1)
        if self.num_descriptors <= np.iinfo(np.int32).max:
            return idx.astype(np.int32)
        return idx

    def check_pages(self, pages: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
        """Validate a page list against this pool; returns it as an int64 array."""
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            raise ValueError(f"{what}: empty page list; at least one page is required")
        lo, hi = int(arr.min()), int(arr.max())
        if lo <= RESERVED_PAGE or hi >= self.num_pages:
            raise ValueError(
                f"{what}: page ids must be in [1, {self.num_pages - 1}] "
                f"(page 0 is the reserved dummy page); got min={lo} max={hi}"
            )
        if np.unique(arr).size != arr.size:
            raise ValueError(f"{what}: duplicate page ids are not allowed")
        return arr

    @classmethod
    def from_tensor(cls, kv_buffer: torch.Tensor) -> KVLayout:
        shape = tuple(kv_buffer.shape)
        if len(shape) != 6 or shape[1] != 2:
            raise ValueError(
                "kv_buffer must have shape "
                "[num_layers, 2, num_pages, page_size, kv_heads, head_dim]; "
                f"got {list(shape)}"
            )
        if not kv_buffer.is_contiguous():
            raise ValueError("kv_buffer must be contiguous: the byte-offset formula assumes it")
        dtype = str(kv_buffer.dtype).removeprefix("torch.")
        if kv_buffer.device.type == "cpu":
            device = "cpu"
        elif kv_buffer.device.type == "cuda":
            device = f"cuda:{kv_buffer.device.index or 0}"
        else:
            raise ValueError(f"kv_buffer device must be cpu or cuda, got {kv_buffer.device}")
        return cls(
            num_layers=shape[0],
            num_pages=shape[2],
            page_size=shape[3],
            kv_heads=shape[4],
            head_dim=shape[5],
            dtype=dtype,
            base_addr=int(kv_buffer.data_ptr()),
            device=device,
        )

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)
