"""Decode-side glue: bootstrap client + KV transport + one KVReceiverState per room.

The engine calls, from its loop thread only:
  room_in_use(room) -> bool                                  at admission: refuse a duplicate
  expect(room, bootstrap_host, bootstrap_port, now)          request admitted, pages not yet
  add_request(room, bootstrap_host, bootstrap_port, dst_pages, now)   pages reserved
  abort(room, reason, now)                                   request cancelled
  poll(now) -> list[RoomUpdate]                              every iteration

No per-room problem raises: ``expect`` and ``add_request`` return a Failed RoomUpdate (the
manager then holds nothing for that call, and the caller's pages are free at once) or None.
A room is reported by poll() when it reaches Success (its KV is in dst_pages: start decoding)
or Failed, and reported again with pages_releasable=True if its pages had to be quarantined
first (a prefill write might still land). A room that was only expected (no pages yet) can be
reported Failed too: its prefill died or failed the room; the engine should drop the request.
Decode is the passive side of the WRITE; its transport never adds peers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.addr import validate_bootstrap_addr
from sglang_pd.disaggregation.bootstrap import BootstrapClient, Incoming, PeerDead, Refused
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.receiver_state import KVReceiverState, ReceiverPhase
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.disaggregation.transfer.base import KVTransport

logger = logging.getLogger(__name__)

STRAY_LOG_EVERY_S = 10.0


@dataclass
class _Room:
    state: KVReceiverState
    reported: bool = False
    aux: bytes = b""


def _failed(room: int, failure: Failure, reason: str) -> RoomUpdate:
    return RoomUpdate(room, "Failed", failure, reason, pages_releasable=True)


class KVReceiverManager:
    def __init__(
        self,
        transport: KVTransport,
        client: BootstrapClient | None = None,
        envs: DisaggEnvs | None = None,
    ) -> None:
        self.transport = transport
        self.envs = envs or DisaggEnvs.load()
        self.client = client or BootstrapClient(
            heartbeat_interval=self.envs.heartbeat_interval,
            heartbeat_max_failure=self.envs.heartbeat_max_failure,
        )
        self.rooms: dict[int, _Room] = {}
        self.claims: set[int] = set()  # expected rooms: Claim sent, pages not yet reserved
        self._claim_failures: dict[int, RoomUpdate] = {}  # claimed rooms that failed, unreported
        self._metadata = transport.metadata()
        # KV notices for rooms not held here (finished and released, never registered, or
        # garbage): ignored, counted, and logged at most every STRAY_LOG_EVERY_S.
        self.stray_notifs = 0
        self._stray_logged_at: float | None = None

    def room_in_use(self, room: int) -> bool:
        """Whether a request for ``room`` is still held here (expected, transferring, or its
        pages quarantined after a failure). A new request with that room must be refused."""
        return room in self.rooms or room in self.claims or room in self._claim_failures

    def expect(
        self, room: int, bootstrap_host: str, bootstrap_port: int, now: float
    ) -> RoomUpdate | None:
        """The engine admitted a request for ``room`` and will reserve its pages later. Tells the
        prefill now, so that it fails the room at once if this decode dies or aborts meanwhile.
        Optional: add_request works without it. None, or a Failed update (nothing held)."""
        error = self._check_new(room, bootstrap_host, bootstrap_port)
        if error is not None:
            return error
        why = self.client.claim(bootstrap_host, bootstrap_port, room, now)
        if why is not None:
            return _failed(room, Failure.UNREACHABLE, f"room {room}: {why}")
        self.claims.add(room)
        return None

    def add_request(
        self, room: int, bootstrap_host: str, bootstrap_port: int, dst_pages: list[int], now: float,
        prefix_len: int = 0,
    ) -> RoomUpdate | None:
        """Register ``dst_pages`` for ``room`` with its prefill (the prompt's pages after the
        ``prefix_len`` tokens this decode already holds: decode_reuse.py). None: poll() reports
        the room later. A Failed update (pages_releasable): nothing was sent and nothing is held; the
        caller frees dst_pages and fails the request (``failure.http_status``)."""
        early = self._claim_failures.pop(room, None)
        if early is not None:  # the prefill failed the room while it waited for pages
            return early
        claimed = room in self.claims
        self.claims.discard(room)
        error = None if claimed else self._check_new(room, bootstrap_host, bootstrap_port)
        if error is not None:
            return error
        try:  # validate locally first: a bad page list is our bug, not prefill's
            self.transport.layout.check_pages(dst_pages, f"room {room} dst_pages")
        except ValueError as e:
            logger.error("decode engine passed bad pages: %s", e)
            if claimed:
                self.client.abort(room, str(e))
                self.client.forget(room)
            return _failed(room, Failure.REFUSED, str(e))
        st = KVReceiverState(
            room,
            now,
            self.envs.bootstrap_timeout,
            self.envs.waiting_timeout,
            abort_grace=self.envs.quarantine_limit,
            abort_resend=self.envs.heartbeat_interval,
            num_pages=len(dst_pages),
        )
        reg = m.Register(
            room=room,
            client_id=self.client.client_id,
            agent_name=self.transport.agent_name,
            agent_metadata=self._metadata,
            layout=self.transport.layout,
            dst_pages=list(dst_pages),
            tp_size=getattr(self, "tp_size", 1),  # tp_sides.RankReceiverManager sets it
            prefix_len=prefix_len,
            ranks=list(getattr(self, "rank_agents", ())),  # tp_sides.RankReceiverManager's
        )
        why = self.client.register(bootstrap_host, bootstrap_port, reg, now)
        if why is not None:  # never sent: no write can come, the pages are free at once
            self.client.forget(room)
            return _failed(room, Failure.UNREACHABLE, f"room {room}: {why}")
        self.rooms[room] = _Room(st)
        return None

    def _check_new(self, room: int, host: str, port: int) -> RoomUpdate | None:
        if self.room_in_use(room):
            return _failed(
                room,
                Failure.INVALID_REQUEST,
                f"bootstrap_room {room} is still in use on this decode server (an earlier "
                "request with it has not finished, or its KV pages are still quarantined); "
                "bootstrap_room must be unique per request",
            )
        why = validate_bootstrap_addr(host, port)
        if why is not None:
            return _failed(room, Failure.INVALID_REQUEST, why)
        return None

    def abort(self, room: int, reason: str, now: float) -> None:
        """Cancel the room. A transferring room is reported Failed by poll() (pages quarantined
        until the prefill confirms); an only-expected room is dropped and not reported."""
        r = self.rooms.get(room)
        if r is not None:
            r.state.abort(now, reason)
        elif room in self.claims:
            self.claims.discard(room)
            self.client.abort(room, reason)  # prefill fails the room at once
            self.client.forget(room)
        else:
            self._claim_failures.pop(room, None)

    def poll(self, now: float) -> list[RoomUpdate]:
        for ev in self.client.poll(now):
            self._on_event(ev, now)
        for data in self.transport.get_notifs():
            self._on_notif(data, now)
        updates = list(self._claim_failures.values())
        self._claim_failures.clear()
        for room, r in list(self.rooms.items()):
            st = r.state
            st.check_timeouts(now)
            for msg in st.take_outbox():
                self.client.send(room, msg)
            if not st.is_finished:
                continue
            releasable = st.pages_releasable(now)
            if not r.reported or releasable:
                updates.append(
                    RoomUpdate(room, st.phase.value, st.failure, st.reason, releasable, r.aux)
                )
                r.reported = True
            if releasable:
                del self.rooms[room]
                self.client.forget(room)
        return updates

    def _on_notif(self, data: bytes, now: float) -> None:
        n = m.parse_kv_notif(data)
        r = self.rooms.get(n.room) if n is not None else None
        if n is None or r is None:
            # A late or repeated notice for a room already released, or not a KV tag. It cannot
            # touch another room: rooms are matched by their full 63-bit number.
            self.stray_notifs += 1
            if self._stray_logged_at is None or now - self._stray_logged_at >= STRAY_LOG_EVERY_S:
                self._stray_logged_at = now
                logger.warning("ignoring KV notification %r (unknown room or not a KV tag); "
                               "%d ignored so far", data[:64], self.stray_notifs)
            return
        st = r.state
        if st.phase is ReceiverPhase.FAILED:
            logger.info("room %d: a WRITE landed after the room failed (chunk %d); its pages are "
                        "still quarantined", n.room, n.chunk)
        before = st.phase
        if st.on_kv_notif(now, n.chunk, n.last, n.pages) and n.last:
            r.aux = n.aux
        if st.phase is not before and st.failure is not None:
            logger.error("%s", st.reason)

    def _fail_claim(self, room: int, failure: Failure, reason: str) -> None:
        self.claims.discard(room)
        self.client.forget(room)
        self._claim_failures[room] = _failed(room, failure, reason)

    def _on_event(self, ev: Incoming | Refused | PeerDead, now: float) -> None:
        if isinstance(ev, PeerDead):
            logger.warning("%s; failing rooms %s", ev.reason, ev.rooms)
            for room in ev.rooms:
                r = self.rooms.get(room)
                if r is not None:
                    r.state.on_peer_dead(now, ev.reason)
                elif room in self.claims:
                    self._fail_claim(room, Failure.PEER_DEAD, ev.reason)
            return
        if not isinstance(ev, Incoming):
            return
        msg = ev.msg
        room = getattr(msg, "room", -1)
        r = self.rooms.get(room)
        if r is None:
            if isinstance(msg, m.Abort) and room in self.claims:
                self._fail_claim(
                    room, Failure.ABORTED_REMOTE, f"prefill aborted room {room}: {msg.reason}"
                )
            elif isinstance(msg, m.RegisterRefused) and room in self.claims:
                self._fail_claim(room, Failure.REFUSED, msg.reason)
            return  # else a late reply for a room we already released
        if isinstance(msg, m.RegisterAck):
            r.state.on_ack(now)
        elif isinstance(msg, m.RegisterRefused):
            r.state.on_refused(now, msg.reason)
        elif isinstance(msg, m.Abort):
            r.state.on_remote_abort(now, msg.reason, msg.writes_in_flight)
        elif isinstance(msg, m.AbortAck):
            r.state.on_abort_ack(now)

    def close(self) -> None:
        self.client.close()
