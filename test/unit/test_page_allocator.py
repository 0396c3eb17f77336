from __future__ import annotations

import pytest

from sglang_pd.engine.page_allocator import OutOfPages, PageAllocator


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
