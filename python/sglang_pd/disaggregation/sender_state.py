"""Prefill's side of one room's KV transfer: a pure state machine (state.py says how it is driven).

WaitingForDecode -> Transferring -> Done, or Failed from either; a WRITE the transport could not
cancel keeps the room unsettled (and decode's AbortAck held back) until it ends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sglang_pd.disaggregation.messages import Abort, AbortAck, Message
from sglang_pd.disaggregation.state import Failure


class SenderPhase(enum.Enum):
    WAITING_FOR_DECODE = "WaitingForDecode"  # see .bootstrapped for registration
    TRANSFERRING = "Transferring"
    DONE = "Done"
    FAILED = "Failed"


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
