"""Decode side of the bootstrap protocol: one DEALER per prefill, heartbeats, and the
rooms each connection carries (reported back when the prefill is declared dead)."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

import msgspec
import zmq

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.addr import is_ipv6, tcp_endpoint
from sglang_pd.disaggregation.bootstrap.events import (
    MAX_QUEUED_PER_PEER,
    Event,
    Incoming,
    PeerDead,
    zmq_ctx,
)

logger = logging.getLogger(__name__)


@dataclass
class _Link:
    addr: str
    sock: zmq.Socket
    next_hb: float
    outstanding: int | None = None
    sent_at: float = 0.0
    failures: int = 0
    rooms: set[int] = field(default_factory=set)


class BootstrapClient:
    def __init__(
        self,
        client_id: str | None = None,
        *,
        heartbeat_interval: float = 5.0,
        heartbeat_max_failure: int = 2,
        max_queued: int = MAX_QUEUED_PER_PEER,
    ) -> None:
        self.client_id = client_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_max_failure = heartbeat_max_failure
        self.max_queued = max_queued
        self._links: dict[str, _Link] = {}
        self._room_addr: dict[int, str] = {}
        self._seq = 0

    def _link(self, host: str, port: int, now: float) -> _Link | str:
        """The connection to a prefill, made on first use; a str says why it cannot be made."""
        try:
            endpoint = tcp_endpoint(host, port)
        except ValueError as e:
            return str(e)
        addr = endpoint.removeprefix("tcp://")
        link = self._links.get(addr)
        if link is None:
            sock = zmq_ctx().socket(zmq.DEALER)
            try:
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, self.max_queued)
                sock.setsockopt(zmq.ROUTING_ID, self.client_id.encode())
                if is_ipv6(host):
                    sock.setsockopt(zmq.IPV6, 1)
                sock.connect(endpoint)
            except zmq.ZMQError as e:
                sock.close(linger=0)
                return f"cannot connect to prefill bootstrap server {endpoint}: {e}"
            link = self._links[addr] = _Link(addr, sock, next_hb=now)
        return link

    def register(
        self, host: str, port: int, reg: m.Register, now: float | None = None
    ) -> str | None:
        """Send the room's Register. None once queued; else why not (bad address, or the
        prefill's send queue is full): nothing was sent, and only this room is affected."""
        if reg.client_id != self.client_id:
            raise ValueError(
                f"Register.client_id {reg.client_id!r} must be this client's id {self.client_id!r}"
            )
        return self._send_for_room(host, port, reg.room, reg, now)

    def claim(self, host: str, port: int, room: int, now: float | None = None) -> str | None:
        """Tell the prefill this decode holds ``room`` (its Register comes later). Like
        ``register``: None once queued, else why not. The room's PeerDead reports include it."""
        return self._send_for_room(host, port, room, m.Claim(room, self.client_id), now)

    def _send_for_room(
        self, host: str, port: int, room: int, msg: m.Message, now: float | None
    ) -> str | None:
        link = self._link(host, port, time.monotonic() if now is None else now)
        if isinstance(link, str):
            return link
        if not self._try_send(link, msg):
            return (
                f"prefill {link.addr} is not reading its bootstrap connection "
                f"({self.max_queued} messages already queued to it): it is down or overloaded"
            )
        link.rooms.add(room)
        self._room_addr[room] = link.addr
        return None

    def abort(self, room: int, reason: str) -> None:
        """Tell the room's prefill to stop; expect an AbortAck."""
        self.send(room, m.Abort(room=room, reason=reason))

    def send(self, room: int, msg: m.Message) -> None:
        addr = self._room_addr.get(room)
        link = self._links.get(addr) if addr else None
        if link is None:
            logger.warning(
                "bootstrap: room %d has no live prefill link; dropping %s", room, type(msg).__name__
            )
            return
        if not self._try_send(link, msg):
            logger.warning(
                "bootstrap: send queue to %s full; dropped %s", link.addr, type(msg).__name__
            )

    @staticmethod
    def _try_send(link: _Link, msg: m.Message) -> bool:
        try:
            link.sock.send(m.encode(msg), flags=zmq.NOBLOCK)
            return True
        except zmq.Again:  # high-water mark reached: the peer is not reading
            return False
        except zmq.ZMQError as e:
            logger.warning(
                "bootstrap: sending %s to %s failed: %s", type(msg).__name__, link.addr, e
            )
            return False

    def forget(self, room: int) -> None:
        """The room finished; stop reporting it in PeerDead events."""
        addr = self._room_addr.pop(room, None)
        if addr in self._links:
            self._links[addr].rooms.discard(room)

    def poll(self, now: float | None = None) -> list[Event]:
        now = time.monotonic() if now is None else now
        events: list[Event] = []
        for link in list(self._links.values()):
            self._recv(link, now, events)
            if link.outstanding is not None and now - link.sent_at >= self.heartbeat_interval:
                link.outstanding = None
                link.failures += 1
                if link.failures >= self.heartbeat_max_failure:
                    events.append(
                        self._drop(link, f"prefill {link.addr} missed {link.failures} heartbeats")
                    )
                    continue
            if link.outstanding is None and now >= link.next_hb:
                self._seq += 1
                link.outstanding, link.sent_at = self._seq, now
                link.next_hb = now + self.heartbeat_interval
                # If it cannot even be queued, the missing ack counts as a failure.
                self._try_send(link, m.Heartbeat(seq=self._seq, sent_at=now))
        return events

    def _recv(self, link: _Link, now: float, events: list[Event]) -> None:
        while True:
            try:
                data = link.sock.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = m.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                logger.warning("bootstrap: undecodable message from %s: %s", link.addr, e)
                continue
            if isinstance(msg, m.HeartbeatAck):
                if msg.seq == link.outstanding:
                    link.outstanding, link.failures = None, 0
            else:
                events.append(Incoming(link.addr, msg))

    def _drop(self, link: _Link, reason: str) -> PeerDead:
        # Close the socket so queued messages die with it; a later register
        # to the same address reconnects from scratch.
        del self._links[link.addr]
        link.sock.close(linger=0)
        for room in link.rooms:
            self._room_addr.pop(room, None)
        return PeerDead(link.addr, sorted(link.rooms), reason)

    def close(self) -> None:
        for link in self._links.values():
            link.sock.close(linger=0)
        self._links.clear()
