"""Decode-side prefix reuse with delta KV transfer (disaggregation/decode_reuse.py), over
FakeKVTransport and real loopback bootstrap sockets, without a model (test_pd_sides.py's fake
engine, with a prefix cache on the decode): a follow-up turn reuses the decode's cached pages,
registers only the rest, and prefill writes exactly those (the right source pages into the right
destination pages); every failure path keeps pages conserved on both sides."""

from __future__ import annotations

import time

import pytest
import torch
from sglang_pd.core.page_allocator import PageAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.decode_reuse import check_prefix_len, reusable_pages
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.transfer.fake import FakeFabric, FakeKVTransport
from sglang_pd.engine.pd_decode import DecodeSide
from sglang_pd.engine.pd_prefill import PrefillSide
from sglang_pd.engine.request import Req
from sglang_pd.protocol import BootstrapInfo, GenerateReq, SamplingParams
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from test_pd_sides import ENVS, NUM_PAGES, PAGE, FakeEngine, _admit, _all_free, _poll_until, _schedulable

pytestmark = pytest.mark.timeout(60)

TURN1 = list(range(1, 11))  # 10 tokens: 3 pages, 2 whole pages cached after the turn
FIRST = 5  # the fake prefill samples this token


class CachedEngine(FakeEngine):
    """The fake engine with the radix prefix cache on (as a decode server with
    --disaggregation-decode-enable-radix-cache)."""

    def __post_init__(self) -> None:
        cfg = PolicyConfig(page_size=PAGE, chunked_prefill_size=8, max_prefill_tokens=8)
        self.scheduler = Scheduler(PageAllocator(NUM_PAGES), cfg, FcfsPrefillPolicy(cfg),
                                   ContinuousDecodePolicy(cfg), whole_prompt_pages=self.whole_prompt,
                                   prefix_cache=True)


def _buf() -> torch.Tensor:
    return torch.zeros(2, 2, NUM_PAGES, PAGE, 2, 8)


@pytest.fixture
def pair():
    fab = FakeFabric()
    p_buf = _buf()
    for page in range(NUM_PAGES):  # every prefill page holds its own id: a copy says its source
        p_buf[:, :, page] = float(page)
    p_eng, d_eng = FakeEngine(whole_prompt=True), CachedEngine(whole_prompt=False)
    pm = KVSenderManager(FakeKVTransport("prefill", p_buf, fab), envs=ENVS, bootstrap_host="127.0.0.1",
                         bootstrap_port=0)
    d_buf = _buf()
    dm = KVReceiverManager(FakeKVTransport("decode", d_buf, fab), envs=ENVS)
    p_eng.pd = PrefillSide(p_eng.scheduler, PAGE, pm)
    d_eng.pd = DecodeSide(d_eng.scheduler, PAGE, dm, reserved_pages=0, max_running=8)
    yield p_eng, d_eng, pm.server.port, d_buf
    p_eng.pd.close()
    d_eng.pd.close()


def _msg(rid: str, room: int, port: int, ids: list[int]) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=ids, sampling_params=SamplingParams(max_new_tokens=4),
                       bootstrap=BootstrapInfo(host="127.0.0.1", port=port, room=room))


def _turn(p_eng: FakeEngine, d_eng: FakeEngine, port: int, rid: str, room: int,
          ids: list[int]) -> tuple[list[int], Req]:
    """One request through both sides until decode runs it (its KV arrived); returns the pages
    prefill computed it into (freed once sent) and decode's request."""
    msg = _msg(rid, room, port, ids)
    p_req, d_req = _admit(p_eng, msg), _admit(d_eng, msg)
    d_eng.poll(0.0)
    _schedulable(p_eng, d_eng, p_req)
    while p_req not in p_eng.scheduler.parked:
        p_eng.run_prefill()
    src = list(p_req.pages)
    _poll_until([p_eng, d_eng], lambda: rid in p_eng.answers and d_req in d_eng.scheduler.running,
                "transfer")
    d_eng.pages_conserved()
    return src, d_req


def _stats(eng: FakeEngine) -> dict:
    assert eng.pd is not None
    return eng.pd.stats()


def _page_ids(buf: torch.Tensor, pages: list[int]) -> list[int]:
    return [int(buf[0, 0, page, 0, 0, 0]) for page in pages]


