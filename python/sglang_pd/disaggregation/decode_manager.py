"""Decode-side glue: bootstrap client + KV transport + one KVReceiverState per room.

The engine calls, from its loop thread only:
  add_request(room, bootstrap_host, bootstrap_port, dst_pages, now)   pages reserved
  abort(room, reason, now)                                            request cancelled
  poll(now) -> list[RoomUpdate]                                       every iteration

A room is reported when it reaches Success (its KV is in dst_pages: start
decoding) or Failed, and reported again with pages_releasable=True if its
pages had to be quarantined first (a prefill write might still have landed).
Decode is the passive side of the WRITE; its transport never adds peers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.bootstrap import BootstrapClient, Incoming, PeerDead, Refused
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.state import KVReceiverState, RoomUpdate
from sglang_pd.disaggregation.transfer.base import KVTransport

logger = logging.getLogger(__name__)


@dataclass
class _Room:
    state: KVReceiverState
    reported: bool = False
    aux: bytes = b""


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
        self._metadata = transport.metadata()

    def add_request(
        self, room: int, bootstrap_host: str, bootstrap_port: int, dst_pages: list[int], now: float
    ) -> None:
        if room in self.rooms:
            raise ValueError(
                f"room {room} is already active on this decode; bootstrap_room must be unique"
            )
        # Validate locally first: a bad page list is our bug, not prefill's.
        self.transport.layout.check_pages(dst_pages, f"room {room} dst_pages")
        grace = self.envs.heartbeat_interval * (self.envs.heartbeat_max_failure + 1)
        st = KVReceiverState(
            room, now, self.envs.bootstrap_timeout, self.envs.waiting_timeout, abort_grace=grace
        )
        self.rooms[room] = _Room(st)
        reg = m.Register(
            room=room,
            client_id=self.client.client_id,
            agent_name=self.transport.agent_name,
            agent_metadata=self._metadata,
            layout=self.transport.layout,
            dst_pages=list(dst_pages),
        )
        self.client.register(bootstrap_host, bootstrap_port, reg, now)

    def abort(self, room: int, reason: str, now: float) -> None:
        r = self.rooms.get(room)
        if r is not None:
            r.state.abort(now, reason)

    def poll(self, now: float) -> list[RoomUpdate]:
        for ev in self.client.poll(now):
            self._on_event(ev, now)
        for data in self.transport.get_notifs():
            n = m.parse_kv_notif(data)
            r = self.rooms.get(n.room) if n is not None else None
            if n is None or r is None:
                logger.debug("ignoring notification %r (unknown room or not a KV tag)", data[:64])
                continue
            if n.last:
                r.aux = n.aux
            r.state.on_kv_notif(now, n.chunk, n.last)
        updates: list[RoomUpdate] = []
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

    def _on_event(self, ev: Incoming | Refused | PeerDead, now: float) -> None:
        if isinstance(ev, PeerDead):
            logger.warning("%s; failing rooms %s", ev.reason, ev.rooms)
            for room in ev.rooms:
                r = self.rooms.get(room)
                if r is not None:
                    r.state.on_peer_dead(now, ev.reason)
            return
        if not isinstance(ev, Incoming):
            return
        msg = ev.msg
        r = self.rooms.get(getattr(msg, "room", -1))
        if r is None:
            return  # late reply for a room we already released
        if isinstance(msg, m.RegisterAck):
            r.state.on_ack(now)
        elif isinstance(msg, m.RegisterRefused):
            r.state.on_refused(now, msg.reason)
        elif isinstance(msg, m.Abort):
            r.state.on_remote_abort(now, msg.reason)
        elif isinstance(msg, m.AbortAck):
            r.state.on_abort_ack(now)

    def close(self) -> None:
        self.client.close()
