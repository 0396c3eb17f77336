"""Issue 22: no per-room problem may raise out of the PD managers, and quarantined pages are
freed only once no prefill write can land. Real ZMQ on 127.0.0.1, fake KV transport; every test
checks that each page ends up either with a request or free."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from polling import until
import torch
from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.addr import tcp_endpoint, validate_bootstrap_addr
from sglang_pd.disaggregation.bootstrap import MAX_QUEUED_PER_PEER, BootstrapClient, BootstrapServer
from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.receiver_state import KVReceiverState
from sglang_pd.disaggregation.sender_state import KVSenderState
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.disaggregation.transfer.fake import FakeFabric, FakeKVTransport

pytestmark = pytest.mark.timeout(60)
HOST = "127.0.0.1"
ENVS = DisaggEnvs(bootstrap_timeout=30, waiting_timeout=30, heartbeat_interval=1.0,
                  heartbeat_max_failure=2)  # G = 3 s; quarantine_limit = 63 s


class Pool:
    """The engine's page allocator, reduced to what conservation needs."""

    def __init__(self, num_pages: int) -> None:
        self.all = set(range(1, num_pages))
        self.free = set(self.all)

    def alloc(self, n: int) -> list[int]:
        pages = sorted(self.free)[:n]
        self.free -= set(pages)
        return pages

    def release(self, pages: list[int]) -> None:
        assert not set(pages) & self.free, f"double free of {set(pages) & self.free}"
        self.free |= set(pages)

    def conserved(self) -> bool:
        return self.free == self.all


def make_pair(fab: FakeFabric, *, threaded: bool = True, complete_after: int = 1,
              client: BootstrapClient | None = None) -> tuple[KVSenderManager, KVReceiverManager]:
    pt = FakeKVTransport("prefill", torch.randn(2, 2, 10, 4, 2, 8), fab,
                         complete_after=complete_after)
    dt = FakeKVTransport("decode", torch.zeros(2, 2, 20, 4, 2, 8), fab)
    server = BootstrapServer(HOST, 0, local_layout=pt.layout,
                             heartbeat_interval=ENVS.heartbeat_interval,
                             heartbeat_max_failure=ENVS.heartbeat_max_failure, threaded=threaded)
    pm = KVSenderManager(pt, server=server, envs=ENVS)
    return pm, KVReceiverManager(dt, client=client, envs=ENVS)


def register(pm: KVSenderManager, dm: KVReceiverManager, room: int, dst: list[int], src: list[int],
             now: float = 0.0) -> None:
    """Decode registers, prefill takes the request, and decode has the ack."""
    assert dm.add_request(room, HOST, pm.server.port, dst, now) is None
    until(lambda: pm.poll(now) or (pm.rooms.get(room) and pm.rooms[room].state.bootstrapped),
          "register")
    assert pm.add_request(room, src, now) is None
    until(lambda: (pm.poll(now), dm.poll(now)) and dm.rooms[room].state.acked_at is not None, "ack")


# ---- item 1: the bootstrap address ---------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "localhost.", "prefill-0.pd.svc",
                                  "my_host", "::1", "[::1]", "fe80::1%eth0", "2001:db8::7"])
def test_valid_bootstrap_addresses(host: str) -> None:
    assert validate_bootstrap_addr(host, 8998) is None
    assert validate_bootstrap_addr(host, 1) is None and validate_bootstrap_addr(host, 65535) is None


@pytest.mark.parametrize(("host", "port", "words"), [
    ("x y", 8998, "not a valid hostname"), ("a/b", 8998, "not a valid hostname"),
    ("*", 8998, "not a valid hostname"), ("-a", 8998, "not a valid hostname"),
    ("127.0.0.1:5;127.0.0.1", 8998, "IPv6"), ("host:80", 8998, "IPv6"), ("[::1", 1, "IPv6"),
    ("1.2.3.4.5", 8998, "IPv4"), ("300.1.1.1", 8998, "IPv4"), ("a" * 300, 8998, "at most 253"),
    ("", 8998, "non-empty string"), (None, 8998, "non-empty string"), (7, 8998, "non-empty"),
    ("h", 0, "1..65535"), ("h", 65536, "1..65535"), ("h", True, "integer"), ("h", "80", "integer"),
    ("h", 80.0, "integer"), ("h", None, "integer"),
])
def test_invalid_bootstrap_addresses_say_what_is_allowed(host: object, port: object,
                                                        words: str) -> None:
    err = validate_bootstrap_addr(host, port)
    assert err is not None and words in err


