"""Triton attention kernels (sgl-kernel/sgl_pd_kernel) against their torch references.

On a CPU-only host these run under the Triton interpreter (TRITON_INTERPRET=1, set before triton
is imported), at small shapes. triton is in the ``gpu`` extra (a ~290 MB wheel), so without it
these tests skip.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton not installed (pip install triton: the gpu extra)",
                    exc_type=ImportError)

from sgl_pd_kernel import reference as ref
from sgl_pd_kernel import triton_attention as tk

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAGE = 4


class _Cache:
    """A random [slots, kv_heads, head_dim] K/V cache (page 0 zero) and requests on shuffled pages."""

    def __init__(self, seq_lens: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
        gen = torch.Generator().manual_seed(seed)
        pages_needed = [-(-n // PAGE) for n in seq_lens]
        num_pages = sum(pages_needed) + 3
        order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()  # page 0 stays dummy
        shape = (num_pages * PAGE, kv_heads, head_dim)
        self.k = torch.randn(shape, generator=gen).to(dtype)
        self.v = torch.randn(shape, generator=gen).to(dtype)
        self.k[:PAGE] = 0
        self.v[:PAGE] = 0
        width = max(pages_needed)
        self.page_table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
        for b, n in enumerate(pages_needed):
            self.page_table[b, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
        self.seq_lens = torch.tensor(seq_lens)
        # the per-token slot table (ForwardBatch.token_slots) that page size 1 reads
        max_len = max(seq_lens)
        self.token_slots = torch.stack(
            [ref.token_slots_of(self.page_table, PAGE, max_len, b) for b in range(len(seq_lens))]
        )
        self.gen = gen

    def to(self, device: str) -> _Cache:
        for name in ("k", "v", "page_table", "seq_lens", "token_slots"):
            setattr(self, name, getattr(self, name).to(device))
        return self


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("use_pages", [True, False])
def test_decode_matches_reference(dtype: torch.dtype, num_splits: int, use_pages: bool) -> None:
    hq, hkv, d = 8, 2, 16
    # lengths: one key, a partial block, several blocks with splits left empty, exact block
    c = _Cache([1, 7, 45, 16], hkv, d, dtype, seed=num_splits).to(DEVICE)
    q = torch.randn(4, hq, d, generator=c.gen).to(dtype).to(DEVICE)
    table, page = (c.page_table, PAGE) if use_pages else (c.token_slots, 1)
    got = tk.decode_attention(q, c.k, c.v, table, page, c.seq_lens, 0.25, num_splits=num_splits, block_n=16)
    want = ref.decode_attention_ref(q, c.k, c.v, table, page, c.seq_lens, 0.25)
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_matches_reference(dtype: torch.dtype) -> None:
    hq, hkv, d = 4, 2, 16  # GQA group 2
    # fresh prompt, chunk after a cached prefix, one token after a prefix, long chunk, whole block
    seq_lens, ext_lens = [9, 12, 14, 40, 16], [9, 5, 1, 33, 16]
    c = _Cache(seq_lens, hkv, d, dtype, seed=3).to(DEVICE)
    q = torch.randn(sum(ext_lens), hq, d, generator=c.gen).to(dtype).to(DEVICE)
    ext = torch.tensor(ext_lens, device=DEVICE)
    q_start = torch.cumsum(ext, 0) - ext
    got = tk.extend_attention(q, c.k, c.v, c.page_table, PAGE, c.seq_lens, ext, q_start,
                              max(ext_lens), 0.3, block_m=16, block_n=16)
    want = ref.extend_attention_ref(q, c.k, c.v, c.page_table, PAGE, c.seq_lens, ext, 0.3)
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


def test_extend_with_token_slots_and_odd_head_dim() -> None:
    hq, hkv, d = 6, 3, 24  # head_dim not a power of two: masked lanes
    seq_lens, ext_lens = [5, 21], [5, 11]
    c = _Cache(seq_lens, hkv, d, torch.float32, seed=5).to(DEVICE)
    q = torch.randn(sum(ext_lens), hq, d, generator=c.gen).to(DEVICE)
    ext = torch.tensor(ext_lens, device=DEVICE)
    got = tk.extend_attention(q, c.k, c.v, c.token_slots, 1, c.seq_lens, ext, torch.cumsum(ext, 0) - ext,
                              max(ext_lens), 0.2, block_m=16, block_n=16)
    want = ref.extend_attention_ref(q, c.k, c.v, c.token_slots, 1, c.seq_lens, ext, 0.2)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_store_kv_matches_reference_and_skips_dummy_page() -> None:
    c = _Cache([8], 2, 16, torch.float32, seed=7).to(DEVICE)
    k = torch.randn(5, 2, 16, generator=c.gen).to(DEVICE)
    v = torch.randn(5, 2, 16, generator=c.gen).to(DEVICE)
    loc = torch.tensor([9, 0, 13, 2, 19], device=DEVICE)  # 0 and 2: padded tokens in page 0
    k_cache, v_cache = c.k.clone(), c.v.clone()
    tk.store_kv(k_cache, v_cache, k, v, loc, dummy_slots=PAGE)
    ref.store_kv_ref(c.k, c.v, k, v, loc, dummy_slots=PAGE)
    torch.testing.assert_close(k_cache, c.k)
    torch.testing.assert_close(v_cache, c.v)
    assert not k_cache[:PAGE].any() and not v_cache[:PAGE].any()
    torch.testing.assert_close(k_cache[13], k[2])


def test_decode_splits_fill_the_device_but_not_past_the_keys() -> None:
    assert tk.decode_splits(1, 8, 1024, num_sms=132) == 16  # 8 programs; 16 blocks of 64 keys
    assert tk.decode_splits(1, 8, 100, num_sms=132) == 2  # only 2 key blocks of 64
    assert tk.decode_splits(64, 8, 4096, num_sms=132) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama3_head_dim_gqa_4_default_blocks(dtype: torch.dtype) -> None:
    """Production head shape (head_dim 128, 4 query heads per KV head) at the kernels' default
    64-key blocks, on few heads and short contexts so that the interpreter stays quick."""
    hq, hkv, d = 8, 2, 128
    c = _Cache([1, 70, 129], hkv, d, dtype, seed=11).to(DEVICE)  # one key; 2 blocks; 3 blocks
    q = torch.randn(3, hq, d, generator=c.gen).to(dtype).to(DEVICE)
    got = tk.decode_attention(q, c.k, c.v, c.page_table, PAGE, c.seq_lens, d**-0.5, num_splits=2)
    want = ref.decode_attention_ref(q, c.k, c.v, c.page_table, PAGE, c.seq_lens, d**-0.5)
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))

    seq_lens, ext_lens = [70, 20], [6, 20]  # a chunk after a 64-token prefix; a fresh prompt
    c = _Cache(seq_lens, hkv, d, dtype, seed=12).to(DEVICE)
    q = torch.randn(sum(ext_lens), hq, d, generator=c.gen).to(dtype).to(DEVICE)
    ext = torch.tensor(ext_lens, device=DEVICE)
    got = tk.extend_attention(q, c.k, c.v, c.token_slots, 1, c.seq_lens, ext, torch.cumsum(ext, 0) - ext,
                              max(ext_lens), d**-0.5)
    want = ref.extend_attention_ref(q, c.k, c.v, c.token_slots, 1, c.seq_lens, ext, d**-0.5)
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))
