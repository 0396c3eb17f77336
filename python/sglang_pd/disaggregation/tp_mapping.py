"""Which KV heads go where when prefill runs TP size P and decode TP size D (pure: no torch).

H KV heads; rank r of an N-rank server holds ``rank_heads(H, N, r)``: H/N heads each when N
divides H, else (N a multiple of H) the one head its query heads read, replicated over N/H
ranks. This is the same split as ``models/parallel.py`` (kv_head_start, local_kv_heads); a
unit test keeps the two equal.

``head_mapping(H, P, D)`` is computed once per (prefill, decode) pair, when a decode's first
Register arrives (it carries the decode's tp_size): a list of (prefill rank, decode rank, head
range) slices such that every head every decode rank holds comes from exactly one prefill rank
(the lowest that holds it: a replicated head is read once). docs/disaggregation.md section 11
shows the tables; tp_slices.py turns a slice into NIXL descriptors.
"""

from __future__ import annotations

from typing import NamedTuple


class HeadSlice(NamedTuple):
    src_rank: int  # prefill rank that supplies the heads
    dst_rank: int  # decode rank that holds them
    head_lo: int  # global KV head range [head_lo, head_hi)
    head_hi: int

    @property
    def width(self) -> int:
        return self.head_hi - self.head_lo


def tp_size_error(num_kv_heads: int, tp_size: int) -> str | None:
    """Why ``tp_size`` ranks cannot split ``num_kv_heads`` KV heads, or None."""
    if num_kv_heads < 1 or tp_size < 1:
        return f"KV heads ({num_kv_heads}) and TP size ({tp_size}) must be >= 1"
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        return (f"TP size {tp_size} neither divides {num_kv_heads} KV heads nor is a multiple "
                "of them")
    return None


def _check(num_kv_heads: int, tp_size: int) -> None:
    why = tp_size_error(num_kv_heads, tp_size)
    if why is not None:
        raise ValueError(why)


def rank_heads(num_kv_heads: int, tp_size: int, rank: int) -> range:
    """The global KV heads rank ``rank`` of ``tp_size`` holds."""
    _check(num_kv_heads, tp_size)
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} is outside 0..{tp_size - 1}")
    if num_kv_heads >= tp_size:
        width = num_kv_heads // tp_size
        return range(rank * width, (rank + 1) * width)
    head = rank * num_kv_heads // tp_size  # the head this rank's query heads read
    return range(head, head + 1)


def head_sources(num_kv_heads: int, tp_size: int) -> list[int]:
    """For each global KV head, the lowest rank of ``tp_size`` that holds it."""
    out = [-1] * num_kv_heads
    for r in range(tp_size):
        for h in rank_heads(num_kv_heads, tp_size, r):
            if out[h] < 0:
                out[h] = r
    return out


def head_mapping(num_kv_heads: int, prefill_tp: int, decode_tp: int) -> list[HeadSlice]:
    """The (prefill rank, decode rank, head range) slices for one pair, decode-rank order.
    Raises ValueError when either TP size cannot split the heads."""
    _check(num_kv_heads, prefill_tp)
    _check(num_kv_heads, decode_tp)
    sources = head_sources(num_kv_heads, prefill_tp)
    out: list[HeadSlice] = []
    for d in range(decode_tp):
        for h in rank_heads(num_kv_heads, decode_tp, d):
            p = sources[h]
            if out and out[-1].dst_rank == d and out[-1].src_rank == p and out[-1].head_hi == h:
                out[-1] = out[-1]._replace(head_hi=h + 1)
            else:
                out.append(HeadSlice(p, d, h, h + 1))
    return out


def heads_moved(slices: list[HeadSlice]) -> int:
    """KV heads written per token (every slice travels rank to rank): H when D <= H, D (one
    per decode rank) when decode replicates heads."""
    return sum(s.width for s in slices)


def describe(slices: list[HeadSlice]) -> str:
    return ", ".join(f"p{s.src_rank}->d{s.dst_rank} heads {s.head_lo}-{s.head_hi}" for s in slices)
