"""Per-rank PD with TP over real NIXL (UCX loopback), in one process: prefill ranks' pools hold
their heads of a known KV tensor; after one RankWriteTransport write, every decode rank's pool
holds exactly its heads of those pages, decode rank 0 got the chunk's notification, and each
decode rank got the partial notifications tp_slices.partials_expected says.

The ranks > 0 run RankKVService as worker.py does; a fake link carries the messages in-process
instead of the plan channel and back channel."""

from __future__ import annotations

import time

import pytest
import torch
from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.tp_mapping import head_mapping, rank_heads
from sglang_pd.disaggregation.tp_slices import parse_partial, partials_expected
from sglang_pd.disaggregation.transfer.nixl_transport import nixl_available

pytestmark = pytest.mark.skipif(nixl_available() is not None, reason="nixl not installed")

LAYERS, PAGES, PAGE, DIM = 2, 8, 4, 8


class FakeLink:
    """TPLink's interface over in-process RankKVServices."""

    def __init__(self, kvs: list) -> None:
        from sglang_pd.engine.tp.rank_kv import RankKVService

        self.kv, self.tp_size, self.broken = kvs[0], len(kvs), False
        self.services = [RankKVService(k, r) for r, k in enumerate(kvs) if r > 0]
        self.outbox: list = []
        self.kvs = kvs

    def send(self, msg: object) -> None:
        for s in self.services:
            self.outbox += s.handle(msg)  # type: ignore[arg-type]

    def recv(self) -> list:
        out, self.outbox = self.outbox, []
        for s in self.services:
            out += s.progress()
        return out

    def agents(self) -> list:
        return [k.agent() for k in self.kvs]


def _pool(full: torch.Tensor, heads: range) -> torch.Tensor:
    return full[:, :, :, :, heads.start:heads.stop].contiguous()


@pytest.mark.parametrize("heads,p,d", [(2, 1, 2), (2, 2, 1), (2, 2, 2), (2, 2, 4), (4, 4, 2),
                                       (4, 1, 4), (1, 2, 2)])
def test_each_decode_rank_gets_its_heads(heads: int, p: int, d: int) -> None:
    from sglang_pd.engine.tp.rank_kv import RankKV
    from sglang_pd.engine.tp.rank_writer import RankWriteTransport

    torch.manual_seed(0)
    full = torch.randn(LAYERS, 2, PAGES, PAGE, heads, DIM)
    pre = [RankKV.create("prefill", r, _pool(full, rank_heads(heads, p, r))) for r in range(p)]
    dec_bufs = [torch.zeros(LAYERS, 2, PAGES, PAGE, len(rank_heads(heads, d, r)), DIM)
                for r in range(d)]
    dec = [RankKV.create("decode", r, buf) for r, buf in enumerate(dec_bufs)]
    link = FakeLink(pre)
    writer = RankWriteTransport(link, heads)  # type: ignore[arg-type]
    try:
        agents = [k.agent() for k in dec]
        reg = m.Register(room=7, client_id="c", agent_name=agents[0].agent_name,
                         agent_metadata=agents[0].agent_metadata, layout=agents[0].layout,
                         dst_pages=[4, 2, 6], tp_size=d, ranks=agents if d > 1 else [])
        peer, _ = writer.add_decode(reg)
        src, dst = [1, 3, 5], [4, 2, 6]
        h = writer.write_pages(peer, src, dst, m.kv_notif(7, 0, True, pages=(0, 3)))
        deadline = time.monotonic() + 20
        while writer.poll(h) == "PROC":
            assert time.monotonic() < deadline, "write did not finish"
            time.sleep(0.005)
        assert h.status == "DONE", h.error
        for r, buf in enumerate(dec_bufs):
            hr = rank_heads(heads, d, r)
            want = full[:, :, src][:, :, :, :, hr.start:hr.stop]
            assert torch.equal(buf[:, :, dst], want), f"decode rank {r} got wrong heads"
            untouched = [q for q in range(PAGES) if q not in dst]
            assert not buf[:, :, untouched].any(), "bytes landed outside the destination pages"
        slices = head_mapping(heads, p, d)
        for r, k in enumerate(dec):
            notifs: list[bytes] = []
            want_partials = partials_expected(slices, r, 1)
            deadline = time.monotonic() + 10
            while True:
                notifs += k.transport.get_notifs()
                partials = sum(parse_partial(x) == 7 for x in notifs)
                main = [x for x in notifs if m.parse_kv_notif(x) is not None]
                if partials >= want_partials and (r > 0 or main):
                    break
                assert time.monotonic() < deadline, f"rank {r}: notifications missing"
                time.sleep(0.005)
            assert partials == want_partials
            assert len(main) == (1 if r == 0 else 0)
        row_bytes = LAYERS * 2 * len(src) * PAGE * DIM * 4
        assert writer.bytes_posted == row_bytes * sum(s.width for s in slices)
    finally:
        for k in (*pre, *dec):
            k.transport.close()
