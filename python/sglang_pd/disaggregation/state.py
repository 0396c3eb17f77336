"""Pure per-request state machines for PD KV transfer (no torch, no sockets).

The engine owns one ``KVSenderState`` (prefill) or ``KVReceiverState``
(decode) per bootstrap room, feeds it events through the ``on_*`` methods,
calls ``check_timeouts(now)`` once per loop iteration, and sends whatever
``take_outbox()`` returns to the peer. Time is always passed in, so the
machines are deterministic under test.

Decode:  Bootstrapping -> WaitingForInput -> Transferring -> Success
                     \\_____________\\_______________\\____-> Failed
Prefill: WaitingForDecode -> Transferring -> Done
                     \\_______________\\____-> Failed
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sglang_pd.disaggregation.messages import Abort, AbortAck, Message


class ReceiverPhase(enum.Enum):
    BOOTSTRAPPING = "Bootstrapping"  # Register sent, no ack yet
    WAITING_FOR_INPUT = "WaitingForInput"  # prefill accepted; KV not written yet
    TRANSFERRING = "Transferring"  # some chunks landed, not the last
    SUCCESS = "Success"
    FAILED = "Failed"


class SenderPhase(enum.Enum):
    WAITING_FOR_DECODE = "WaitingForDecode"  # see .bootstrapped for registration
    TRANSFERRING = "Transferring"
    DONE = "Done"
    FAILED = "Failed"


class Failure(enum.Enum):
    BOOTSTRAP_TIMEOUT = "bootstrap_timeout"
    WAITING_TIMEOUT = "waiting_timeout"
    REFUSED = "refused"
    ABORTED_LOCAL = "aborted_local"
    ABORTED_REMOTE = "aborted_remote"
    PEER_DEAD = "peer_dead"
    TRANSFER_ERROR = "transfer_error"
    INVALID_REQUEST = "invalid_request"  # bad bootstrap address, room already in use
    UNREACHABLE = "unreachable"  # the prefill's bootstrap connection cannot take the message

    @property
    def http_status(self) -> int:
        """Suggested status for the client: 400 for its own mistake, 503 when the two sides never
        paired (bootstrap), 502 when they paired and the transfer then failed."""
        if self is Failure.INVALID_REQUEST:
            return 400
        if self in (Failure.BOOTSTRAP_TIMEOUT, Failure.REFUSED, Failure.UNREACHABLE):
            return 503
        return 502


@dataclass(frozen=True)
class RoomUpdate:
    """What a manager's poll() reports to the engine for a finished room."""

    room: int
    phase: str  # "Done"/"Failed" (prefill) or "Success"/"Failed" (decode)
    failure: Failure | None = None
    reason: str = ""
    pages_releasable: bool = True  # False: keep the pages until a later update says True
    aux: bytes = b""  # decode "Success": the aux data prefill sent with the last chunk


