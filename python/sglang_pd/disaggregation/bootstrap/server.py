"""Prefill side of the bootstrap protocol: one ROUTER that answers heartbeats, vets
Registers and queues events for the engine."""

from __future__ import annotations

import logging
import queue
import threading
import time

import msgspec
import zmq

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.bootstrap.events import (
    DEFAULT_BOOTSTRAP_PORT,
    Event,
    Incoming,
    PeerDead,
    Refused,
    zmq_ctx,
)
from sglang_pd.disaggregation.decode_reuse import check_prefix_len
from sglang_pd.disaggregation.kv_layout import KVLayout

logger = logging.getLogger(__name__)


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
        self._sock = zmq_ctx().socket(zmq.ROUTER)
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
        return check_prefix_len(reg.prefix_len, reg.layout.page_size)
