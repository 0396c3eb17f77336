"""Issue 35 item 5: a decode never generates from KV that did not arrive whole.

State-machine rules first (fake time), then both managers over real ZMQ with the fake KV
transport wrapped in FaultyTransport (the transport seam): repeated, reordered, lost and late
completion notices, a write that lands late, a done notice for an aborted room. Whenever decode
reports Success its pages hold exactly prefill's bytes (the KV analogue of "token for token");
otherwise it reports Failed, and its pages are released only once no write can still land.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.bootstrap import BootstrapServer
from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.receiver_state import KVReceiverState, ReceiverPhase
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.disaggregation.transfer.fake import FakeFabric, FakeKVTransport
from sglang_pd.disaggregation.transfer.faults import FaultPlan, FaultyTransport, maybe_wrap

pytestmark = pytest.mark.timeout(60)
HOST = "127.0.0.1"
ENVS = DisaggEnvs(bootstrap_timeout=30, waiting_timeout=30, heartbeat_interval=1.0,
                  heartbeat_max_failure=2)


def receiver(num_pages: int = 6) -> KVReceiverState:
    return KVReceiverState(room=9, created_at=0.0, waiting_timeout=20, abort_grace=50,
                           num_pages=num_pages)


# ---- state machine ------------------------------------------------------------------------


def test_success_needs_every_registered_page_not_just_every_chunk() -> None:
    r = receiver()
    r.on_ack(1)
    r.on_kv_notif(2, 0, False, (0, 3))
    r.on_kv_notif(3, 1, True, (4, 6))  # page 3 never written, yet chunks 0..last all arrived
    assert r.phase is ReceiverPhase.FAILED and r.failure is Failure.TRANSFER_ERROR
    assert "pages [3] of 6 were never written" in r.reason
    assert not r.pages_releasable(10)  # a peer that broke the protocol may still write
    assert r.take_outbox() == [m.Abort(room=9, reason=r.reason)]


def test_overlapping_resend_of_the_last_page_still_succeeds() -> None:
    r = receiver(4)
    r.on_kv_notif(1, 0, False, (0, 4))
    r.on_kv_notif(2, 1, True, (3, 4))  # prefill's empty final chunk resends the last page
    assert r.phase is ReceiverPhase.SUCCESS


def test_duplicate_notices_are_ignored_and_never_complete_a_room() -> None:
    r = receiver()
    assert r.on_kv_notif(1, 0, False, (0, 3))
    assert not r.on_kv_notif(2, 0, False, (0, 3))  # same notice again
    assert r.phase is ReceiverPhase.TRANSFERRING and r.duplicates == 1
    assert r.on_kv_notif(3, 1, True, (3, 6))
    assert r.phase is ReceiverPhase.SUCCESS
    assert not r.on_kv_notif(4, 1, True, (3, 6)) and r.phase is ReceiverPhase.SUCCESS


def test_was_success_with_a_missing_chunk_when_a_stray_chunk_number_arrived() -> None:
    """Was: success was len(chunks) == last + 1, so chunks {0, 7} and last 2 counted as 3."""
    r = KVReceiverState(room=9, created_at=0.0)
    r.on_kv_notif(1, 0, False)
    r.on_kv_notif(2, 7, False)
    r.on_kv_notif(3, 2, True)
    assert r.phase is ReceiverPhase.FAILED and r.failure is Failure.TRANSFER_ERROR


@pytest.mark.parametrize("notices", [
    [(1, True, (3, 6)), (2, False, (0, 1))],  # a chunk past the last
    [(1, True, (3, 6)), (2, True, (0, 3))],  # two last chunks
    [(0, False, (0, 3)), (0, False, (0, 2))],  # the same chunk, another slice
    [(0, True, (0, 7))],  # a slice past the registered pages
    [(0, True, (2, 2))],  # an empty slice
    [(-1, False, (0, 1))],  # a negative chunk
    [(0, True, None)],  # no slice where pages were registered
])
def test_contradictory_notices_fail_and_quarantine(notices: list) -> None:
    r = receiver()
    for i, (chunk, last, pages) in enumerate(notices):
        r.on_kv_notif(float(i), chunk, last, pages)
    assert r.phase is ReceiverPhase.FAILED and r.failure is Failure.TRANSFER_ERROR, r.reason
    assert r.failure.http_status == 502 and not r.pages_releasable(5)
    assert r.on_abort_ack(6) and r.pages_releasable(6)


def test_done_notice_after_an_abort_is_ignored_and_keeps_the_quarantine() -> None:
    r = receiver()
    r.on_ack(1)
    r.abort(2, "client left")
    assert not r.on_kv_notif(3, 0, True, (0, 6))  # the write landed in quarantined pages
    assert r.phase is ReceiverPhase.FAILED and r.failure is Failure.ABORTED_LOCAL
    assert not r.pages_releasable(4)


def test_fault_plan_parsing_and_env_wrapping() -> None:
    assert FaultPlan.parse("duplicate_notifs, drop_notif_every=3,delay_write_s=0.5") == FaultPlan(
        duplicate_notifs=True, drop_notif_every=3, delay_write_s=0.5)
    for bad in ("nope", "drop_notif_every=x"):
        with pytest.raises(ValueError, match="SGLANG_PD_TEST_KV_FAULTS"):
            FaultPlan.parse(bad)
    t = FakeKVTransport("solo", torch.zeros(1, 2, 4, 1, 1, 2), FakeFabric())
    assert maybe_wrap(t, {}) is t
    assert isinstance(maybe_wrap(t, {"SGLANG_PD_TEST_KV_FAULTS": "reverse_notifs"}), FaultyTransport)


# ---- both managers, faults at the transport seam ------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_pair(pplan: FaultPlan, dplan: FaultPlan, clock: Clock, envs: DisaggEnvs = ENVS
              ) -> tuple[KVSenderManager, KVReceiverManager, FaultyTransport, FaultyTransport]:
    fab = FakeFabric()
    pt = FaultyTransport(FakeKVTransport("prefill", torch.randn(2, 2, 10, 4, 2, 8), fab), pplan,
                         clock)
    dt = FaultyTransport(FakeKVTransport("decode", torch.zeros(2, 2, 20, 4, 2, 8), fab), dplan,
                         clock)
    server = BootstrapServer(HOST, 0, local_layout=pt.layout,
                             heartbeat_interval=envs.heartbeat_interval,
                             heartbeat_max_failure=envs.heartbeat_max_failure)
    return KVSenderManager(pt, server=server, envs=envs), KVReceiverManager(dt, envs=envs), pt, dt


def until(pred, what: str, limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.002)


DST, SRC = [11, 12, 13, 14, 15, 16], [1, 2, 3, 4, 5, 6]


def transfer(pm: KVSenderManager, dm: KVReceiverManager, room: int, chunks: list[int],
             clock: Clock, advance: float = 0.0) -> tuple[list[RoomUpdate], list[RoomUpdate]]:
    """Register, then write SRC into DST as ``chunks`` (page counts per kv_ready); poll both
    sides until each reported the room with its pages releasable (or gave up)."""
    assert dm.add_request(room, HOST, pm.server.port, DST, clock.t) is None
    until(lambda: pm.poll(clock.t) or (room in pm.rooms and pm.rooms[room].state.bootstrapped),
          "register")
    assert pm.add_request(room, SRC, clock.t) is None
    done = 0
    for n in chunks:
        done += n
        pm.kv_ready(room, done, last=done == len(SRC), now=clock.t, aux=b"aux" * (done == len(SRC)))
        pm.poll(clock.t)
    pu: list[RoomUpdate] = []
    du: list[RoomUpdate] = []

    def step() -> bool:
        clock.t += advance
        pu.extend(pm.poll(clock.t))
        du.extend(dm.poll(clock.t))
        return bool(pu) and any(u.pages_releasable for u in du)

    until(step, "both sides finish")
    return pu, du


@pytest.mark.parametrize("dplan", [
    FaultPlan(duplicate_notifs=True),
    FaultPlan(reverse_notifs=True),
    FaultPlan(duplicate_notifs=True, reverse_notifs=True),
])
def test_repeated_and_reordered_notices_still_deliver_exact_kv(dplan: FaultPlan) -> None:
    clock = Clock()
    pm, dm, pt, dt = make_pair(FaultPlan(), dplan, clock)
    try:
        pu, du = transfer(pm, dm, 21, [2, 2, 2], clock)
        assert [(u.phase, u.aux) for u in du] == [("Success", b"aux")]
        assert pu[0].phase == "Done"
        assert torch.equal(dt.inner.kv_buffer[:, :, DST], pt.inner.kv_buffer[:, :, SRC])
        assert dt.injected and not dm.rooms
    finally:
        pm.close()
        dm.close()


def test_a_lost_done_notice_fails_the_room_never_decodes_it() -> None:
    clock = Clock()
    # The virtual clock runs 0.5 s per poll while heartbeat acks travel in real time, so with
    # 1 s heartbeats a slow ack could fail the (live) prefill first (CI saw PEER_DEAD once);
    # heartbeats slower than the waiting timeout leave the lost notice as the only cause.
    slow_beats = dataclasses.replace(ENVS, heartbeat_interval=2 * ENVS.waiting_timeout)
    pm, dm, _pt, dt = make_pair(FaultPlan(), FaultPlan(drop_notif_every=2), clock, slow_beats)
    try:
        pu, du = transfer(pm, dm, 22, [2, 2, 2], clock, advance=0.5)  # time runs: decode times out
        assert pu[0].phase == "Done"  # prefill's writes all ended
        assert "Success" not in [u.phase for u in du]
        assert du[0].failure is Failure.WAITING_TIMEOUT and du[0].failure.http_status == 502
        assert du[-1].pages_releasable  # freed on prefill's AbortAck (nothing in flight)
        assert dt.injected == {"drop_notif": 1}
    finally:
        pm.close()
        dm.close()


def test_a_late_write_after_a_decode_abort_lands_before_the_pages_are_released() -> None:
    clock = Clock()
    pm, dm, pt, dt = make_pair(FaultPlan(delay_write_every=2, delay_write_s=5.0), FaultPlan(), clock)
    try:
        room = 23
        assert dm.add_request(room, HOST, pm.server.port, DST, clock.t) is None
        until(lambda: pm.poll(clock.t) or (room in pm.rooms and pm.rooms[room].state.bootstrapped),
              "register")
        assert pm.add_request(room, SRC, clock.t) is None
        pm.kv_ready(room, 3, last=False, now=clock.t)
        pm.poll(clock.t)  # chunk 0, posted now
        pm.kv_ready(room, 6, last=True, now=clock.t, aux=b"x")
        pm.poll(clock.t)  # chunk 1: the 2nd write, posted only at t = 5
        dm.abort(room, "decode's client left", clock.t)
        released_at: list[bool] = []
        du: list[RoomUpdate] = []
        pu: list[RoomUpdate] = []

        def step() -> bool:
            clock.t += 0.05
            pu.extend(pm.poll(clock.t))
            new = dm.poll(clock.t)
            if any(u.pages_releasable for u in new):
                released_at.append(clock.t)
            du.extend(new)
            return bool(pu) and bool(released_at)

        until(step, "abort settles")
        assert du[0].failure is Failure.ABORTED_LOCAL and not du[0].pages_releasable
        assert released_at[0] >= 5.0  # only after the late write was posted and ended
        assert torch.equal(dt.inner.kv_buffer[:, :, DST[3:]], pt.inner.kv_buffer[:, :, SRC[3:]])
        assert "Success" not in [u.phase for u in du]
        snapshot = dt.inner.kv_buffer.clone()
        for _ in range(20):  # nothing lands after the release
            clock.t += 1.0
            pm.poll(clock.t)
            dm.poll(clock.t)
        assert torch.equal(dt.inner.kv_buffer, snapshot)
    finally:
        pm.close()
        dm.close()


def test_a_done_notice_for_an_aborted_room_is_ignored_and_logged() -> None:
    clock = Clock()
    pm, dm, _pt, dt = make_pair(FaultPlan(), FaultPlan(hold_notifs=True), clock)
    try:
        room = 24
        pu, du = [], []
        assert dm.add_request(room, HOST, pm.server.port, DST, clock.t) is None
        until(lambda: pm.poll(clock.t) or (room in pm.rooms and pm.rooms[room].state.bootstrapped),
              "register")
        assert pm.add_request(room, SRC, clock.t) is None
        pm.kv_ready(room, 6, last=True, now=clock.t, aux=b"x")
        until(lambda: pu.extend(pm.poll(clock.t)) or pu, "prefill done")  # written; notice held
        dm.abort(room, "decode's client left", clock.t)
        until(lambda: pm.poll(clock.t) or du.extend(dm.poll(clock.t))
              or any(u.pages_releasable for u in du), "AbortAck")
        assert [(u.phase, u.failure) for u in du] == [("Failed", Failure.ABORTED_LOCAL)] * 2
        dt.release_held()  # the done notice arrives now, for a room already gone
        assert dm.poll(clock.t) == [] and dm.stray_notifs == 1
        # a new request with another room is not touched by it
        assert dm.add_request(25, HOST, pm.server.port, DST, clock.t) is None
        dt.release_held()
        dt.inner._inbox.append(m.kv_notif(24, 0, True, b"x", pages=(0, 6)))  # once more
        dm.poll(clock.t)
        assert dm.rooms[25].state.phase is ReceiverPhase.BOOTSTRAPPING and dm.stray_notifs == 2
    finally:
        pm.close()
        dm.close()
