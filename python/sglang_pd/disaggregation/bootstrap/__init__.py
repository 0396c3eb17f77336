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

from sglang_pd.disaggregation.bootstrap.client import BootstrapClient
from sglang_pd.disaggregation.bootstrap.events import (
    DEFAULT_BOOTSTRAP_PORT,
    MAX_QUEUED_PER_PEER,
    Event,
    Incoming,
    PeerDead,
    Refused,
)
from sglang_pd.disaggregation.bootstrap.server import BootstrapServer

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "MAX_QUEUED_PER_PEER",
    "BootstrapClient",
    "BootstrapServer",
    "Event",
    "Incoming",
    "PeerDead",
    "Refused",
]
