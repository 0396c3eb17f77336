"""Host-side CSR page tables for paged-KV kernels that plan on the host (FlashInfer).

Built from the lengths the model runner keeps on the host, so planning never reads a device
tensor back: FlashInfer's ``plan()`` copies its indptr arguments to the host, which costs a
device sync per argument when they live on the GPU. Only the gather index travels to the device
(non-blocking) to pick each used page out of the step's [B, width] page table there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedPlanInputs:
    kv_indptr: torch.Tensor  # [B + 1] int32, host: request b's pages are kv_indices[b:b+1]
    kv_last_page_len: torch.Tensor  # [B] int32, host: tokens in each request's last page
    # [B + 1] int32, host, every step but a pure decode: a mixed step's decode rows are
    # one-token extends, so their queries are counted like any prefill chunk's
    qo_indptr: torch.Tensor | None
    page_rows: torch.Tensor  # [kv_indptr[-1]] int64, host: flat index into the [B, width] table


def paged_plan_inputs(seq_lens: list[int], extend_lens: list[int] | None, page_size: int,
                      width: int) -> PagedPlanInputs:
    """``seq_lens``: KV length of each request after the step; ``extend_lens``: its new tokens
    (None for a pure decode step); ``width``: pages per row of the step's page table."""
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError(f"every request needs at least one token of KV, got {seq_lens}")
    pages = torch.tensor([-(-n // page_size) for n in seq_lens], dtype=torch.int64)
    if int(pages.max()) > width:
        raise ValueError(f"a request spans {int(pages.max())} pages; the page table has {width}")
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int64)
    torch.cumsum(pages, 0, out=indptr[1:])
    last = torch.tensor(seq_lens, dtype=torch.int64) - (pages - 1) * page_size
    rows = torch.repeat_interleave(torch.arange(len(seq_lens)), pages)
    within = torch.arange(int(indptr[-1])) - torch.repeat_interleave(indptr[:-1], pages)
    qo_indptr = None
    if extend_lens is not None:
        qo_indptr = torch.zeros(len(extend_lens) + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor(extend_lens, dtype=torch.int32), 0, out=qo_indptr[1:])
    return PagedPlanInputs(indptr.to(torch.int32), last.to(torch.int32), qo_indptr,
                           rows * width + within)


def use_tensor_cores(num_q_heads: int, num_kv_heads: int) -> bool:
    """Decode with the prefill (tensor-core) kernels once 4 or more query heads share a KV head:
    the group is then a matrix-multiply tile's worth of rows, where the CUDA-core decode kernel
    re-reads each K/V row per query head."""
    return num_q_heads // num_kv_heads >= 4
