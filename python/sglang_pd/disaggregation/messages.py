"""Wire messages of the bootstrap protocol (msgpack via msgspec; never pickle).

Control messages travel over the bootstrap ZMQ connection (decode DEALER ->
prefill ROUTER, replies back on the same connection). KV completion travels
as a NIXL notification attached to the WRITE itself, so it can never overtake
the data it announces; its bytes are built by ``kv_notif``.
"""

from __future__ import annotations

import msgspec

from sglang_pd.disaggregation.kv_layout import KVLayout

PROTOCOL_VERSION = 1


class RankAgent(msgspec.Struct, frozen=True):
    """One decode rank's NIXL agent and its own KV pool (its KV heads only): where prefill
    ranks write that rank's heads (PD with TP, docs/disaggregation.md section 11)."""

    agent_name: str
    agent_metadata: bytes
    layout: KVLayout


class Register(msgspec.Struct, tag="register", frozen=True):
    """decode -> prefill: "write room's KV into these pages of mine"."""

    room: int
    # Decode's notification endpoint: the ZMQ routing id of its bootstrap
    # client. Prefill addresses acks/aborts for this room to it; it is stable
    # across reconnects, unlike a ROUTER-assigned identity.
    client_id: str
    agent_name: str
    agent_metadata: bytes
    layout: KVLayout
    dst_pages: list[int]
    version: int = PROTOCOL_VERSION
    # decode's --tp-size: prefill maps KV heads per decode server from it (tp_mapping.py)
    tp_size: int = 1
    # Leading prompt tokens (whole pages) decode already holds in its own prefix cache:
    # dst_pages receive the prompt's pages from prefix_len / page_size on (decode_reuse.py).
    prefix_len: int = 0
    # PD with TP: every decode rank's agent, indexed by rank (ranks[0] is the agent above).
    # Empty (a TP-1 or older decode): the agent above holds all KV heads.
    ranks: list[RankAgent] = []


class Claim(msgspec.Struct, tag="claim", frozen=True):
    """decode -> prefill: "I hold a request for room; my Register follows once its pages are
    free". Sent at admission, so prefill knows which decode a queued room belongs to: if that
    decode's heartbeats stop (or it aborts the room) prefill fails the room at once instead of
    waiting out its bootstrap timeout. Prefill answers only with Abort (room already closed)."""

    room: int
    client_id: str


class RegisterAck(msgspec.Struct, tag="register_ack", frozen=True):
    room: int
    prefill_agent_name: str
    # prefill's --tp-size: decode derives from it which prefill ranks write into which of its
    # ranks (tp_mapping.head_mapping), to know when every rank's writes have landed
    tp_size: int = 1


class RegisterRefused(msgspec.Struct, tag="register_refused", frozen=True):
    room: int
    reason: str


class Heartbeat(msgspec.Struct, tag="heartbeat", frozen=True):
    seq: int
    sent_at: float


class HeartbeatAck(msgspec.Struct, tag="heartbeat_ack", frozen=True):
    seq: int
    sent_at: float


class Abort(msgspec.Struct, tag="abort", frozen=True):
    """Either direction. From prefill it also promises no write is in flight, unless
    ``writes_in_flight``: a WRITE could not be cancelled, so decode keeps the room's pages
    quarantined until the AbortAck that prefill sends once the write has ended."""

    room: int
    reason: str
    writes_in_flight: bool = False


class AbortAck(msgspec.Struct, tag="abort_ack", frozen=True):
    """prefill -> decode: no write into room's pages is or will be in flight."""

    room: int


Message = (
    Register | Claim | RegisterAck | RegisterRefused | Heartbeat | HeartbeatAck | Abort | AbortAck
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """Raises msgspec.DecodeError / ValidationError on garbage or a bad layout."""
    return _decoder.decode(data)


class KVNotif(msgspec.Struct, frozen=True):
    room: int
    chunk: int
    last: bool
    aux: bytes = b""  # on the last chunk: the engine's aux data (first token, its logprob)
    # The slice [lo, hi) of decode's registered dst_pages this WRITE filled. Decode checks that
    # the slices of chunks 0..last cover every page before it decodes (never from stale pages).
    pages: tuple[int, int] = (0, 0)


_NOTIF_PREFIX = b"kv|"


def kv_notif(
    room: int, chunk: int, last: bool, aux: bytes = b"", *, pages: tuple[int, int] = (0, 0)
) -> bytes:
    """``kv|room|chunk|last|lo:hi[|aux]``. aux rides with the last WRITE's notification, so decode
    can never see it before the KV."""
    head = b"kv|%d|%d|%d|%d:%d" % (room, chunk, 1 if last else 0, pages[0], pages[1])
    return head + (b"|" + aux if aux else b"")


def parse_kv_notif(data: bytes) -> KVNotif | None:
    """None for notifications that are not well-formed KV-completion tags."""
    if not data.startswith(_NOTIF_PREFIX):
        return None
    parts = data.split(b"|", 5)  # aux (binary, may contain "|") is everything after the 5th bar
    if len(parts) not in (5, 6) or parts[3] not in (b"0", b"1"):
        return None
    try:
        lo, hi = (int(x) for x in parts[4].split(b":"))
        aux = parts[5] if len(parts) == 6 else b""
        return KVNotif(int(parts[1]), int(parts[2]), parts[3] == b"1", aux, (lo, hi))
    except ValueError:
        return None
