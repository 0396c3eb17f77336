"""Stage kernels: the Triton kernels of sgl-kernel against their torch references, on the
device at production shapes (head_dim 128, 32 query / 8 KV heads, pages 16 and 64, contexts
1K-32K, bf16), outputs poisoned with NaN first so an unwritten row cannot pass. Dry run: the
Triton interpreter at tiny shapes, float32 (check.sh sets TRITON_INTERPRET=1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from sglang_pd.tools.gpu_check.common import Ctx, Skip, attempt, failed, time_ms


@dataclass(frozen=True)
class Shape:
    q_heads: int
    kv_heads: int
    head_dim: int
    pages: tuple[int, ...]
    decode_lens: tuple[int, ...]
    extend: tuple[tuple[int, int], ...]  # (seq_len, extend_len)
    tol: float


GPU = Shape(32, 8, 128, (16, 64), (1000, 4103, 16384, 32768), ((2048, 2048), (8192, 1024), (32768, 256)), 2e-2)
CPU = Shape(4, 1, 32, (4, 16), (20, 70), ((24, 24), (70, 9)), 1e-4)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return math.inf  # a poisoned (unwritten) element survived
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


class Cache:
    """A paged pool holding ``lens`` sequences in shuffled pages (page 0 is the dummy page)."""

    def __init__(self, s: Shape, page: int, lens: tuple[int, ...], dtype: torch.dtype, dev: str) -> None:
        gen = torch.Generator().manual_seed(page)
        need = [-(-n // page) for n in lens]
        num_pages = sum(need) + 1
        order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
        width = max(need)
        table = torch.zeros(len(lens), width, dtype=torch.int32)
        at = 0
        for b, n in enumerate(need):
            table[b, :n] = torch.tensor(order[at:at + n], dtype=torch.int32)
            at += n
        self.table = table.to(dev)
        self.k = torch.randn(num_pages * page, s.kv_heads, s.head_dim, dtype=dtype, device=dev)
        self.v = torch.randn_like(self.k)
        self.k[:page].zero_()
        self.v[:page].zero_()
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)


def check_decode(ctx: Ctx, tk: Any, ref: Any, s: Shape, page: int) -> dict[str, Any]:
    c = Cache(s, page, s.decode_lens, ctx.dtype, ctx.device)
    q = torch.randn(len(s.decode_lens), s.q_heads, s.head_dim, dtype=ctx.dtype, device=ctx.device)
    scale = s.head_dim ** -0.5
    splits = tk.decode_splits(q.shape[0], s.kv_heads, max(s.decode_lens))
    out = torch.full_like(q, float("nan"))
    tk.decode_attention(q, c.k, c.v, c.table, page, c.seq_lens, scale, num_splits=splits, out=out)
    want = ref.decode_attention_ref(q, c.k, c.v, c.table, page, c.seq_lens, scale)
    err = rel_err(out, want)
    row: dict[str, Any] = {"page": page, "seq_lens": list(s.decode_lens), "splits": splits,
                           "rel_err": err, "ok": err <= s.tol}
    if not ctx.dry_run:  # bytes: every K/V row of every sequence read once
        kv_bytes = 2 * sum(s.decode_lens) * s.kv_heads * s.head_dim * c.k.element_size()
        t = time_ms(lambda: tk.decode_attention(q, c.k, c.v, c.table, page, c.seq_lens, scale,
                                                num_splits=splits, out=out), ctx.device, iters=20)
        row.update(time_ms=t["median_ms"], kv_gbps=round(kv_bytes / t["median_ms"] / 1e6, 1))
    return row


def check_extend(ctx: Ctx, tk: Any, ref: Any, s: Shape, page: int) -> dict[str, Any]:
    lens = tuple(n for n, _ in s.extend)
    c = Cache(s, page, lens, ctx.dtype, ctx.device)
    ext = torch.tensor([e for _, e in s.extend], dtype=torch.int32, device=ctx.device)
    q_start = (torch.cumsum(ext, 0) - ext).to(torch.int32)
    q = torch.randn(int(ext.sum()), s.q_heads, s.head_dim, dtype=ctx.dtype, device=ctx.device)
    scale = s.head_dim ** -0.5
    out = torch.full_like(q, float("nan"))
    max_ext = max(e for _, e in s.extend)
    tk.extend_attention(q, c.k, c.v, c.table, page, c.seq_lens, ext, q_start, max_ext, scale, out=out)
    want = ref.extend_attention_ref(q, c.k, c.v, c.table, page, c.seq_lens, ext, scale)
    err = rel_err(out, want)
    return {"page": page, "seq_ext": [list(x) for x in s.extend], "rel_err": err, "ok": err <= s.tol}


def check_store(ctx: Ctx, tk: Any, ref: Any, s: Shape, page: int) -> dict[str, Any]:
    slots, tokens = 64 * page * 8, 16 * page
    k_cache = torch.randn(slots, s.kv_heads, s.head_dim, dtype=ctx.dtype, device=ctx.device)
    k_cache[:page].zero_()
    v_cache = torch.randn_like(k_cache)
    v_cache[:page].zero_()
    loc = torch.randperm(slots, device=ctx.device)[:tokens]
    loc[: tokens // 8] = torch.arange(tokens // 8, device=ctx.device) % page  # padding -> page 0
    k = torch.randn(tokens, s.kv_heads, s.head_dim, dtype=ctx.dtype, device=ctx.device)
    v = torch.randn_like(k)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    ref.store_kv_ref(want_k, want_v, k, v, loc, page)
    tk.store_kv(k_cache, v_cache, k, v, loc, dummy_slots=page)
    exact = bool(torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v))
    page0_zero = bool((k_cache[:page] == 0).all() and (v_cache[:page] == 0).all())
    return {"page": page, "tokens": tokens, "exact": exact, "page0_zero": page0_zero,
            "ok": exact and page0_zero}


def run(ctx: Ctx, rec: Any) -> str:
    import sgl_pd_kernel.reference as ref

    try:
        import sgl_pd_kernel.triton_attention as tk
    except ImportError as exc:
        raise Skip(f"triton not importable: {exc}") from exc

    s = CPU if ctx.dry_run else GPU
    torch.manual_seed(0)
    rec.data["shape"] = {"q_heads": s.q_heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim,
                         "dtype": ctx.dtype_name, "tolerance": s.tol}
    results = []
    for page in s.pages:
        for kind, fn in (("store_kv", check_store), ("decode", check_decode), ("extend", check_extend)):
            results.append(attempt(rec, f"{kind}_page{page}", partial(fn, ctx, tk, ref, s, page)))
    bad = [k for k, v in rec.data.items() if isinstance(v, dict) and (failed(v) or v.get("ok") is False)]
    if bad:
        rec.piece["status"] = "fail"
    worst = max((r.get("rel_err", 0.0) for r in results if isinstance(r, dict)), default=0.0)
    return f"{len(results) - len(bad)}/{len(results)} ok, worst rel err {worst:.2e}" + (
        f"; failing: {', '.join(bad)}" if bad else "")
