"""What the PD sides tell the engine: typed events, applied by ``EngineCore`` alone.

The sides (engine/pd_prefill.py, engine/pd_decode.py) decide and keep their own books; they
never hold the engine. Every change to a request's place in the scheduler or to its answer
comes back from ``admit`` / ``poll`` / ``on_chunk`` / ``on_first_token`` as one of these, in
the order it happened, and the core applies them (``EngineCore._apply``). Pages are the
exception: decode reserves and quarantines them itself (core/scheduler_queues.py), because it must
know them before it registers them with the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from sglang_pd.engine.request import Req


class FirstTokenAux(msgspec.Struct, array_like=True):
    """What prefill hands decode besides the KV: the first output token."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[float, int]] | None = None


@dataclass(frozen=True)
class Queued:
    """Joins the waiting queue (admission: colocated, local, or decode registered first)."""

    req: Req


@dataclass(frozen=True)
class Parked:
    """Held outside the queues with its pages: waiting for its decode (prefill admission), for
    pages (decode admission), or for its KV to be sent (prefill done; its first token goes with
    the KV: the engine neither streams nor stop-checks it)."""

    req: Req


@dataclass(frozen=True)
class Unparked:
    """Leaves the holding area: into the waiting queue (``first`` None: prefill, its decode has
    registered), or into the decode batch with the first token its KV came with (decode)."""

    req: Req
    first: FirstTokenAux | None = None


@dataclass(frozen=True)
class Finished:
    """Done here: prefill's KV reached decode (its client gets the first token's answer)."""

    req: Req
    reason: dict


@dataclass(frozen=True)
class Failed:
    """The transfer (or its bootstrap) failed: answer the client with ``status``."""

    req: Req
    message: str
    status: int


PDEvent = Queued | Parked | Unparked | Finished | Failed
