"""disaggregation/tp_mapping.py: which prefill rank supplies each KV head a decode rank holds,
for every pair of TP sizes the heads allow (issue 31; docs/disaggregation.md section 11)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_pd.disaggregation.tp_mapping import (
    HeadSlice,
    head_mapping,
    head_sources,
    heads_moved,
    rank_heads,
    tp_size_error,
)
from sglang_pd.disaggregation.tp_slices import local_range, partials_expected
from sglang_pd.models.parallel import TPGroup, kv_head_start, local_kv_heads



def _sizes(heads: int) -> list[int]:
    return [n for n in range(1, 4 * heads + 1) if tp_size_error(heads, n) is None]


@st.composite
def pairs(draw):
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]))
    p = draw(st.sampled_from(_sizes(heads)))
    d = draw(st.sampled_from(_sizes(heads)))
    return heads, p, d


@settings(deadline=None)
@given(pairs())
def test_every_decode_head_gets_exactly_one_source_that_holds_it(case) -> None:
    heads, p, d = case
    slices = head_mapping(heads, p, d)
    for dst in range(d):
        got: list[int] = []
        for s in slices:
            if s.dst_rank == dst:
                assert set(range(s.head_lo, s.head_hi)) <= set(rank_heads(heads, p, s.src_rank))
                got.extend(range(s.head_lo, s.head_hi))
        assert sorted(got) == list(rank_heads(heads, d, dst))  # each head once, none missing
    assert heads_moved(slices) == heads * max(d // heads, 1)
    # per-rank writes: each slice sits inside both ranks' pools, and decode rank 0 always has
    # the slice from prefill rank 0 that carries the chunk's notification (tp_slices.py)
    for s in slices:
        assert 0 <= local_range(heads, p, s.src_rank, s) <= len(rank_heads(heads, p, s.src_rank)) - s.width
        assert 0 <= local_range(heads, d, s.dst_rank, s) <= len(rank_heads(heads, d, s.dst_rank)) - s.width
    assert any((s.src_rank, s.dst_rank) == (0, 0) for s in slices)
    total = sum(partials_expected(slices, r, 3) for r in range(d))
    assert total == 3 * (len(slices) - 1)  # every slice but that one, per chunk


@settings(deadline=None)
@given(st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.integers(1, 64))
def test_ranks_cover_the_heads_and_the_lowest_holder_supplies_each(heads: int, n: int) -> None:
    if tp_size_error(heads, n) is not None:
        with pytest.raises(ValueError):
            rank_heads(heads, n, 0)
        return
    covered = set().union(*(rank_heads(heads, n, r) for r in range(n)))
    assert covered == set(range(heads))
    assert all(len(rank_heads(heads, n, r)) == max(heads // n, 1) for r in range(n))
    for h, src in enumerate(head_sources(heads, n)):
        assert h in rank_heads(heads, n, src)
        assert all(h not in rank_heads(heads, n, r) for r in range(src))


def test_the_documented_tables_for_two_heads() -> None:
    assert head_mapping(2, 1, 1) == [HeadSlice(0, 0, 0, 2)]
    assert head_mapping(2, 1, 2) == [HeadSlice(0, 0, 0, 1), HeadSlice(0, 1, 1, 2)]
    assert head_mapping(2, 2, 1) == [HeadSlice(0, 0, 0, 1), HeadSlice(1, 0, 1, 2)]
    assert head_mapping(2, 2, 2) == [HeadSlice(0, 0, 0, 1), HeadSlice(1, 1, 1, 2)]
    assert head_mapping(2, 2, 4) == [HeadSlice(0, 0, 0, 1), HeadSlice(0, 1, 0, 1),
                                     HeadSlice(1, 2, 1, 2), HeadSlice(1, 3, 1, 2)]
    # one KV head replicated over two prefill ranks: rank 0 supplies it, once
    assert head_mapping(1, 2, 2) == [HeadSlice(0, 0, 0, 1), HeadSlice(0, 1, 0, 1)]


def test_sizes_the_heads_do_not_allow_are_refused() -> None:
    with pytest.raises(ValueError, match="TP size 3"):
        head_mapping(2, 1, 3)
    with pytest.raises(ValueError, match="TP size 4"):
        head_mapping(6, 4, 1)


@settings(deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8, 16]))
def test_same_split_as_the_model_layers(heads: int, n: int) -> None:
    class Cfg:
        num_kv_heads = heads

    if tp_size_error(heads, n) is not None:
        return
    for r in range(n):
        g = TPGroup(r, n)
        start = kv_head_start(Cfg, g)  # type: ignore[arg-type]
        assert rank_heads(heads, n, r) == range(start, start + local_kv_heads(Cfg, g))  # type: ignore[arg-type]
