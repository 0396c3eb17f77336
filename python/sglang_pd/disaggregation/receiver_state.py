"""Decode's side of one room's KV transfer: a pure state machine (state.py says how it is driven).

Bootstrapping -> WaitingForInput -> Transferring -> Success, or Failed from any of them; after a
local failure the room's pages stay quarantined until no prefill write can still land.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sglang_pd.disaggregation.messages import Abort, Message
from sglang_pd.disaggregation.state import Failure


class ReceiverPhase(enum.Enum):
    BOOTSTRAPPING = "Bootstrapping"  # Register sent, no ack yet
    WAITING_FOR_INPUT = "WaitingForInput"  # prefill accepted; KV not written yet
    TRANSFERRING = "Transferring"  # some chunks landed, not the last
    SUCCESS = "Success"
    FAILED = "Failed"


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