@dataclass
class KVReceiverState:
    """Decode side of one room. Created right after the Register is sent."""

    room: int
    created_at: float
    bootstrap_timeout: float = 300.0
    waiting_timeout: float = 300.0
    # After a local failure prefill might still be writing into our pages; we keep them
    # quarantined until it confirms nothing is in flight (AbortAck, or its own Abort), it is
    # declared dead, or this last-resort bound passes. It must exceed the longest a live
    # prefill can keep writing (DisaggEnvs.quarantine_limit, 615 s by default); a short grace
    # would free pages that a slow but live prefill still writes into.
    abort_grace: float = 615.0
    abort_resend: float = 5.0  # re-send Abort this often while quarantined (lost or restarted)
    # Pages registered for this room. When set, Success also needs the page slices announced by
    # chunks 0..last to cover [0, num_pages): a room is never decoded from pages nobody wrote.
    num_pages: int | None = None
    phase: ReceiverPhase = ReceiverPhase.BOOTSTRAPPING
    acked_at: float | None = None
    last_progress_at: float | None = None
    chunks: set[int] = field(default_factory=set)
    chunk_pages: dict[int, tuple[int, int]] = field(default_factory=dict)
    last_chunk: int | None = None
    duplicates: int = 0  # repeated completion notices (ignored)
    failure: Failure | None = None
    reason: str = ""
    release_at: float | None = None  # quarantine end; None = releasable now
    next_abort_at: float | None = None  # when to re-send Abort while quarantined
    _outbox: list[Message] = field(default_factory=list)

    @property
    def is_finished(self) -> bool:
        return self.phase in (ReceiverPhase.SUCCESS, ReceiverPhase.FAILED)

    def pages_releasable(self, now: float) -> bool:
        """True once no prefill write into this room's pages can still land."""
        if self.phase is ReceiverPhase.SUCCESS:
            return True
        if self.phase is not ReceiverPhase.FAILED:
            return False
        return self.release_at is None or now >= self.release_at

    def take_outbox(self) -> list[Message]:
        out, self._outbox = self._outbox, []
        return out

    def on_ack(self, now: float) -> bool:
        if self.phase is not ReceiverPhase.BOOTSTRAPPING:
            return False  # a notif may already have moved us on
        self.phase = ReceiverPhase.WAITING_FOR_INPUT
        self.acked_at = self.last_progress_at = now
        return True

    def on_refused(self, now: float, reason: str) -> bool:
        # Refused => prefill never writes; pages are free at once.
        return self._fail(now, Failure.REFUSED, reason, quarantine=False)

    def on_kv_notif(
        self, now: float, chunk: int, last: bool, pages: tuple[int, int] | None = None
    ) -> bool:
        """A WRITE carrying chunk ``chunk`` (dst page slice ``pages``) completed (NIXL notif).

        A repeated notice is ignored. One that contradicts what this room was told (a chunk past
        the last, a second last chunk, a slice outside the registered pages, or the same chunk
        with another slice) fails the room: its pages are quarantined and prefill is told, since
        a peer that breaks the protocol may still be writing."""
        if self.is_finished:
            return False
        why = self._notif_problem(chunk, last, pages)
        if why == "duplicate":
            self.duplicates += 1
            return False
        if why is not None:
            return self._fail(now, Failure.TRANSFER_ERROR, f"room {self.room}: {why}", quarantine=True)
        # The NIXL notif can overtake the ZMQ ack; it implies the ack.
        if self.acked_at is None:
            self.acked_at = now
        self.last_progress_at = now
        self.chunks.add(chunk)
        if pages is not None:
            self.chunk_pages[chunk] = pages
        if last:
            self.last_chunk = chunk
        if self.last_chunk is None or len(self.chunks) != self.last_chunk + 1:
            self.phase = ReceiverPhase.TRANSFERRING
            return True
        missing = self._uncovered()
        if missing:
            return self._fail(
                now,
                Failure.TRANSFER_ERROR,
                f"room {self.room}: every chunk 0..{self.last_chunk} arrived but pages "
                f"{missing[:8]} of {self.num_pages} were never written",
                quarantine=True,
            )
        self.phase = ReceiverPhase.SUCCESS
        return True

    def _notif_problem(self, chunk: int, last: bool, pages: tuple[int, int] | None) -> str | None:
        if chunk in self.chunks:
            same = self.chunk_pages.get(chunk) == pages and (last == (chunk == self.last_chunk))
            return "duplicate" if same else f"chunk {chunk} announced twice, differently"
        if chunk < 0 or (self.last_chunk is not None and chunk > self.last_chunk):
            return f"chunk {chunk} is outside 0..{self.last_chunk}"
        if last and self.chunks and chunk < max(self.chunks):
            return f"last chunk {chunk} is below chunk {max(self.chunks)} that already arrived"
        if last and self.last_chunk is not None:
            return f"two last chunks ({self.last_chunk} and {chunk})"
        if self.num_pages is not None:
            lo, hi = pages if pages is not None else (0, 0)
            if not 0 <= lo < hi <= self.num_pages:
                return f"chunk {chunk} names pages [{lo}, {hi}) of {self.num_pages} registered"
        return None

    def _uncovered(self) -> list[int]:
        """Registered page indexes no arrived chunk wrote (empty when num_pages is not set)."""
        if self.num_pages is None:
            return []
        covered = [False] * self.num_pages
        for lo, hi in self.chunk_pages.values():
            covered[lo:hi] = [True] * (hi - lo)
        return [i for i, ok in enumerate(covered) if not ok]

    def on_remote_abort(self, now: float, reason: str, writes_in_flight: bool = False) -> bool:
        """Prefill failed the room. Its Abort promises no write is in flight unless
        ``writes_in_flight`` (a WRITE it could not cancel): then quarantine until its AbortAck."""
        if self.phase is ReceiverPhase.FAILED:
            if not writes_in_flight and self.release_at is not None:
                self.release_at = None  # our own abort crossed prefill's: nothing in flight
                return True
            return False
        return self._fail(
            now,
            Failure.ABORTED_REMOTE,
            f"prefill aborted room {self.room}: {reason}",
            quarantine=writes_in_flight,
            tell_prefill=False,
        )

    def on_abort_ack(self, now: float) -> bool:
        if self.phase is ReceiverPhase.FAILED and self.release_at is not None:
            self.release_at = None
            return True
        return False

    def on_peer_dead(self, now: float, reason: str) -> bool:
        if self.phase is ReceiverPhase.FAILED:
            self.release_at = None  # nobody left to write
            return False
        return self._fail(now, Failure.PEER_DEAD, reason, quarantine=False)

    def abort(self, now: float, reason: str) -> bool:
        """Local abort (client cancelled, decode OOM...). Queues Abort for prefill."""
        return self._fail(now, Failure.ABORTED_LOCAL, reason, quarantine=True)

    def check_timeouts(self, now: float) -> bool:
        if self.release_at is not None and self.phase is ReceiverPhase.FAILED:
            # Quarantined: ask again now and then, so a lost Abort or a restarted prefill
            # (which acks rooms it does not know) does not hold the pages to the last resort.
            if self.next_abort_at is not None and now >= self.next_abort_at:
                self._outbox.append(Abort(room=self.room, reason=self.reason))
                self.next_abort_at = now + self.abort_resend
            return False
        if (
            self.phase is ReceiverPhase.BOOTSTRAPPING
            and now - self.created_at > self.bootstrap_timeout
        ):
            return self._fail(
                now,
                Failure.BOOTSTRAP_TIMEOUT,
                f"room {self.room}: prefill did not accept the registration within "
                f"{self.bootstrap_timeout:g}s (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)",
                quarantine=True,
            )
        if self.phase in (ReceiverPhase.WAITING_FOR_INPUT, ReceiverPhase.TRANSFERRING):
            assert self.last_progress_at is not None
            if now - self.last_progress_at > self.waiting_timeout:
                return self._fail(
                    now,
                    Failure.WAITING_TIMEOUT,
                    f"room {self.room}: no KV from prefill within {self.waiting_timeout:g}s "
                    f"(SGLANG_DISAGGREGATION_WAITING_TIMEOUT); got chunks {sorted(self.chunks)}",
                    quarantine=True,
                )
        return False

    def _fail(
        self, now: float, kind: Failure, reason: str, quarantine: bool, tell_prefill: bool = True
    ) -> bool:
        if self.is_finished:
            return False
        self.phase = ReceiverPhase.FAILED
        self.failure, self.reason = kind, reason
        if quarantine:
            self.release_at = now + self.abort_grace
            if self.abort_resend > 0:
                self.next_abort_at = now + self.abort_resend
            if tell_prefill:
                self._outbox.append(Abort(room=self.room, reason=reason))
        return True


