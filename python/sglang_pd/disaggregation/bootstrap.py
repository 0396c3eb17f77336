"""Bootstrap protocol: decode registers each room with its prefill.

Transport: ZMQ, msgpack messages from ``messages.py``. The prefill runs a
``BootstrapServer`` (ROUTER bound on --disaggregation-bootstrap-port, default
8998); each decode runs one ``BootstrapClient`` with one DEALER per prefill
address, whose routing id is the decode's ``client_id``. Replies and
prefill-originated aborts go back over that same connection, so the decode
needs no listening port of its own.

Both ends are non-blocking: the engine calls ``poll(now)`` every loop
iteration and gets a list of events. By default (``threaded=True``) the
server runs a small thread that owns the socket, answers heartbeats and
refuses bad registrations itself, and only enqueues events for ``poll`` to
drain, so a long forward pass on prefill cannot make decode declare it dead.
It touches no engine state. ``threaded=False`` does all of that inside
``poll(now)`` instead (deterministic; used by tests with fake time).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import msgspec
import zmq

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.addr import is_ipv6, tcp_endpoint
from sglang_pd.disaggregation.kv_layout import KVLayout

logger = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP_PORT = 8998
# Messages a decode queues per prefill connection (ZMQ SNDHWM). A prefill that is unreachable
# or not reading fills it; then new rooms for it fail at once (Failure.UNREACHABLE) until its
# missed heartbeats drop the connection, instead of the queue growing without bound.
MAX_QUEUED_PER_PEER = 1024


@dataclass(frozen=True)
class Incoming:
    """A message the engine must act on (Register, Abort on prefill; replies on decode)."""

    peer: str  # prefill side: decode client_id; decode side: prefill "host:port"
    msg: m.Message


@dataclass(frozen=True)
class Refused:
    """Prefill side, informational: the server refused a Register by itself."""

    client_id: str
    room: int
    reason: str


@dataclass(frozen=True)
class PeerDead:
    """Prefill: a decode stopped heartbeating. Decode: a prefill missed
    ``max_failure`` heartbeats in a row; ``rooms`` were registered with it."""

    peer: str
    rooms: list[int]
    reason: str


Event = Incoming | Refused | PeerDead


def _ctx() -> zmq.Context:
    return zmq.Context.instance()


class BootstrapServer:
    def __init__(
        self,
        host: str = "0.0.0.0",
        port: int = DEFAULT_BOOTSTRAP_PORT,
        *,
        local_layout: KVLayout | None = None,
        heartbeat_interval: float = 5.0,
        heartbeat_max_failure: int = 2,
        threaded: bool = True,
    ) -> None:
        self.local_layout = local_layout
        # A decode that was heard from and then went silent this long is dead.
        self.silence_limit = heartbeat_interval * (heartbeat_max_failure + 1)
        self._last_seen: dict[str, float] = {}
        self._sock = _ctx().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted decode may reuse its id
        if port == 0:
            self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        else:
            self._sock.bind(f"tcp://{host}:{port}")
            self.port = port
        self.host = host
        self._threaded = threaded
        self._inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[tuple[str, m.Message]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(
                target=self._run, name=f"bootstrap-{self.port}", daemon=True
            )
            self._thread.start()

    def poll(self, now: float | None = None) -> list[Event]:
        """Events since the last call; never blocks."""
        if not self._threaded:
            return self._pump(time.monotonic() if now is None else now)
        out: list[Event] = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    def has_events(self) -> bool:
        """Whether ``poll`` has something to return (always True unthreaded: it reads the socket).
        An idle engine must still poll then, or a Register waits unanswered for its next request."""
        return not self._threaded or not self._inbox.empty()

    def send(self, client_id: str, msg: m.Message) -> None:
        if self._threaded:
            self._outbox.put((client_id, msg))
        else:
            self._send(client_id, msg)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._sock.close(linger=0)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                poller.poll(timeout=5)
                while True:
                    try:
                        self._send(*self._outbox.get_nowait())
                    except queue.Empty:
                        break
                for ev in self._pump(time.monotonic()):
                    self._inbox.put(ev)
            except Exception:  # one bad message must not silence the server (decodes would
                if self._stop.is_set():  # declare this prefill dead)
                    return
                logger.exception("bootstrap server: error in its loop; continuing")
                time.sleep(0.01)

    def _send(self, client_id: str, msg: m.Message) -> None:
        try:
            self._sock.send_multipart([client_id.encode(), m.encode(msg)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # unknown/vanished peer: ROUTER drops or refuses
            logger.warning(
                "bootstrap: could not send %s to %s: %s", type(msg).__name__, client_id, e
            )

    def _pump(self, now: float) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                logger.warning("bootstrap: dropping message with %d frames", len(frames))
                continue
            client_id = frames[0].decode(errors="replace")
            try:
                msg = m.decode(frames[1])
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                logger.warning("bootstrap: undecodable message from %s: %s", client_id, e)
                continue
            self._last_seen[client_id] = now
            try:
                self._handle(client_id, msg, events)
            except Exception:  # one bad message must not cost the others (or the thread)
                logger.exception(
                    "bootstrap: error handling %s from %s", type(msg).__name__, client_id
                )
        for client_id, seen in list(self._last_seen.items()):
            if now - seen > self.silence_limit:
                del self._last_seen[client_id]
                events.append(
                    PeerDead(client_id, [], f"decode {client_id} silent for {now - seen:.1f}s")
                )
        return events

    def _handle(self, client_id: str, msg: m.Message, events: list[Event]) -> None:
        if isinstance(msg, m.Heartbeat):
            self._send(client_id, m.HeartbeatAck(seq=msg.seq, sent_at=msg.sent_at))
        elif isinstance(msg, m.Register):
            reason = self._check_register(client_id, msg)
            if reason is None:
                events.append(Incoming(client_id, msg))
            else:
                self._send(client_id, m.RegisterRefused(room=msg.room, reason=reason))
                events.append(Refused(client_id, msg.room, reason))
        else:
            events.append(Incoming(client_id, msg))

    def _check_register(self, client_id: str, reg: m.Register) -> str | None:
        if reg.version != m.PROTOCOL_VERSION:
            return (
                f"protocol version {reg.version} not supported; prefill speaks {m.PROTOCOL_VERSION}"
            )
        if reg.client_id != client_id:
            return (
                f"client_id {reg.client_id!r} does not match the connection's "
                f"routing id {client_id!r}"
            )
        if self.local_layout is not None:
            err = self.local_layout.compatible_with(reg.layout)
            if err:
                return f"room {reg.room}: {err}"
        try:
            reg.layout.check_pages(reg.dst_pages, f"room {reg.room} dst_pages")
        except ValueError as e:
            return str(e)
        return None


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
            sock = _ctx().socket(zmq.DEALER)
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
