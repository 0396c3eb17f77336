"""Bootstrap over real ZMQ on 127.0.0.1, and both managers end to end over the fake transport.

Heartbeat and timeout clocks are driven by fake ``now`` values; only ZMQ delivery
needs real (milliseconds of) time, so ``until`` spins with short sleeps.
"""

from __future__ import annotations


import pytest
from polling import until
import torch
from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.bootstrap import (
    BootstrapClient,
    BootstrapServer,
    Incoming,
    PeerDead,
    Refused,
)
from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.kv_layout import KVLayout
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.disaggregation.transfer.fake import FakeFabric, FakeKVTransport

pytestmark = pytest.mark.timeout(60)
ENVS = DisaggEnvs(
    bootstrap_timeout=30, waiting_timeout=30, heartbeat_interval=1.0, heartbeat_max_failure=2
)


def layout(page_size: int = 4, num_pages: int = 16) -> KVLayout:
    return KVLayout(2, num_pages, page_size, 2, 8, "float32", 4096, "cpu")


def reg(client: BootstrapClient, room: int, lay: KVLayout, pages: list[int]) -> m.Register:
    return m.Register(
        room=room,
        client_id=client.client_id,
        agent_name="dec",
        agent_metadata=b"md",
        layout=lay,
        dst_pages=pages,
    )


@pytest.mark.parametrize("threaded", [False, True])
def test_register_refusal_abort_and_heartbeat(threaded: bool) -> None:
    server = BootstrapServer("127.0.0.1", 0, local_layout=layout(), threaded=threaded)
    client = BootstrapClient(heartbeat_interval=1.0, heartbeat_max_failure=2)
    try:
        client.register(
            "127.0.0.1", server.port, reg(client, 1, layout(num_pages=99), [1, 2]), now=0.0
        )
        ev = until(server.poll, "register")
        assert ev == [Incoming(client.client_id, reg(client, 1, layout(num_pages=99), [1, 2]))]
        server.send(client.client_id, m.RegisterAck(1, "pre"))
        got = until(lambda: client.poll(0.1), "ack")
        assert got == [Incoming(f"127.0.0.1:{server.port}", m.RegisterAck(1, "pre"))]

        client.register("127.0.0.1", server.port, reg(client, 2, layout(page_size=8), [1]), now=0.2)
        refused = until(server.poll, "refusal")
        assert (
            isinstance(refused[0], Refused) and "page_size: local=4 remote=8" in refused[0].reason
        )
        reply = until(lambda: client.poll(0.3), "refusal reply")[0]
        assert isinstance(reply, Incoming) and isinstance(reply.msg, m.RegisterRefused)
        assert "only num_pages may differ" in reply.msg.reason

        client.register("127.0.0.1", server.port, reg(client, 3, layout(), [0]), now=0.4)
        assert "page 0 is the reserved dummy page" in until(server.poll, "bad pages")[0].reason

        client.abort(1, "user cancelled")
        assert until(server.poll, "abort") == [
            Incoming(client.client_id, m.Abort(1, "user cancelled"))
        ]
        server.send(client.client_id, m.Abort(1, "prefill says stop"))
        seen: list = []
        until(
            lambda: seen.extend(client.poll(0.5)) or any(isinstance(e.msg, m.Abort) for e in seen),
            "abort back",
        )
        assert [e.msg for e in seen if isinstance(e.msg, m.Abort)] == [
            m.Abort(1, "prefill says stop")
        ]
        # Heartbeats are answered by the server itself: far past interval*max_failure, still
        # alive. Fake time moves on only once the ping sent at this time was answered (ordered
        # by events, so a slow machine cannot turn ZMQ delay into missed heartbeats).
        (link,) = client._links.values()
        dead: list = []

        def answered(now: float) -> bool:
            server.poll()
            dead.extend(e for e in client.poll(now) if isinstance(e, PeerDead))
            return link.outstanding is None

        for step in range(1, 40):
            now = 0.5 + step * 0.5
            dead.extend(e for e in client.poll(now) if isinstance(e, PeerDead))
            until(lambda now=now: answered(now), f"heartbeat answer at t={now}", timeout=30)
        assert not dead and link.failures == 0
    finally:
        client.close()
        server.close()