@dataclass
class KVSenderState:
    """Prefill side of one room. Created by whichever comes first: the request
    reaching prefill, or decode's Register."""

    room: int
    created_at: float
    bootstrap_timeout: float = 300.0
    waiting_timeout: float = 300.0  # max time a started transfer may make no progress
    phase: SenderPhase = SenderPhase.WAITING_FOR_DECODE
    registered_at: float | None = None
    claimed: bool = False  # a decode announced it holds this room (Claim); it hears failures
    num_dst_pages: int | None = None
    in_flight: set[int] = field(default_factory=set)
    # Chunks whose WRITE the transport could not cancel: they may still land in decode's pages.
    # Until they end, decode is told "writes in flight" and its AbortAck is held back.
    cancelling: set[int] = field(default_factory=set)
    cancel_since: float | None = None
    abandoned: bool = False  # gave up on an uncancellable write: never promise it ended
    last_started: bool = False  # the chunk flagged last has been posted
    last_progress_at: float | None = None
    abort_requested: str | None = None
    failure: Failure | None = None
    reason: str = ""
    _outbox: list[Message] = field(default_factory=list)

    @property
    def bootstrapped(self) -> bool:
        return self.registered_at is not None

    @property
    def is_finished(self) -> bool:
        return self.phase in (SenderPhase.DONE, SenderPhase.FAILED)

    @property
    def is_settled(self) -> bool:
        """Finished, and no write of this room can still land: the engine may free its pages."""
        return self.is_finished and not self.in_flight and not self.cancelling

    def can_send(self) -> bool:
        """Whether the engine may post another chunk now."""
        return (
            self.bootstrapped
            and not self.is_finished
            and not self.last_started
            and self.abort_requested is None
        )

    def take_outbox(self) -> list[Message]:
        """Messages for decode. While a write could not be cancelled, an Abort goes out marked
        ``writes_in_flight`` and every AbortAck waits until the write has ended."""
        if not self.cancelling:
            out, self._outbox = self._outbox, []
            return out
        out = []
        held: list[Message] = []
        for msg in self._outbox:
            if isinstance(msg, Abort):
                out.append(Abort(room=msg.room, reason=msg.reason, writes_in_flight=True))
                msg = AbortAck(room=self.room)  # noqa: PLW2901 (sent in its place) tells decode when the write has ended
            if isinstance(msg, AbortAck):
                if not held:
                    held.append(msg)
            else:
                out.append(msg)
        self._outbox = held
        return out

    def on_claim(self, now: float) -> bool:
        """A decode holds this room and will register later: tell it when the room fails."""
        if self.is_finished or self.claimed:
            return False
        self.claimed = True
        return True

    def on_cancel_failed(self, now: float, chunk: int) -> None:
        """Releasing this chunk's WRITE failed: it may still land. The engine keeps polling it
        and calls ``on_cancel_settled`` once it has ended."""
        self.in_flight.discard(chunk)
        self.cancelling.add(chunk)
        if self.cancel_since is None:
            self.cancel_since = now

    def on_cancel_settled(self, now: float, chunk: int) -> None:
        self.cancelling.discard(chunk)
        if not self.cancelling:
            self.cancel_since = None

    def on_register(self, now: float, num_dst_pages: int) -> bool:
        if self.is_finished or self.bootstrapped:
            return False
        self.registered_at = now
        self.num_dst_pages = num_dst_pages
        return True

    def check_num_pages(self, now: float, num_src_pages: int) -> bool:
        """Fail (and tell decode) if decode reserved a different number of pages."""
        if self.num_dst_pages is None or self.num_dst_pages == num_src_pages:
            return True
        self._fail(
            now,
            Failure.REFUSED,
            f"room {self.room}: decode registered {self.num_dst_pages} destination pages "
            f"but prefill holds {num_src_pages}; page_size and prompt length must agree",
            tell_decode=True,
        )
        return False

    def on_transfer_started(self, now: float, chunk: int, last: bool) -> None:
        if not self.can_send():
            raise RuntimeError(
                f"room {self.room}: cannot start chunk {chunk} in phase {self.phase.value} "
                f"(bootstrapped={self.bootstrapped}, last_started={self.last_started}, "
                f"abort_requested={self.abort_requested!r})"
            )
        self.phase = SenderPhase.TRANSFERRING
        self.in_flight.add(chunk)
        self.last_started = self.last_started or last
        self.last_progress_at = now

    def on_transfer_done(self, now: float, chunk: int) -> bool:
        if chunk not in self.in_flight:
            return False
        self.in_flight.discard(chunk)
        self.last_progress_at = now
        if self.in_flight:
            return False
        if self.abort_requested is not None:
            self._finish_abort(now)
            return True
        if self.last_started and not self.is_finished:
            self.phase = SenderPhase.DONE
            return True
        return False

    def on_transfer_error(self, now: float, chunk: int, reason: str) -> bool:
        """poll() said ERR: the peer is gone or the fabric failed; nothing in flight."""
        self.in_flight.clear()
        if self.abort_requested is not None and not self.is_finished:
            self._finish_abort(now)  # decode is waiting for the ack
            return True
        return self._fail(
            now,
            Failure.TRANSFER_ERROR,
            f"room {self.room} chunk {chunk}: {reason}",
            tell_decode=False,
        )

    def on_abort(self, now: float, reason: str) -> bool:
        """Decode asked to abort (again, perhaps). Ack only once nothing is in flight."""
        if self.is_finished:
            # Already done/failed: nothing in flight but an uncancellable write (whose ack
            # take_outbox holds back); after giving up on one, never ack.
            if not self.abandoned:
                self._outbox.append(AbortAck(room=self.room))
            return False
        self.abort_requested = reason
        if not self.in_flight:
            self._finish_abort(now)
        return True

    def on_peer_dead(self, now: float, reason: str) -> bool:
        self.in_flight.clear()
        self.cancelling.clear()  # decode is gone: nothing left to protect
        self.cancel_since = None
        return self._fail(now, Failure.PEER_DEAD, reason, tell_decode=False)

    def abort(self, now: float, reason: str) -> bool:
        """Local abort (request cancelled on prefill). The engine must release
        in-flight handles first: decode frees its pages when it hears Abort."""
        if self.in_flight:
            raise RuntimeError(
                f"room {self.room}: release in-flight chunks {sorted(self.in_flight)} "
                "before aborting, else their writes could land in freed decode pages"
            )
        return self._fail(
            now, Failure.ABORTED_LOCAL, reason, tell_decode=self.bootstrapped or self.claimed
        )

    def check_timeouts(self, now: float) -> bool:
        if self.cancelling:
            assert self.cancel_since is not None
            if now - self.cancel_since > self.waiting_timeout:
                # NIXL could neither cancel nor finish it: treat it as dead, but never tell
                # decode it ended (decode frees the pages at its own last-resort bound).
                self.cancelling.clear()
                self.cancel_since = None
                self.abandoned = True
                self._outbox = [m for m in self._outbox if not isinstance(m, AbortAck)]
                return True
        waiting = self.phase is SenderPhase.WAITING_FOR_DECODE and not self.bootstrapped
        if waiting and now - self.created_at > self.bootstrap_timeout:
            return self._fail(
                now,
                Failure.BOOTSTRAP_TIMEOUT,
                f"room {self.room}: decode did not register within {self.bootstrap_timeout:g}s "
                "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)",
                tell_decode=self.claimed,  # a claimant is waiting for pages: fail it now
            )
        if self.phase is SenderPhase.TRANSFERRING and self.in_flight:
            assert self.last_progress_at is not None
            if now - self.last_progress_at > self.waiting_timeout:
                # The engine must release the stuck handles (cancel) on seeing this.
                self.in_flight.clear()
                return self._fail(
                    now,
                    Failure.WAITING_TIMEOUT,
                    f"room {self.room}: transfer made no progress for {self.waiting_timeout:g}s",
                    tell_decode=True,
                )
        return False

    def _finish_abort(self, now: float) -> None:
        self._fail(
            now,
            Failure.ABORTED_REMOTE,
            f"decode aborted: {self.abort_requested}",
            tell_decode=False,
        )
        self._outbox.append(AbortAck(room=self.room))

    def _fail(self, now: float, kind: Failure, reason: str, tell_decode: bool) -> bool:
        if self.is_finished:
            return False
        self.phase = SenderPhase.FAILED
        self.failure, self.reason = kind, reason
        if tell_decode:
            self._outbox.append(Abort(room=self.room, reason=reason))
        return True
