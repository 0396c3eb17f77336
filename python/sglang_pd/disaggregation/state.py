"""Pure per-request state machines for PD KV transfer (no torch, no sockets): what both share.

The engine owns one ``KVSenderState`` (prefill, sender_state.py) or ``KVReceiverState``
(decode, receiver_state.py) per bootstrap room, feeds it events through the ``on_*`` methods,
calls ``check_timeouts(now)`` once per loop iteration, and sends whatever ``take_outbox()``
returns to the peer. Time is always passed in, so the machines are deterministic under test.
Both end in a ``Failure`` kind, and their managers report a finished room as a ``RoomUpdate``.

Decode:  Bootstrapping -> WaitingForInput -> Transferring -> Success
                     \\_____________\\_______________\\____-> Failed
Prefill: WaitingForDecode -> Transferring -> Done
                     \\_______________\\____-> Failed
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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
    # prefill: pages its writes covered (decode-side reuse skips some); a count, not identity
    pages_sent: int = field(default=0, compare=False)