def test_dead_prefill_detected_after_max_failures() -> None:
    server = BootstrapServer("127.0.0.1", 0, threaded=False)
    client = BootstrapClient(heartbeat_interval=1.0, heartbeat_max_failure=2)
    client.register("127.0.0.1", server.port, reg(client, 5, layout(), [1]), now=0.0)
    until(server.poll, "register")
    server.close()  # prefill dies
    events: list = []
    for now in (0.0, 0.5, 1.0, 1.5, 2.0):
        events += client.poll(now)
    dead = [e for e in events if isinstance(e, PeerDead)]
    assert len(dead) == 1 and dead[0].rooms == [5] and "missed 2 heartbeats" in dead[0].reason
    client.close()


def test_server_reports_silent_decode() -> None:
    server = BootstrapServer(
        "127.0.0.1", 0, heartbeat_interval=1.0, heartbeat_max_failure=2, threaded=False
    )
    client = BootstrapClient(heartbeat_interval=1.0)
    client.poll(0.0)  # no link yet: nothing to ping
    client.register("127.0.0.1", server.port, reg(client, 5, layout(), [1]), now=0.0)
    until(lambda: server.poll(now=10.0), "register")
    client.close()
    assert server.poll(now=12.9) == []
    dead = server.poll(now=13.1)
    assert len(dead) == 1 and isinstance(dead[0], PeerDead) and dead[0].peer == client.client_id
    server.close()


# ---- managers over the fake transport ------------------------------------------------------


def make_pair(
    fab: FakeFabric, dst_page_size: int = 4, envs: DisaggEnvs = ENVS
) -> tuple[KVSenderManager, KVReceiverManager]:
    p_buf = torch.randn(2, 2, 10, 4, 2, 8)
    d_buf = torch.zeros(2, 2, 20, dst_page_size, 2, 8)
    pt, dt = FakeKVTransport("prefill", p_buf, fab), FakeKVTransport("decode", d_buf, fab)
    pm = KVSenderManager(pt, envs=envs, bootstrap_host="127.0.0.1", bootstrap_port=0)
    return pm, KVReceiverManager(dt, envs=envs)


def drive(pm: KVSenderManager, dm: KVReceiverManager, now: float, want: int) -> tuple[list, list]:
    pu: list[RoomUpdate] = []
    du: list[RoomUpdate] = []

    def step() -> bool:
        pu.extend(pm.poll(now))
        du.extend(dm.poll(now))
        return len(pu) + len(du) >= want

    until(step, f"{want} room updates")
    return pu, du


def test_managers_chunked_transfer_end_to_end() -> None:
    fab = FakeFabric()
    pm, dm = make_pair(fab)
    try:
        dm.add_request(42, "127.0.0.1", pm.server.port, [7, 3, 12, 9], now=0.0)
        until(
            lambda: pm.poll(0.0) or (pm.rooms.get(42) and pm.rooms[42].state.bootstrapped), "register"
        )
        pm.add_request(42, [1, 2, 5, 6], now=0.1)
        pm.kv_ready(42, 2, last=False, now=0.2)  # first chunked-prefill step filled 2 pages
        pm.poll(0.2)
        pm.kv_ready(42, 4, last=True, now=0.3)
        pu, du = drive(pm, dm, 0.4, want=2)
        assert pu == [RoomUpdate(42, "Done")] and du == [RoomUpdate(42, "Success")]
        d_buf, p_buf = dm.transport.kv_buffer, pm.transport.kv_buffer  # type: ignore[attr-defined]
        assert torch.equal(d_buf[:, :, [7, 3, 12, 9]], p_buf[:, :, [1, 2, 5, 6]])
        assert pm.rooms == {} and dm.rooms == {}
    finally:
        pm.close()
        dm.close()


def test_managers_layout_mismatch_refused_with_message() -> None:
    fab = FakeFabric()
    pm, dm = make_pair(fab, dst_page_size=8)
    try:
        dm.add_request(1, "127.0.0.1", pm.server.port, [1], now=0.0)
        _, du = drive(pm, dm, 0.1, want=1)
        assert (
            du[0].phase == "Failed" and du[0].failure is Failure.REFUSED and du[0].pages_releasable
        )
        assert "page_size: local=4 remote=8" in du[0].reason
    finally:
        pm.close()
        dm.close()