def test_reusable_pages_leave_the_last_token_page() -> None:
    assert [reusable_pages(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 0, 0, 1, 1, 2]
    assert check_prefix_len(8, 4) is None
    assert "multiple" in (check_prefix_len(6, 4) or "") and "multiple" in (check_prefix_len(-4, 4) or "")


def test_follow_up_turn_transfers_only_the_delta(pair) -> None:
    p_eng, d_eng, port, d_buf = pair
    src1, d1 = _turn(p_eng, d_eng, port, "t1", 1, TURN1)
    assert _page_ids(d_buf, d1.pages) == src1  # turn 1: every page travels
    assert _stats(p_eng)["kv_transfer_pages_total"] == 3
    assert _stats(d_eng)["num_decode_reused_tokens_total"] == 0
    d1_pages = list(d1.pages)
    d_eng.finish(d1, {"type": "length"})  # its KV (10 prompt tokens) joins decode's cache
    assert d_eng.scheduler.hits.cache.num_pages == 2
    _all_free(d_eng)  # cached pages are evictable: free to the scheduler
    # turn 2: the history, the answer and 7 new tokens = 18 tokens, 5 pages; 2 cached on decode
    ids = TURN1 + [FIRST] + list(range(100, 107))
    src2, d2 = _turn(p_eng, d_eng, port, "t2", 2, ids)
    assert d_eng.scheduler.hits.shared(d2) == 2 and d2.cached_len == 8 and len(d2.pages) == 5
    assert d2.pages[:2] == d1_pages[:2]  # the reused pages are turn 1's, still holding its KV
    got = _page_ids(d_buf, d2.pages)
    assert got[:2] == src1[:2]  # never written by turn 2's transfer
    assert got[2:] == src2[2:]  # prefill's pages 2..4 of the prompt, in order
    stats = _stats(p_eng)
    bpp = p_eng.pd.mgr.transport.layout.bytes_per_page_all_layers
    assert stats["kv_transfer_pages_total"] == 3 + 3 and stats["kv_transfer_skipped_pages_total"] == 2
    assert stats["kv_transfer_bytes_total"] == 6 * bpp and stats["kv_transfer_skipped_bytes_total"] == 2 * bpp
    assert _stats(d_eng)["num_decode_reused_tokens_total"] == 8
    assert _stats(d_eng)["num_decode_registered_pages_total"] == 3 + 3
    assert d_eng.scheduler.hits.hit_rate == pytest.approx(8 / (10 + 18))
    d_eng.finish(d2, {"type": "length"})
    _all_free(p_eng, d_eng)


def test_abort_during_delta_transfer_quarantines_only_registered_pages(pair) -> None:
    p_eng, d_eng, port, _ = pair
    _, d1 = _turn(p_eng, d_eng, port, "t1", 1, TURN1)
    d_eng.finish(d1, {"type": "length"})
    ids = TURN1 + [FIRST] + list(range(100, 107))
    msg = _msg("t2", 2, port, ids)
    p_req, d_req = _admit(p_eng, msg), _admit(d_eng, msg)
    d_eng.poll(0.0)
    assert d_eng.scheduler.hits.shared(d_req) == 2  # hit locked: not evictable while it waits
    assert d_eng.scheduler.hits.cache.evictable == 0
    _schedulable(p_eng, d_eng, p_req)
    p_eng.run_prefill()  # first chunk (8 tokens = the 2 reused pages): nothing to send yet
    _poll_until([p_eng, d_eng], lambda: d_eng.pd.mgr.rooms[2].state.acked_at is not None, "ack")
    d_eng.pd.abort(d_req, 0.1)
    d_eng.finish(d_req, {"type": "abort"})
    # only the 3 registered pages wait for prefill's word; the reused 2 went back to the tree
    assert len(d_eng.scheduler.quarantine[2]) == 3 and d_eng.scheduler.hits.cache.evictable == 2
    d_eng.pages_conserved()
    _poll_until([p_eng, d_eng], lambda: "t2" in p_eng.answers and not d_eng.scheduler.quarantine,
                "abort ack")
    assert p_eng.answers["t2"][1] == 502
    _all_free(p_eng, d_eng)


def test_unreachable_prefill_gives_the_hit_back_to_the_tree(pair) -> None:
    """A follow-up whose prefill is gone (heartbeats unanswered): its registered pages are
    freed and its locked hit goes back to the cache, still cached and evictable."""
    p_eng, d_eng, port, _ = pair
    _, d1 = _turn(p_eng, d_eng, port, "t1", 1, TURN1)
    d_eng.finish(d1, {"type": "length"})
    req = _admit(d_eng, _msg("lost", 2, 1, TURN1 + [FIRST] + list(range(100, 107))))  # port 1: nobody
    d_eng.poll(0.0)
    assert d_eng.scheduler.hits.shared(req) == 2 and len(req.pages) == 5
    for step in range(1, 41):  # fake time: 20 s, far past the heartbeats' 2 x 1 s
        d_eng.now = step * 0.5
        d_eng.poll(d_eng.now)
        if "lost" in d_eng.answers:
            break
        time.sleep(0.005)  # the bootstrap socket's I/O (real time) between polls
    assert d_eng.answers["lost"][1] == 502
    assert d_eng.scheduler.hits.cache.num_pages == 2 and d_eng.scheduler.hits.cache.evictable == 2
    _all_free(d_eng)


def test_waiting_timeout_with_a_hit_frees_everything(pair) -> None:
    """Prefill accepts the delta registration but never computes: decode's waiting timeout fails
    the room, quarantines its 3 registered pages until prefill confirms, and the hit stays cached."""
    p_eng, d_eng, port, _ = pair
    _, d1 = _turn(p_eng, d_eng, port, "t1", 1, TURN1)
    d_eng.finish(d1, {"type": "length"})
    msg = _msg("t2", 2, port, TURN1 + [FIRST] + list(range(100, 107)))
    _admit(p_eng, msg)
    _admit(d_eng, msg)
    d_eng.poll(0.0)
    _poll_until([p_eng, d_eng], lambda: d_eng.pd.mgr.rooms[2].state.acked_at is not None, "ack")
    d_eng.now = ENVS.waiting_timeout + 1.0
    _poll_until([d_eng], lambda: "t2" in d_eng.answers, "waiting timeout")
    assert len(d_eng.scheduler.quarantine.get(2, [])) in (0, 3)  # 3 until prefill confirms
    d_eng.pages_conserved()
    p_eng.now = d_eng.now
    _poll_until([p_eng, d_eng], lambda: not d_eng.scheduler.quarantine and "t2" in p_eng.answers,
                "quarantine release", timeout=10)
    assert d_eng.scheduler.hits.cache.num_pages == 2 and d_eng.scheduler.hits.cache.evictable == 2
    _all_free(p_eng, d_eng)


def test_prefill_refuses_a_prefix_len_that_does_not_fit_the_prompt(pair) -> None:
    """A Register whose reused pages plus dst_pages differ from the prompt's pages (a decode
    bug, or another page size): the room fails on both sides before any write."""
    p_eng, d_eng, port, _ = pair
    msg = _msg("a", 3, port, TURN1)
    p_req = _admit(p_eng, msg)
    d_req = _admit(d_eng, msg)
    mgr = d_eng.pd.mgr
    d_eng.pd.prealloc.remove(d_req)  # register by hand: 4 reused pages + 3 pages > 3 pages
    d_eng.scheduler.park(d_req, num_pages=3)
    d_eng.pd.transferring[3] = d_req
    assert mgr.add_request(3, "127.0.0.1", port, list(d_req.pages), 0.0, prefix_len=16) is None
    _schedulable(p_eng, d_eng, p_req)
    p_eng.run_prefill()  # its first chunk allocates 3 pages: prefill sees the mismatch
    _poll_until([p_eng, d_eng], lambda: "a" in d_eng.answers and "a" in p_eng.answers, "refusal")
    assert "destination pages" in d_eng.answers["a"][0]["message"]
    assert p_eng.pd.mgr.pages_sent_total == 0
    assert p_req.pages == []
    _all_free(p_eng, d_eng)


def test_bootstrap_server_refuses_a_prefix_len_off_page() -> None:
    from sglang_pd.disaggregation.bootstrap import BootstrapServer
    fab = FakeFabric()
    t = FakeKVTransport("d", _buf(), fab)
    server = BootstrapServer("127.0.0.1", 0, local_layout=t.layout)
    try:
        reg = m.Register(room=1, client_id="c", agent_name="d", agent_metadata=b"", layout=t.layout,
                         dst_pages=[1], prefix_len=3)
        assert "multiple of page_size" in (server._check_register("c", reg) or "")
        ok = m.Register(room=1, client_id="c", agent_name="d", agent_metadata=b"", layout=t.layout,
                        dst_pages=[1], prefix_len=8)
        assert server._check_register("c", ok) is None
        assert m.decode(m.encode(ok)) == ok  # travels; an old Register (no field) reads as 0
        old = m.decode(m.encode(m.Register(room=1, client_id="c", agent_name="d", agent_metadata=b"",
                                           layout=t.layout, dst_pages=[1])))
        assert isinstance(old, m.Register) and old.prefix_len == 0
    finally:
        server.close()
