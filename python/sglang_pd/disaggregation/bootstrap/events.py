"""What both ends of the bootstrap connection hand the engine from ``poll``, and the
defaults they share. See the package docstring for the protocol."""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from sglang_pd.disaggregation import messages as m

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

def zmq_ctx() -> zmq.Context:
    """The process's one ZMQ context, shared by the server and every client link."""
    return zmq.Context.instance()
