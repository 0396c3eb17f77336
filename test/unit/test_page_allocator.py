from __future__ import annotations

import pytest

from sglang_pd.core.page_allocator import OutOfPages, PageAllocator


def test_alloc_free_roundtrip_keeps_dummy_page_out() -> None:
    a = PageAllocator(9)
    assert a.num_free == 8
    pages = a.alloc(8)
    assert sorted(pages) == list(range(1, 9))  # page 0 is the dummy page
    with pytest.raises(OutOfPages):
        a.alloc(1)
    a.free(pages[:3])
    a.check_integrity()
    assert a.num_free == 3
    a.free(pages[3:])
    assert a.num_free == 8
    a.check_integrity()


def test_double_free_is_refused() -> None:
    a = PageAllocator(4)
    p = a.alloc(2)
    a.free(p)
    with pytest.raises(RuntimeError, match="double free"):
        a.free(p[:1])


def test_pages_come_out_ascending_and_freed_runs_are_reused_in_order() -> None:
    a = PageAllocator(17)
    assert a.alloc(4) == [1, 2, 3, 4]
    run = a.alloc(5)
    assert run == [5, 6, 7, 8, 9]
    a.free(run)
    assert a.alloc(3) == [5, 6, 7]  # the freed run again, still ascending