def test_addr_module_is_light_and_brackets_ipv6() -> None:
    code = ("import sys, sglang_pd.disaggregation.addr; "
            "print([n for n in ('zmq', 'torch', 'msgspec', 'numpy') if n in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert tcp_endpoint("::1", 5) == "tcp://[::1]:5" == tcp_endpoint("[::1]", 5)
    assert tcp_endpoint("localhost", 5) == "tcp://localhost:5"


@pytest.mark.parametrize("host", ["x y", "a/b"])
def test_bad_bootstrap_host_fails_only_its_room(host: str) -> None:
    """Was: zmq.ZMQError out of add_request inside the engine loop, killing the decode server."""
    fab, dpool, ppool = FakeFabric(), Pool(20), Pool(10)
    pm, dm = make_pair(fab)
    try:
        assert isinstance(dm.client.register(host, 8998, m.Register(
            1, dm.client.client_id, "d", b"", dm.transport.layout, [1]), 0.0), str)
        dst = dpool.alloc(2)
        bad = dm.add_request(1, host, 8998, dst, now=0.0)
        assert bad is not None and bad.failure is Failure.INVALID_REQUEST and bad.pages_releasable
        assert bad.failure.http_status == 400 and "bootstrap_host" in bad.reason
        dpool.release(dst)
        assert not dm.room_in_use(1) and dm.poll(0.0) == []
        early = dm.expect(2, host, 8998, now=0.0)
        assert early is not None and early.failure is Failure.INVALID_REQUEST
        # an innocent request next to it is unaffected
        dst, src = dpool.alloc(2), ppool.alloc(2)
        register(pm, dm, 3, dst, src)
        pm.kv_ready(3, 2, last=True, now=0.1)
        pu: list[RoomUpdate] = []
        du = until(lambda: pu.extend(pm.poll(0.1)) or dm.poll(0.1), "success")
        until(lambda: pu.extend(pm.poll(0.1)) or pu, "prefill done")
        assert [u.phase for u in du] == ["Success"] and [u.phase for u in pu] == ["Done"]
        dpool.release(dst)
        ppool.release(src)
        assert dpool.conserved() and ppool.conserved()
    finally:
        pm.close()
        dm.close()


def test_room_still_quarantined_is_refused_not_raised() -> None:
    """Was: ValueError out of add_request for a room whose pages were still quarantined."""
    fab, dpool, ppool = FakeFabric(), Pool(20), Pool(10)
    pm, dm = make_pair(fab)
    try:
        dst, src = dpool.alloc(2), ppool.alloc(2)
        register(pm, dm, 8, dst, src)
        dm.abort(8, "client left", now=0.1)
        assert [(u.phase, u.pages_releasable) for u in dm.poll(0.1)] == [("Failed", False)]
        dst2 = dpool.alloc(2)
        again = dm.add_request(8, HOST, pm.server.port, dst2, now=0.2)
        assert dm.room_in_use(8)
        assert again is not None and again.failure is Failure.INVALID_REQUEST
        assert "still in use" in again.reason and again.pages_releasable
        dpool.release(dst2)  # the engine frees the refused request's pages at once
        assert dm.expect(8, HOST, pm.server.port, now=0.2).failure is Failure.INVALID_REQUEST
        pu: list[RoomUpdate] = []
        du = until(lambda: pu.extend(pm.poll(0.2)) or dm.poll(0.2), "abort ack")
        assert [(u.room, u.pages_releasable) for u in du] == [(8, True)]
        dpool.release(dst)
        until(lambda: pu.extend(pm.poll(0.2)) or pu, "prefill side")
        assert pu[0].failure is Failure.ABORTED_REMOTE
        ppool.release(src)
        assert not dm.room_in_use(8) and dpool.conserved() and ppool.conserved()
    finally:
        pm.close()
        dm.close()


def test_full_send_queue_to_unreachable_prefill_fails_only_new_rooms() -> None:
    """Was: RuntimeError out of add_request once the DEALER queue to a dead prefill filled."""
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    fab, dpool = FakeFabric(), Pool(1200)
    dt = FakeKVTransport("decode", torch.zeros(2, 2, 1200, 1, 1, 8), fab)
    dm = KVReceiverManager(dt, envs=ENVS)
    held: dict[int, list[int]] = {}
    refused = []
    try:
        for room in range(1, 1100):  # under load: more rooms than the queue holds
            pages = dpool.alloc(1)
            fail = dm.add_request(room, HOST, port, pages, now=0.0)
            if fail is None:
                held[room] = pages
            else:
                assert fail.failure is Failure.UNREACHABLE and fail.failure.http_status == 503
                assert "not reading its bootstrap connection" in fail.reason
                assert fail.pages_releasable
                dpool.release(pages)
                refused.append(room)
        assert len(held) == MAX_QUEUED_PER_PEER and refused == list(range(len(held) + 1, 1100))
        updates = [u for now in (0.0, 1.0, 2.0, 3.0) for u in dm.poll(now)]
        assert {(u.failure, u.pages_releasable) for u in updates} == {(Failure.PEER_DEAD, True)}
        for u in updates:
            dpool.release(held.pop(u.room))
        assert not held and dpool.conserved() and dm.rooms == {}
        # the dead link was dropped: a new room to that address is queued again
        assert dm.add_request(5000, HOST, port, dpool.alloc(1), now=4.0) is None
    finally:
        dm.close()


def test_prefill_duplicate_room_and_vanished_peer_do_not_raise() -> None:
    fab, dpool, ppool = FakeFabric(), Pool(20), Pool(10)
    pm, dm = make_pair(fab)
    try:
        pm.expect(4, now=0.0)
        dst, src = dpool.alloc(2), ppool.alloc(2)
        register(pm, dm, 4, dst, src)
        dup = ppool.alloc(2)
        again = pm.add_request(4, dup, now=0.1)  # was: ValueError
        assert pm.room_in_use(4) and not pm.room_in_use(5)
        assert again is not None and again.failure is Failure.INVALID_REQUEST
        ppool.release(dup)
        pm.transport.remove_peer("decode")  # write_pages now raises PeerGoneError
        pm.kv_ready(4, 2, last=True, now=0.1)
        pu = until(lambda: pm.poll(0.1), "prefill failure")  # was: PeerGoneError out of poll
        assert pu[0].failure is Failure.TRANSFER_ERROR and "PeerGoneError" in pu[0].reason
        ppool.release(src)
        dm.abort(4, "test over", now=0.2)
        du = until(lambda: (pm.poll(0.2), dm.poll(0.2))[1] and dm.rooms == {}, "decode freed")
        assert du
        dpool.release(dst)
        assert dpool.conserved() and ppool.conserved()
    finally:
        pm.close()
        dm.close()


def test_bootstrap_server_thread_survives_an_error() -> None:
    server = BootstrapServer(HOST, 0, heartbeat_interval=1.0)
    client = BootstrapClient(heartbeat_interval=1.0)
    calls = []

    def flaky(client_id: str, reg: m.Register) -> str | None:
        calls.append(reg.room)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return None

    server._check_register = flaky  # type: ignore[method-assign]
    try:
        layout = FakeKVTransport("x", torch.zeros(1, 2, 4, 1, 1, 1), FakeFabric()).layout
        for room in (1, 2):
            assert client.register(HOST, server.port, m.Register(
                room, client.client_id, "d", b"", layout, [1]), 0.0) is None
        got = until(server.poll, "the second register")
        assert [e.msg.room for e in got] == [2] and calls == [1, 2]
    finally:
        client.close()
        server.close()


# ---- item 7: never free pages a live prefill may still write -----------------------------


def test_failed_cancel_keeps_decode_pages_quarantined_until_the_write_ends() -> None:
    """Was: release() failure only logged; prefill's Abort promised nothing in flight and decode
    freed pages that the WRITE then landed in."""
    fab, dpool, ppool = FakeFabric(), Pool(20), Pool(10)
    pm, dm = make_pair(fab, complete_after=40)
    try:
        dst, src = dpool.alloc(2), ppool.alloc(2)
        register(pm, dm, 5, dst, src)
        pm.kv_ready(5, 2, last=True, now=0.1)
        pm.poll(0.1)  # posts the WRITE; it needs 40 polls
        (handle,) = pm.rooms[5].handles.values()
        pm.transport.cancel_fails = True  # type: ignore[attr-defined]
        pm.abort(5, "prefill's client left", now=0.2)
        assert handle.status == "PROC"
        pu: list[RoomUpdate] = []
        du: list[RoomUpdate] = []
        landed_before_release = None
        for _ in range(2000):
            pu += pm.poll(0.3)
            new = dm.poll(0.3)
            if any(u.pages_releasable for u in new):
                landed_before_release = handle.status == "DONE"
            du += new
            if pu and any(u.pages_releasable for u in du):
                break
            time.sleep(0.002)
        assert [(u.phase, u.failure, u.pages_releasable) for u in du] == [
            ("Failed", Failure.ABORTED_REMOTE, False), ("Failed", Failure.ABORTED_REMOTE, True)]
        assert landed_before_release is True
        assert pu == [RoomUpdate(5, "Failed", Failure.ABORTED_LOCAL, "prefill's client left")]
        d_buf, p_buf = dm.transport.kv_buffer, pm.transport.kv_buffer  # type: ignore[attr-defined]
        assert torch.equal(d_buf[:, :, dst], p_buf[:, :, src])  # it did land, while quarantined
        dpool.release(dst)
        ppool.release(src)
        assert dpool.conserved() and ppool.conserved()
    finally:
        pm.close()
        dm.close()


def test_decode_abort_waits_for_a_slow_live_prefill_beyond_the_old_grace() -> None:
    """Was: decode freed quarantined pages after G = 3 s here while the prefill's WRITE was
    still running (prefill allows a write WAITING_TIMEOUT = 30 s)."""
    fab, dpool, ppool = FakeFabric(), Pool(20), Pool(10)
    pm, dm = make_pair(fab, complete_after=60)
    try:
        dst, src = dpool.alloc(2), ppool.alloc(2)
        register(pm, dm, 6, dst, src)
        pm.kv_ready(6, 2, last=True, now=0.1)
        pm.poll(0.1)
        (handle,) = pm.rooms[6].handles.values()
        dm.abort(6, "decode's client left", now=1.0)
        late = 1.0 + 20.0  # far past the old 3 s grace, inside quarantine_limit (63 s)
        du = dm.poll(late)
        assert [(u.phase, u.pages_releasable) for u in du] == [("Failed", False)]
        pu: list[RoomUpdate] = []
        released_while = None
        for _ in range(3000):
            pu += pm.poll(1.0)
            new = dm.poll(late)
            if any(u.pages_releasable for u in new):
                released_while = handle.status
            du += new
            if pu and released_while:
                break
            time.sleep(0.002)
        assert released_while == "DONE"  # only once the prefill's write had ended
        assert pu[0].failure is Failure.ABORTED_REMOTE
        dpool.release(dst)
        ppool.release(src)
        assert dpool.conserved() and ppool.conserved()
    finally:
        pm.close()
        dm.close()


def test_sender_failed_cancel_holds_the_ack_and_gives_up_without_lying() -> None:
    s = KVSenderState(room=7, created_at=0.0, bootstrap_timeout=10, waiting_timeout=20)
    s.on_register(1.0, 2)
    s.on_transfer_started(1.0, 0, last=True)
    s.on_cancel_failed(2.0, 0)
    assert s.abort(2.0, "cancelled")
    assert s.take_outbox() == [m.Abort(7, "cancelled", writes_in_flight=True)]
    assert not s.is_settled
    s.on_abort(3.0, "decode asks too")
    assert s.take_outbox() == []  # acks wait for the write
    s.on_cancel_settled(4.0, 0)
    assert s.take_outbox() == [m.AbortAck(7)] and s.is_settled
    g = KVSenderState(room=8, created_at=0.0, bootstrap_timeout=10, waiting_timeout=20)
    g.on_register(1.0, 2)
    g.on_transfer_started(1.0, 0, last=True)
    g.on_cancel_failed(2.0, 0)
    g.abort(2.0, "x")
    g.take_outbox()
    assert not g.check_timeouts(22.0) and g.check_timeouts(22.5)
    assert g.abandoned and g.is_settled and g.take_outbox() == []
    g.on_abort(23.0, "again")
    assert g.take_outbox() == []  # never promise that an abandoned write ended


def test_receiver_quarantine_rules() -> None:
    def recv() -> KVReceiverState:
        r = KVReceiverState(7, 0.0, 10, 20, abort_grace=63, abort_resend=1.0)
        r.on_ack(0.5)
        return r

    r = recv()  # prefill could not cancel: quarantine, and no Abort back
    assert r.on_remote_abort(1.0, "cancelled", writes_in_flight=True)
    assert not r.pages_releasable(50.0) and r.take_outbox() == []
    assert r.on_abort_ack(51.0) and r.pages_releasable(51.0)
    r = recv()  # our abort crossed prefill's own (nothing in flight)
    r.abort(1.0, "client left")
    assert r.take_outbox() == [m.Abort(7, "client left")]
    assert r.on_remote_abort(1.1, "prefill aborted too") and r.pages_releasable(1.1)
    r = recv()  # no answer: ask again each abort_resend; free only at the last-resort bound
    r.abort(1.0, "client left")
    r.take_outbox()
    r.check_timeouts(1.5)
    assert r.take_outbox() == []
    r.check_timeouts(2.0)
    assert r.take_outbox() == [m.Abort(7, "client left")]
    assert not r.pages_releasable(63.9) and r.pages_releasable(64.0)
    assert ENVS.quarantine_limit == 63.0 and DisaggEnvs().quarantine_limit == 615.0


# ---- item 10: prefill fails a room at once when its decode is gone --------------------------


def test_prefill_fails_a_claimed_room_when_its_decode_stops_heartbeating() -> None:
    """Was: a decode that died before registering (waiting for pages) left prefill waiting
    the full bootstrap timeout; with its Claim, prefill fails the room after G of silence."""
    fab, ppool = FakeFabric(), Pool(10)
    pm, dm = make_pair(fab, threaded=False)  # server on fake time
    try:
        pm.expect(7, now=0.0)
        src = ppool.alloc(2)
        assert pm.add_request(7, src, now=0.0) is None
        pm.kv_ready(7, 1, last=False, now=0.0)
        assert dm.expect(7, HOST, pm.server.port, now=0.0) is None
        assert dm.room_in_use(7)
        until(lambda: pm.poll(0.0) or pm.rooms[7].client_id == dm.client.client_id, "claim")
        dm.close()  # the decode process dies
        assert pm.poll(2.9) == []
        pu = pm.poll(3.1)  # G = 3 s, far before the 30 s bootstrap timeout
        assert [(u.room, u.failure) for u in pu] == [(7, Failure.PEER_DEAD)]
        ppool.release(src)
        assert ppool.conserved()
    finally:
        pm.close()


def test_claimed_room_aborts_travel_both_ways() -> None:
    fab, ppool, dpool = FakeFabric(), Pool(10), Pool(20)
    pm, dm = make_pair(fab)
    try:
        # decode's client leaves while its request waits for pages: prefill fails the room now
        pm.expect(1, now=0.0)
        src = ppool.alloc(2)
        pm.add_request(1, src, now=0.0)
        assert dm.expect(1, HOST, pm.server.port, now=0.0) is None
        until(lambda: pm.poll(0.0) or pm.rooms[1].client_id is not None, "claim")
        dm.abort(1, "decode's client left", now=0.1)
        assert not dm.room_in_use(1)
        pu = until(lambda: pm.poll(0.1), "prefill fails the room")
        assert pu[0].failure is Failure.ABORTED_REMOTE and "decode's client left" in pu[0].reason
        ppool.release(src)
        assert dm.poll(0.2) == []  # nothing to report for a room that held no pages
        # prefill's client leaves: the decode that claimed the room hears it before its pages
        pm.expect(2, now=0.3)
        assert dm.expect(2, HOST, pm.server.port, now=0.3) is None
        until(lambda: pm.poll(0.3) or pm.rooms[2].client_id is not None, "claim 2")
        pm.abort(2, "prefill's client left", now=0.4)
        pm.poll(0.4)
        du = until(lambda: dm.poll(0.4), "decode hears")
        assert [(u.room, u.failure, u.pages_releasable) for u in du] == [
            (2, Failure.ABORTED_REMOTE, True)]
        # prefill never saw the request: its bootstrap timeout fails the claim too
        assert dm.expect(3, HOST, pm.server.port, now=0.5) is None
        until(lambda: pm.poll(0.5) or 3 in pm.rooms, "claim 3")
        pm.poll(0.5 + ENVS.bootstrap_timeout + 1)
        du = until(lambda: dm.poll(1.0), "timeout reaches decode")
        assert du[0].room == 3 and "did not register" in du[0].reason
        # a claim whose failure the engine has not polled yet is returned by add_request
        assert dm.expect(4, HOST, pm.server.port, now=1.0) is None
        until(lambda: pm.poll(1.0) or 4 in pm.rooms, "claim 4")
        pm.poll(1.0 + ENVS.bootstrap_timeout + 1)
        got = until(lambda: _drain_events(dm, 1.0) or dm._claim_failures.get(4), "claim failure")
        dst = dpool.alloc(1)
        fail = dm.add_request(4, HOST, pm.server.port, dst, now=1.0)
        assert fail == got and fail.failure is Failure.ABORTED_REMOTE
        dpool.release(dst)
        assert dpool.conserved() and ppool.conserved() and dm.rooms == {} and not dm.claims
    finally:
        pm.close()
        dm.close()


def _drain_events(dm: KVReceiverManager, now: float) -> None:
    for ev in dm.client.poll(now):
        dm._on_event(ev, now)
