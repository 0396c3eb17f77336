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
    # After a local failure prefill might still be writing into our pages; we
    # keep them quarantined until it acks the abort, is declared dead, or this
    # grace passes (default = heartbeat_interval * (max_failure + 1) = 15 s:
    # a dead prefill would have been detected by then).
    abort_grace: float = 15.0
    phase: ReceiverPhase = ReceiverPhase.BOOTSTRAPPING
    acked_at: float | None = None
    last_progress_at: float | None = None
    chunks: set[int] = field(default_factory=set)
    last_chunk: int | None = None
    failure: Failure | None = None
    reason: str = ""
    release_at: float | None = None  # quarantine end; None = releasable now
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

    def on_kv_notif(self, now: float, chunk: int, last: bool) -> bool:
        """A WRITE carrying chunk ``chunk`` completed (NIXL notif)."""
        if self.is_finished:
            return False
        # The NIXL notif can overtake the ZMQ ack; it implies the ack.
        if self.acked_at is None:
            self.acked_at = now
        self.last_progress_at = now
        self.chunks.add(chunk)
        if last:
            self.last_chunk = chunk
        if self.last_chunk is not None and len(self.chunks) == self.last_chunk + 1:
            self.phase = ReceiverPhase.SUCCESS
        else:
            self.phase = ReceiverPhase.TRANSFERRING
        return True

    def on_remote_abort(self, now: float, reason: str) -> bool:
        # Prefill sends Abort only with no write in flight: no quarantine.
        return self._fail(
            now,
            Failure.ABORTED_REMOTE,
            f"prefill aborted room {self.room}: {reason}",
            quarantine=False,
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

    def _fail(self, now: float, kind: Failure, reason: str, quarantine: bool) -> bool:
        if self.is_finished:
            return False
        self.phase = ReceiverPhase.FAILED
        self.failure, self.reason = kind, reason
        if quarantine:
            self.release_at = now + self.abort_grace
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
    num_dst_pages: int | None = None
    in_flight: set[int] = field(default_factory=set)
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

    def can_send(self) -> bool:
        """Whether the engine may post another chunk now."""
        return (
            self.bootstrapped
            and not self.is_finished
            and not self.last_started
            and self.abort_requested is None
        )

    def take_outbox(self) -> list[Message]:
        out, self._outbox = self._outbox, []
        return out

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
        """Decode asked to abort. Ack only once nothing is in flight."""
        if self.is_finished:
            # Already done/failed: nothing can be in flight, ack right away.
            self._outbox.append(AbortAck(room=self.room))
            return False
        self.abort_requested = reason
        if not self.in_flight:
            self._finish_abort(now)
        return True

    def on_peer_dead(self, now: float, reason: str) -> bool:
        self.in_flight.clear()
        return self._fail(now, Failure.PEER_DEAD, reason, tell_decode=False)

    def abort(self, now: float, reason: str) -> bool:
        """Local abort (request cancelled on prefill). The engine must release
        in-flight handles first: decode frees its pages when it hears Abort."""
        if self.in_flight:
            raise RuntimeError(
                f"room {self.room}: release in-flight chunks {sorted(self.in_flight)} "
                "before aborting, else their writes could land in freed decode pages"
            )
        return self._fail(now, Failure.ABORTED_LOCAL, reason, tell_decode=self.bootstrapped)

    def check_timeouts(self, now: float) -> bool:
        waiting = self.phase is SenderPhase.WAITING_FOR_DECODE and not self.bootstrapped
        if waiting and now - self.created_at > self.bootstrap_timeout:
            return self._fail(
                now,
                Failure.BOOTSTRAP_TIMEOUT,
                f"room {self.room}: decode did not register within {self.bootstrap_timeout:g}s "
                "(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)",
                tell_decode=False,
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