def test_managers_decode_abort_is_acked_and_pages_released() -> None:
    fab = FakeFabric()
    pm, dm = make_pair(fab)
    try:
        dm.add_request(8, "127.0.0.1", pm.server.port, [1, 2], now=0.0)
        pm.add_request(8, [3, 4], now=0.0)
        until(
            lambda: (pm.poll(0.0), dm.poll(0.0)) and dm.rooms[8].state.acked_at is not None, "ack"
        )
        dm.abort(8, "client went away", now=0.1)
        pu, du = drive(pm, dm, 0.2, want=3)  # decode: Failed (quarantined), then releasable
        assert pu[0].phase == "Failed" and pu[0].failure is Failure.ABORTED_REMOTE
        assert [(u.phase, u.pages_releasable) for u in du] == [("Failed", False), ("Failed", True)]
    finally:
        pm.close()
        dm.close()


def test_managers_prefill_death_fails_decode_room() -> None:
    fab = FakeFabric()
    pm, dm = make_pair(fab)
    dm.add_request(9, "127.0.0.1", pm.server.port, [1], now=0.0)
    until(lambda: (pm.poll(0.0), dm.poll(0.0)) and dm.rooms[9].state.acked_at is not None, "ack")
    pm.close()
    updates: list[RoomUpdate] = []
    for step in range(1, 9):  # a reply to the ping sent at t=0 may still arrive: 2 more misses
        updates += dm.poll(step * 0.5)
    assert [(u.room, u.failure, u.pages_releasable) for u in updates] == [
        (9, Failure.PEER_DEAD, True)
    ]
    dm.close()


def test_queued_request_is_not_mistaken_for_one_that_never_came() -> None:
    """A decode registers; prefill's request sits in its queue past the bootstrap timeout.
    With expect() the room survives; without it the sweep aborts it as never-arrived."""
    fab = FakeFabric()
    envs = DisaggEnvs(bootstrap_timeout=30, waiting_timeout=300, heartbeat_interval=1000.0,
                      heartbeat_max_failure=2)  # decode waits long; no heartbeats in fake time
    pm, dm = make_pair(fab, envs=envs)
    try:
        pm.expect(9, now=0.0)
        dm.add_request(9, "127.0.0.1", pm.server.port, [1, 2], now=0.0)
        until(lambda: pm.poll(0.0) or (pm.rooms.get(9) and pm.rooms[9].state.bootstrapped), "register")
        until(lambda: dm.poll(0.0) or dm.rooms[9].state.acked_at is not None, "ack")
        late = envs.bootstrap_timeout + 1.0
        assert pm.poll(late) == [] and 9 in pm.rooms  # still waiting for its first chunk
        pm.add_request(9, [3, 4], now=late)
        pm.kv_ready(9, 2, last=True, now=late)
        pu, du = drive(pm, dm, late, want=2)
        assert pu == [RoomUpdate(9, "Done")] and du[0].phase == "Success"
    finally:
        pm.close()
        dm.close()


def test_prefill_acks_an_abort_for_a_room_it_does_not_know() -> None:
    """docs/disaggregation.md: AbortAck promises nothing is in flight, "P answers this for rooms
    it does not know, too" (a decode that aborts a room prefill never saw must not wait for
    its quarantine limit); no room is created and no update reported."""
    pm, dm = make_pair(FakeFabric())
    client = BootstrapClient(heartbeat_interval=1.0)
    try:
        abort = m.Abort(room=99, reason="never registered")
        assert client._send_for_room("127.0.0.1", pm.server.port, 99, abort, 0.0) is None
        got: list = []
        updates: list = []

        def acked() -> bool:
            updates.extend(pm.poll(0.0))
            got.extend(e.msg for e in client.poll(0.0) if isinstance(e, Incoming))
            return bool(got)

        until(acked, "AbortAck")
        assert got == [m.AbortAck(room=99)] and updates == [] and pm.rooms == {}
    finally:
        client.close()
        pm.close()
        dm.close()
