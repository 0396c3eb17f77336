"""Prefill/decode disaggregation inside the engine (DESIGN.md section 2), as one hooks object.

``EngineCore`` talks to PD only through ``PDHooks``; colocated mode gets ``NullPD``. A side
never holds the engine: its calls return events (engine/pd_events.py) that the core applies,
so nothing calls back into the core while the core is calling a side. The sides hold the
``Scheduler`` only to read it and to reserve or quarantine pages (decode), and get their
transfer managers injected, so unit tests run them over ``FakeKVTransport``.

PrefillSide (engine/pd_prefill.py) and DecodeSide (engine/pd_decode.py) describe their modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sglang_pd.core.pd_rules import pages_for
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.disaggregation.state import RoomUpdate
from sglang_pd.engine.pd_events import Failed, PDEvent, Queued
from sglang_pd.engine.request import Req
from sglang_pd.protocol import FAKE_BOOTSTRAP_HOST, GenerateReq

if TYPE_CHECKING:
    import torch



class PDHooks(Protocol):
    """Every point where PD changes what the engine does. The event lists are in the order
    things happened; the core applies them before it calls the side again."""

    role: str
    # answers the poll produced go out before the next forward (decode: first tokens that came
    # with their KV; prefill: requests whose KV hand-off ended)
    flush_early: bool

    # prefill: KV of requests whose prefill just finished is still on its way; the core polls it
    # (briefly) before the next forward (EngineCore._await_handoffs)
    @property
    def handing_off(self) -> bool: ...
    def handoffs_waited(self) -> None: ...  # the core waited for them: never again for these

    @property
    def has_pending(self) -> bool: ...  # transfers or bootstrap traffic to poll for
    def admit(self, req: Req, msg: GenerateReq, now: float) -> PDEvent | str: ...  # or error text
    def poll(self, now: float) -> list[PDEvent]: ...
    def on_chunk(self, req: Req, now: float) -> list[PDEvent]: ...  # a prefill chunk (not the last) ran
    # the first token was sampled here: [] = the engine goes on (stream, stop-check) as usual
    def on_first_token(self, req: Req, logprob: float | None, top: list | None,
                       now: float) -> list[PDEvent]: ...
    def abort(self, req: Req, now: float) -> None: ...  # before the engine finishes it
    def forget(self, req: Req) -> None: ...  # after the engine finished it
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass
class NullPD:
    """Colocated mode: requests go straight to the waiting queue; nothing else happens."""

    role: str = "colocated"
    flush_early: bool = False
    has_pending: bool = False
    handing_off: bool = False

    def handoffs_waited(self) -> None:
        pass

    def admit(self, req: Req, msg: GenerateReq, now: float) -> PDEvent | str:
        return Queued(req)

    def poll(self, now: float) -> list[PDEvent]:
        return []

    def on_chunk(self, req: Req, now: float) -> list[PDEvent]:
        return []

    def on_first_token(self, req: Req, logprob: float | None, top: list | None,
                       now: float) -> list[PDEvent]:
        return []

    def abort(self, req: Req, now: float) -> None:
        pass

    def forget(self, req: Req) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


@dataclass
class TransferStats:
    bootstrap_failed: int = 0
    transfer_failed: int = 0
    last_speed_gb_s: float = 0.0
    last_latency_ms: float = 0.0

    def failed(self, req: Req, update: RoomUpdate) -> Failed:
        """Count the failure and say how the request ends."""
        status = failure_status(update)
        if status == 503:  # never bootstrapped: timeout, refused, unreachable
            self.bootstrap_failed += 1
        else:
            self.transfer_failed += 1
        return Failed(req, f"KV transfer failed: {update.reason}", status)

    def as_dict(self) -> dict[str, int | float]:
        return {"num_bootstrap_failed_reqs_total": self.bootstrap_failed,
                "num_transfer_failed_reqs_total": self.transfer_failed}


def runs_locally(msg: GenerateReq) -> bool:
    """/health_generate on a PD server: computed here like a colocated request, no transfer."""
    return msg.bootstrap is not None and msg.bootstrap.host == FAKE_BOOTSTRAP_HOST


def room_error(msg: GenerateReq) -> str | None:
    b = msg.bootstrap
    if b is None:
        return "this server runs in PD mode: requests need bootstrap_host, bootstrap_port and bootstrap_room"
    if not 0 <= b.room < 2**63:
        return f"bootstrap_room must be a 63-bit non-negative integer, got {b.room}"
    return None


def failure_status(update: RoomUpdate) -> int:
    return update.failure.http_status if update.failure is not None else 502


def create_pd_hooks(mode: str, scheduler: Scheduler, page_size: int, kv_buffer: torch.Tensor,
                    host: str, bootstrap_port: int, num_reserved_decode_tokens: int,
                    max_running: int, runner: Any, tp_size: int, num_kv_heads: int) -> PDHooks:
    """The hooks for ``--mode``. PD modes: every rank of the server (``tp_size``, 1 included)
    has its own NIXL agent over its own pool and writes its own KV heads (engine/tp/rank_kv.py,
    docs/disaggregation.md section 11); ``runner`` is rank 0's, through which the other ranks
    are reached once they attach."""
    if mode == "colocated":
        return NullPD()
    import os

    from sglang_pd.disaggregation.envs import DisaggEnvs
    from sglang_pd.disaggregation.tp_sides import RankReceiverManager, RankSenderManager
    from sglang_pd.disaggregation.transfer.faults import maybe_wrap
    from sglang_pd.engine.tp.rank_kv import RankKV, TPLink
    from sglang_pd.engine.tp.rank_writer import RankWriteTransport

    link = TPLink(runner, RankKV.create(mode, 0, kv_buffer), tp_size)
    envs = DisaggEnvs.load()
    if mode == "prefill":
        from sglang_pd.engine.pd_prefill import PrefillSide

        writer = RankWriteTransport(link, num_kv_heads)
        transport = maybe_wrap(writer, dict(os.environ))  # fault-injection tests only
        return PrefillSide(scheduler, page_size, RankSenderManager(
            transport, writer, envs=envs, bootstrap_host=host, bootstrap_port=bootstrap_port))
    from sglang_pd.engine.pd_decode import DecodeSide

    mgr = RankReceiverManager(maybe_wrap(link.kv.transport, dict(os.environ)), link, num_kv_heads,
                              envs=envs)
    return DecodeSide(scheduler, page_size, mgr,
                      reserved_pages=pages_for(num_reserved_decode_tokens, page_size),
                      max_running=max_running)
