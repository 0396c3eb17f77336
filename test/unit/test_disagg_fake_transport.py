"""FakeKVTransport honours the KVTransport contract the NIXL transport implements."""

from __future__ import annotations

import pytest
import torch
from sglang_pd.disaggregation.kv_layout import KVLayout
from sglang_pd.disaggregation.transfer.base import PeerGoneError, TransferError
from sglang_pd.disaggregation.transfer.fake import FakeFabric, FakeKVTransport


def pools(fabric: FakeFabric, complete_after: int = 1) -> tuple[FakeKVTransport, FakeKVTransport]:
    a = torch.randn(2, 2, 8, 4, 2, 8)
    b = torch.zeros(2, 2, 12, 4, 2, 8)
    return (
        FakeKVTransport("P", a, fabric, complete_after=complete_after),
        FakeKVTransport("D", b, fabric, complete_after=complete_after),
    )


def test_write_copies_all_layers_k_and_v_and_delivers_notif_on_completion() -> None:
    fab = FakeFabric()
    p, d = pools(fab, complete_after=2)
    peer = p.add_peer(d.metadata(), d.layout)
    h = p.write_pages(peer, [3, 5, 6], [11, 1, 4], b"kv|9|0|1")
    assert h.nbytes == 3 * p.layout.bytes_per_page_all_layers
    assert p.poll(h) == "PROC" and d.get_notifs() == []
    assert d.kv_buffer.abs().sum() == 0  # nothing lands before completion
    assert p.poll(h) == "DONE" and p.poll(h) == "DONE"
    assert d.get_notifs() == [b"kv|9|0|1"] and d.get_notifs() == []
    assert torch.equal(d.kv_buffer[:, :, [11, 1, 4]], p.kv_buffer[:, :, [3, 5, 6]])
    untouched = [i for i in range(12) if i not in (11, 1, 4)]
    assert d.kv_buffer[:, :, untouched].abs().sum() == 0


def test_bad_pages_and_unknown_peer_raise_clear_errors() -> None:
    fab = FakeFabric()
    p, d = pools(fab)
    with pytest.raises(PeerGoneError, match="unknown or was removed"):
        p.write_pages("D", [1], [1], b"")
    peer = p.add_peer(d.metadata(), d.layout)
    with pytest.raises(ValueError, match="same length"):
        p.write_pages(peer, [1, 2], [1], b"")
    with pytest.raises(ValueError, match=r"src_pages: page ids must be in \[1, 7\]"):
        p.write_pages(peer, [0], [1], b"")
    with pytest.raises(ValueError, match=r"dst_pages: page ids must be in \[1, 11\]"):
        p.write_pages(peer, [1], [12], b"")
    p.remove_peer(peer)
    with pytest.raises(PeerGoneError):
        p.send_notif(peer, b"x")


def test_incompatible_layout_is_refused() -> None:
    fab = FakeFabric()
    p, _ = pools(fab)
    other = FakeKVTransport("X", torch.zeros(2, 2, 8, 4, 2, 8, dtype=torch.float16), fab)
    with pytest.raises(TransferError, match="dtype: local='float32' remote='float16'"):
        p.add_peer(other.metadata(), other.layout)


def test_killed_peer_gives_err_not_exception_or_hang() -> None:
    fab = FakeFabric()
    p, d = pools(fab, complete_after=3)
    peer = p.add_peer(d.metadata(), d.layout)
    h = p.write_pages(peer, [1], [1], b"n")
    assert p.poll(h) == "PROC"
    fab.kill("D")
    assert p.poll(h) == "ERR" and "disconnected" in h.error
    h2 = p.write_pages(peer, [2], [2], b"n")
    assert h2.status == "ERR" and p.poll(h2) == "ERR"
    with pytest.raises(PeerGoneError, match="gone"):
        p.send_notif(peer, b"x")
    with pytest.raises(PeerGoneError):
        p.add_peer(d.metadata(), d.layout)


def test_release_cancels_in_progress() -> None:
    fab = FakeFabric()
    p, d = pools(fab, complete_after=5)
    peer = p.add_peer(d.metadata(), d.layout)
    h = p.write_pages(peer, [1], [1], b"n")
    p.release(h)
    assert p.poll(h) == "ERR" and "cancelled" in h.error
    assert d.get_notifs() == [] and d.kv_buffer.abs().sum() == 0
    assert KVLayout.from_tensor(d.kv_buffer) == d.layout
