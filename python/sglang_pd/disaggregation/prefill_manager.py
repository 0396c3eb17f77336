"""Prefill-side glue: bootstrap server + KV transport + one KVSenderState per room.

The engine calls, from its loop thread only:
  room_in_use(room) -> bool                 at admission: refuse a duplicate room
  expect(room, now)                         request admitted, waiting for decode (see below)
  decode_registered(room) -> bool           has decode registered its destination pages?
  take_registered() -> list[int]            expected rooms decode registered since the last call
  add_request(room, src_pages, now)         first chunk: pages allocated (None, or a Failed
                                            RoomUpdate when the room is still in use)
  kv_ready(room, num_pages, last, now)      after a (chunked) prefill step filled pages
  abort(room, reason, now)                  request cancelled on prefill (its client left)
  poll(now) -> list[RoomUpdate]             every iteration; reported rooms free their pages

No per-room problem raises out of these. A room is reported once, when it is finished and no
write of it can still land (a WRITE the transport could not cancel is polled until it ends).
A room fails as soon as the decode that registered or claimed it stops heartbeating.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.bootstrap import (
    DEFAULT_BOOTSTRAP_PORT,
    BootstrapServer,
    Incoming,
    PeerDead,
    Refused,
)
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.sender_state import KVSenderState, SenderPhase
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.disaggregation.transfer.base import KVTransport, TransferError, TransferHandle

logger = logging.getLogger(__name__)

CLOSED_ROOMS_KEPT = 4096  # finished rooms remembered, to refuse a late Register at once


@dataclass
class _Room:
    state: KVSenderState
    src_pages: list[int] | None = None
    client_id: str | None = None
    peer: str | None = None
    dst_pages: list[int] = field(default_factory=list)
    # leading src pages decode already holds (Register.prefix_len): never sent; dst_pages[i]
    # receives src_pages[skip + i] (disaggregation/decode_reuse.py)
    skip: int = 0
    ready: int = 0  # pages filled by prefill so far
    sent: int = 0  # pages already posted
    ready_last: bool = False
    aux: bytes = b""  # sent with the last chunk's notification
    expected: bool = False  # the engine holds this request (queued), pages not yet allocated
    chunk: int = 0
    handles: dict[int, TransferHandle] = field(default_factory=dict)
    cancelling: dict[int, TransferHandle] = field(default_factory=dict)  # release() failed


class KVSenderManager:
    def __init__(
        self,
        transport: KVTransport,
        server: BootstrapServer | None = None,
        envs: DisaggEnvs | None = None,
        *,
        bootstrap_host: str = "0.0.0.0",
        bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT,
    ) -> None:
        self.transport = transport
        self.envs = envs or DisaggEnvs.load()
        self.server = server or BootstrapServer(
            bootstrap_host,
            bootstrap_port,
            local_layout=transport.layout,
            heartbeat_interval=self.envs.heartbeat_interval,
            heartbeat_max_failure=self.envs.heartbeat_max_failure,
        )
        self.rooms: dict[int, _Room] = {}
        self._client_peer: dict[str, str] = {}  # decode client_id -> its NIXL agent name
        # room -> why it closed. A decode that registers only after prefill gave up on the room
        # (e.g. it waited for free pages past the bootstrap timeout) is refused at once, instead
        # of being acked and left waiting for a request that is gone.
        self._closed: OrderedDict[int, str] = OrderedDict()
        self._abandoned: set[int] = set()  # closed rooms with a write that may still land
        # expected rooms whose decode registered since take_registered(): the engine makes
        # their requests schedulable (core/pd_rules.py: prefill_schedulable)
        self._registered: list[int] = []
        # what the transfers moved, for /get_load: pages written, and prompt pages not sent
        # because the decode already held them (decode-side reuse)
        self.pages_sent_total = 0
        self.pages_skipped_total = 0

    def _room(self, room: int, now: float) -> _Room:
        r = self.rooms.get(room)
        if r is None:
            st = KVSenderState(room, now, self.envs.bootstrap_timeout, self.envs.waiting_timeout)
            r = self.rooms[room] = _Room(st)
        return r

    @property
    def has_pending(self) -> bool:
        """Rooms still open or bootstrap events waiting: the engine should keep calling poll()."""
        return bool(self.rooms) or self.server.has_events()

    def room_in_use(self, room: int) -> bool:
        """Whether an earlier request with ``room`` is still held here (queued, computing,
        transferring, or failed but not yet reported). A new request with it must be refused.
        A room that only a decode's Register or Claim created is not in use."""
        r = self.rooms.get(room)
        return r is not None and (r.expected or r.src_pages is not None)

    def add_request(self, room: int, src_pages: list[int], now: float) -> RoomUpdate | None:
        """None, or (room still used by an earlier request) a Failed update: nothing is held
        for this call and poll() will not report it; the engine fails the request itself."""
        r = self.rooms.get(room)
        if r is not None and r.src_pages is not None:
            return RoomUpdate(
                room, "Failed", Failure.INVALID_REQUEST,
                f"bootstrap_room {room} is still in use on this prefill server; "
                "bootstrap_room must be unique per request",
            )
        self._closed.pop(room, None)  # a new request reusing the number starts afresh
        self._abandoned.discard(room)
        r = self._room(room, now)
        r.src_pages = list(src_pages)
        r.state.check_num_pages(now, len(src_pages))
        return None

    def expect(self, room: int, now: float) -> None:
        """The engine holds this room's request (waiting for decode, or queued): a decode
        registering before its first chunk has run is waiting on prefill, not on a request
        that never came. Decode not registering within the bootstrap timeout fails the room."""
        self._room(room, now).expected = True

    def decode_registered(self, room: int) -> bool:
        """Whether a decode has registered its destination pages for ``room`` (and the room has
        not failed since): its request may be scheduled."""
        r = self.rooms.get(room)
        return r is not None and r.state.bootstrapped and not r.state.is_finished

    def take_registered(self) -> list[int]:
        """Expected rooms (request held, no pages yet) whose decode registered since the last
        call. A room may have failed since: check ``decode_registered``."""
        out, self._registered = self._registered, []
        return out

    def kv_ready(self, room: int, num_pages: int, last: bool, now: float, aux: bytes = b"") -> None:
        """The first ``num_pages`` of src_pages now hold final KV (all of them when ``last``);
        ``aux`` (with ``last``) travels in the final notification."""
        r = self.rooms.get(room)
        if r is None:
            return  # already finished (e.g. decode aborted); poll() reported it
        if r.src_pages is None:
            raise KeyError(f"room {room}: kv_ready before add_request")
        r.ready = len(r.src_pages) if last else max(r.ready, min(num_pages, len(r.src_pages)))
        r.ready_last = r.ready_last or last
        if last:
            r.aux = aux

    def abort(self, room: int, reason: str, now: float) -> None:
        """Cancel the room: its writes are cancelled and its decode told. Use it too when the
        request's client left; poll() then reports the room Failed."""
        r = self.rooms.get(room)
        if r is None:
            return
        self._release_all(r, now)
        r.state.abort(now, reason)

    def poll(self, now: float) -> list[RoomUpdate]:
        for ev in self.server.poll(now):
            self._on_event(ev, now)
        for r in self.rooms.values():
            self._progress(r, now)
        updates: list[RoomUpdate] = []
        for room, r in list(self.rooms.items()):
            if r.state.check_timeouts(now) or (r.state.phase is SenderPhase.FAILED and r.handles):
                self._release_all(r, now)  # cancel timed-out writes before decode hears Abort
            if r.cancelling and not r.state.cancelling:  # gave up (or the decode died)
                if r.state.abandoned:
                    logger.error(
                        "room %d: %d WRITE(s) into decode's pages could neither be cancelled nor "
                        "finish within %gs; giving up on them (decode frees those pages only at "
                        "its own bound)", room, len(r.cancelling), self.envs.waiting_timeout,
                    )
                r.cancelling.clear()
            st = r.state
            if r.src_pages is None and not r.expected and st.bootstrapped and not st.is_finished:
                assert r.state.registered_at is not None
                if now - r.state.registered_at > self.envs.bootstrap_timeout:
                    r.state.abort(
                        now, f"room {room}: decode registered but the request never reached prefill"
                    )
            for msg in r.state.take_outbox():
                if r.client_id is not None:
                    self.server.send(r.client_id, msg)
            if r.state.is_settled and not r.handles and not r.cancelling:
                st = r.state
                updates.append(RoomUpdate(room, st.phase.value, st.failure, st.reason,
                                          pages_sent=r.sent - r.skip))
                del self.rooms[room]
                self._closed[room] = st.reason or f"its transfer already ended ({st.phase.value})"
                if st.abandoned:
                    self._abandoned.add(room)
                while len(self._closed) > CLOSED_ROOMS_KEPT:
                    self._abandoned.discard(self._closed.popitem(last=False)[0])
        return updates

    def _on_event(self, ev: Incoming | Refused | PeerDead, now: float) -> None:
        if isinstance(ev, Refused):
            logger.warning(
                "refused registration from %s room %d: %s", ev.client_id, ev.room, ev.reason
            )
        elif isinstance(ev, PeerDead):
            for room, r in self.rooms.items():
                if r.client_id == ev.peer:
                    logger.warning("room %d: %s; failing it", room, ev.reason)
                    self._release_all(r, now)
                    r.cancelling.clear()  # its pages are gone with it
                    r.state.on_peer_dead(now, ev.reason)
            peer = self._client_peer.pop(ev.peer, None)
            if peer is not None:  # drop its UCX endpoint and remote descriptor list
                self.transport.remove_peer(peer)
        elif isinstance(ev.msg, m.Register):
            self._on_register(ev.peer, ev.msg, now)
        elif isinstance(ev.msg, m.Claim):
            self._on_claim(ev.peer, ev.msg, now)
        elif isinstance(ev.msg, m.Abort):
            ar = self.rooms.get(ev.msg.room)
            if ar is None:  # unknown or already finished and forgotten: nothing in flight
                if ev.msg.room not in self._abandoned:  # (unless a write was given up on)
                    self.server.send(ev.peer, m.AbortAck(room=ev.msg.room))
            elif ar.client_id not in (None, ev.peer):
                logger.warning(
                    "room %d: ignoring Abort from %s; the room belongs to %s",
                    ev.msg.room, ev.peer, ar.client_id,
                )
            else:
                ar.client_id = ev.peer
                ar.state.on_abort(now, ev.msg.reason)

    def _on_claim(self, client_id: str, claim: m.Claim, now: float) -> None:
        # a claim this room cannot take is refused like a Register (decode answers 503: the
        # client may retry with a new room), not aborted as a transfer gone wrong (502)
        r = self._open_room(client_id, claim.room, now)
        if r is None:
            return
        why = None
        if r.state.is_finished:  # failed, not yet reported: the claimant need not wait
            why = r.state.reason or f"room {claim.room} already ended on this prefill"
        elif r.client_id not in (None, client_id):
            why = f"room {claim.room} is already held by another decode ({r.client_id})"
        if why is not None:
            self.server.send(client_id, m.RegisterRefused(claim.room, why))
            return
        r.client_id = client_id
        r.state.on_claim(now)

    def _open_room(self, client_id: str, room: int, now: float) -> _Room | None:
        """The room a Claim or Register is for, or None after refusing one already closed."""
        closed = self._closed.get(room)
        if closed is not None and room not in self.rooms:
            why = f"room {room} is already closed on this prefill: {closed}"
            self.server.send(client_id, m.RegisterRefused(room, why))
            return None
        return self._room(room, now)

    def _on_register(self, client_id: str, reg: m.Register, now: float) -> None:
        r = self._open_room(client_id, reg.room, now)
        if r is None:
            return
        if r.state.bootstrapped or r.state.is_finished or r.client_id not in (None, client_id):
            why = r.state.reason or (
                f"room {reg.room} is already registered"
                if r.state.bootstrapped
                else f"room {reg.room} is already held by another decode ({r.client_id})"
            )
            self.server.send(client_id, m.RegisterRefused(reg.room, why))
            return
        try:
            peer = self._add_peer(reg)
        except TransferError as e:
            self.server.send(client_id, m.RegisterRefused(reg.room, f"room {reg.room}: {e}"))
            return
        r.client_id, r.peer, r.dst_pages = client_id, peer, list(reg.dst_pages)
        r.skip = r.sent = reg.prefix_len // reg.layout.page_size  # bootstrap server checked it
        self._client_peer[client_id] = peer
        r.state.on_register(now, r.skip + len(reg.dst_pages))
        if r.src_pages is None or r.state.check_num_pages(now, len(r.src_pages)):
            self.server.send(client_id, m.RegisterAck(reg.room, self.transport.agent_name,
                                                      tp_size=getattr(self, "tp_size", 1)))
            if r.expected and r.src_pages is None:
                self._registered.append(reg.room)

    def _add_peer(self, reg: m.Register) -> str:
        """Load the registering decode's agent (tp_sides.py: every rank's, with TP)."""
        return self.transport.add_peer(reg.agent_metadata, reg.layout)

    def _progress(self, r: _Room, now: float) -> None:
        for chunk, h in list(r.cancelling.items()):  # ended, or cancellable at last?
            if self.transport.poll(h) != "PROC" or self.transport.release(h):
                del r.cancelling[chunk]
                r.state.on_cancel_settled(now, chunk)
        for chunk, h in list(r.handles.items()):
            status = self.transport.poll(h)
            if status == "DONE":
                del r.handles[chunk]
                r.state.on_transfer_done(now, chunk)
            elif status == "ERR":
                del r.handles[chunk]
                self._release_all(r, now)
                r.state.on_transfer_error(now, chunk, h.error)
                return
        if r.src_pages is None or r.peer is None or not r.state.can_send():
            return
        if r.ready > r.sent or (r.ready_last and r.sent == len(r.src_pages)):
            last = r.ready_last and r.ready == len(r.src_pages)
            chunk = r.chunk
            lo, hi = r.sent, r.ready
            if hi == lo:  # nothing new but the last flag: the final chunk was empty
                lo = hi - 1  # resend the last page so the notif still travels with data
            d_lo, d_hi = lo - r.skip, hi - r.skip  # slices of dst_pages (skip < every hi)
            try:
                h = self.transport.write_pages(
                    r.peer,
                    r.src_pages[lo:hi],
                    r.dst_pages[d_lo:d_hi],
                    m.kv_notif(r.state.room, chunk, last, r.aux if last else b"",
                               pages=(d_lo, d_hi)),
                )
            except (ValueError, TransferError) as e:  # bad pages, or the peer was removed
                logger.error("room %d: posting chunk %d failed: %s", r.state.room, chunk, e)
                self._release_all(r, now)
                r.state.on_transfer_error(now, chunk, f"{type(e).__name__}: {e}")
                return
            r.state.on_transfer_started(now, chunk, last)
            r.chunk, r.sent = chunk + 1, hi
            self.pages_sent_total += d_hi - d_lo
            if last:
                self.pages_skipped_total += r.skip
            if h.status == "ERR":
                r.state.on_transfer_error(now, chunk, h.error)
            else:
                r.handles[chunk] = h

    def _release_all(self, r: _Room, now: float) -> None:
        """Cancel the room's writes. One the transport cannot cancel may still land: it stays
        tracked (``cancelling``) and decode is told so, until it ends."""
        for chunk, h in r.handles.items():
            if not self.transport.release(h):
                logger.warning(
                    "room %d: could not cancel the WRITE of chunk %d to %s; it may still land, "
                    "so its decode pages stay quarantined until it ends",
                    r.state.room, chunk, h.peer,
                )
                r.cancelling[chunk] = h
                r.state.on_cancel_failed(now, chunk)
        r.handles.clear()
        r.state.in_flight.clear()

    def close(self) -> None:
        for r in self.rooms.values():
            self._release_all(r, time.monotonic())
        self.server.close()
