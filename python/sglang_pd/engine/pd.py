"""Prefill/decode disaggregation inside the engine (DESIGN.md section 2), as one hooks object.

``EngineCore`` talks to PD only through ``PDHooks``; colocated mode gets ``NullPD``. The sides
park and unpark requests through ``Scheduler`` methods (pages stay accounted for there), and
get their transfer managers injected, so unit tests run them over ``FakeKVTransport``.

PrefillSide (``--mode prefill``): a request must carry bootstrap_host/port/room. It waits parked
without pages ("bootstrapping", not seen by the prefill policy) until its decode has registered
destination pages for its room, then joins the waiting queue (core/pd_rules.py:
prefill_schedulable; this removes the PD hold-and-wait with decode's FIFO pre-allocation). Its
prompt's pages are allocated whole at its first chunk (decode pre-allocates the same number), every
finished chunk's pages are written into decode's pages over NIXL while the next chunk computes,
and the first sampled token travels as aux data with the last write. The request is parked
with its pages until the transfer is done or failed, then answers its client.

DecodeSide (``--mode decode``): a request waits parked (no pages) until its prompt's pages
(plus --num-reserved-decode-tokens headroom) are free and fewer than --max-running-requests
are running or arriving, registers those pages with the prefill's bootstrap server, and joins
the running batch with the first token when the KV has arrived. Pages that prefill might still
be writing after a failure are quarantined until the transfer layer says they are safe.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Callable

import msgspec

from sglang_pd.core.pd_rules import decode_admits, pages_for, prefill_schedulable
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.engine.request import Req
from sglang_pd.protocol import FAKE_BOOTSTRAP_HOST, GenerateReq

if TYPE_CHECKING:
    import torch

    from sglang_pd.disaggregation.decode_manager import KVReceiverManager
    from sglang_pd.disaggregation.prefill_manager import KVSenderManager

logger = logging.getLogger(__name__)


class PDEngine(Protocol):
    """What the PD sides need of the engine."""

    scheduler: Scheduler
    page_size: int
    clock: Callable[[], float]

    def finish(self, req: Req, reason: dict, status: int = 0) -> None: ...
    def accept_token(self, req: Req, tok: int, logprob: float | None, top: list | None, now: float,
                     first: bool) -> None: ...


class PDHooks(Protocol):
    """Every point where PD changes what the engine does."""

    role: str
    flush_first_tokens_early: bool  # decode: first tokens go out before the next forward

    @property
    def has_pending(self) -> bool: ...  # transfers or bootstrap traffic to poll for
    def admit(self, req: Req, msg: GenerateReq) -> str | None: ...  # queue or park; error text
    def poll(self, now: float) -> None: ...
    def on_chunk(self, req: Req, now: float) -> None: ...  # a prefill chunk (not the last) ran
    def on_first_token(self, req: Req, logprob: float | None, top: list | None, now: float) -> bool: ...
    def abort(self, req: Req, now: float) -> None: ...  # before the engine finishes it
    def forget(self, req: Req) -> None: ...  # after the engine finished it
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass
class NullPD:
    """Colocated mode: requests go straight to the queues; nothing else happens. It holds the
    scheduler only (no engine back-reference: no cycle keeps a closed engine's KV pool alive)."""

    scheduler: Scheduler
    role: str = "colocated"
    flush_first_tokens_early: bool = False
    has_pending: bool = False

    def admit(self, req: Req, msg: GenerateReq) -> str | None:
        self.scheduler.add(req)
        return None

    def poll(self, now: float) -> None:
        pass

    def on_chunk(self, req: Req, now: float) -> None:
        pass

    def on_first_token(self, req: Req, logprob: float | None, top: list | None, now: float) -> bool:
        return False

    def abort(self, req: Req, now: float) -> None:
        pass

    def forget(self, req: Req) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class FirstTokenAux(msgspec.Struct, array_like=True):
    """What prefill hands decode besides the KV: the first output token."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[float, int]] | None = None


@dataclass
class TransferStats:
    bootstrap_failed: int = 0
    transfer_failed: int = 0
    last_speed_gb_s: float = 0.0
    last_latency_ms: float = 0.0

    def failed(self, update: RoomUpdate) -> None:
        if _failure_status(update) == 503:  # never bootstrapped: timeout, refused, unreachable
            self.bootstrap_failed += 1
        else:
            self.transfer_failed += 1

    def as_dict(self) -> dict[str, int | float]:
        return {"num_bootstrap_failed_reqs_total": self.bootstrap_failed,
                "num_transfer_failed_reqs_total": self.transfer_failed}


def _runs_locally(msg: GenerateReq) -> bool:
    """/health_generate on a PD server: computed here like a colocated request, no transfer."""
    return msg.bootstrap is not None and msg.bootstrap.host == FAKE_BOOTSTRAP_HOST


def _room_of(msg: GenerateReq) -> str | None:
    b = msg.bootstrap
    if b is None:
        return "this server runs in PD mode: requests need bootstrap_host, bootstrap_port and bootstrap_room"
    if not 0 <= b.room < 2**63:
        return f"bootstrap_room must be a 63-bit non-negative integer, got {b.room}"
    return None


def _failure_status(update: RoomUpdate) -> int:
    return update.failure.http_status if update.failure is not None else 502


def _transfer_failed(update: RoomUpdate) -> dict:
    return {"type": "abort", "message": f"KV transfer failed: {update.reason}"}


@dataclass
class PrefillSide:
    core: PDEngine
    mgr: KVSenderManager
    role: str = "prefill"
    flush_first_tokens_early: bool = False
    rooms: dict[int, Req] = field(default_factory=dict)  # every PD request on this prefill
    # parked without pages until decode registers its room (then scheduler.waiting)
    bootstrapping: dict[int, Req] = field(default_factory=dict)
    started_at: dict[int, float] = field(default_factory=dict)
    stats_: TransferStats = field(default_factory=TransferStats)

    @property
    def has_pending(self) -> bool:
        # also rooms decode registered before (or without) their request reaching us: an idle
        # engine must still answer them and time them out
        return bool(self.core.scheduler.parked) or self.mgr.has_pending

    def admit(self, req: Req, msg: GenerateReq) -> str | None:
        if _runs_locally(msg):  # nothing to send: prefill_schedulable(runs_locally=True)
            self.core.scheduler.add(req)  # bootstrap_room stays -1: no PD hook fires for it
            return None
        error, boot = _room_of(msg), msg.bootstrap
        if error is None and boot is not None and (boot.room in self.rooms or self.mgr.room_in_use(boot.room)):
            error = f"bootstrap_room {boot.room} is already in use on this prefill server"
        if error is None and boot is not None:  # (``_room_of`` found one)
            room = req.bootstrap_room = boot.room
            self.rooms[room] = req
            self.mgr.expect(room, self.core.clock())  # its bootstrap timeout counts from now
            if prefill_schedulable(self.mgr.decode_registered(room)):
                self.core.scheduler.add(req)  # decode registered first: schedulable at once
            else:
                # parked without pages: the engine's find/abort/shutdown see it, policies do not
                self.core.scheduler.park(req)
                self.bootstrapping[room] = req
        return error

    def _registered(self) -> None:
        """Requests whose decode registered its pages join the waiting queue (in arrival order:
        ``Scheduler.add``; ``req.arrival`` is unchanged, so deadlines count from arrival)."""
        sched = self.core.scheduler
        for room in self.mgr.take_registered():
            req = self.bootstrapping.get(room)
            if req is None or not prefill_schedulable(self.mgr.decode_registered(room)):
                continue  # finished meanwhile, or its room failed (poll reports it)
            del self.bootstrapping[room]
            sched.unpark(req)

    def on_chunk(self, req: Req, now: float) -> None:
        room = req.bootstrap_room
        if room < 0:
            return
        if room not in self.started_at:
            self.started_at[room] = now
            fail = self.mgr.add_request(room, list(req.pages), now)
            if fail is not None:  # the manager holds nothing for it: fail the request here
                self.stats_.failed(fail)
                self.core.finish(req, _transfer_failed(fail), status=_failure_status(fail))
                return
        self.mgr.kv_ready(room, req.kv_len // self.core.page_size, False, now)

    def on_first_token(self, req: Req, logprob: float | None, top: list | None, now: float) -> bool:
        """Prefill is complete: park the request (pages kept) and send the rest of its KV."""
        if req.bootstrap_room < 0:
            return False  # runs locally (health check): finished like a colocated request
        self.on_chunk(req, now)
        if req.finished:
            return True  # its room failed on the spot
        self.core.scheduler.park(req)
        aux = msgspec.msgpack.encode(FirstTokenAux(req.output_ids[-1], logprob, top))
        self.mgr.kv_ready(req.bootstrap_room, len(req.pages), True, now, aux)
        return True  # decode finishes or continues it

    def abort(self, req: Req, now: float) -> None:
        self.mgr.abort(req.bootstrap_room, "aborted on the prefill server", now)  # cancels writes

    def forget(self, req: Req) -> None:
        self.rooms.pop(req.bootstrap_room, None)
        self.bootstrapping.pop(req.bootstrap_room, None)
        self.started_at.pop(req.bootstrap_room, None)

    def poll(self, now: float) -> None:
        for update in self.mgr.poll(now):
            req = self.rooms.get(update.room)
            if req is None:
                continue
            if update.phase == "Done":
                self._record_speed(req.bootstrap_room, len(req.pages), now)
                self.core.finish(req, {"type": "length", "length": len(req.output_ids)})
            else:  # incl. a request still bootstrapping whose decode never registered (timeout)
                self.stats_.failed(update)
                self.core.finish(req, _transfer_failed(update), status=_failure_status(update))
        self._registered()

    def _record_speed(self, room: int, pages: int, now: float) -> None:
        """From the first chunk's hand-off to the last write's completion (overlaps compute)."""
        start = self.started_at.get(room)
        if start is None:
            return
        nbytes = pages * self.mgr.transport.layout.bytes_per_page_all_layers
        elapsed = max(now - start, 1e-6)
        self.stats_.last_latency_ms = elapsed * 1e3
        self.stats_.last_speed_gb_s = nbytes / elapsed / 1e9

    def stats(self) -> dict[str, Any]:
        inflight = len(self.core.scheduler.parked) - len(self.bootstrapping)
        return {**self.stats_.as_dict(), "num_prefill_bootstrap_queue_reqs": len(self.bootstrapping),
                "num_prefill_inflight_queue_reqs": inflight,
                "kv_transfer_speed_gb_s": self.stats_.last_speed_gb_s,
                "kv_transfer_latency_ms": self.stats_.last_latency_ms}

    def close(self) -> None:
        self.mgr.close()


@dataclass
class DecodeSide:
    core: PDEngine
    mgr: KVReceiverManager
    reserved_pages: int  # --num-reserved-decode-tokens in pages: room to decode into
    max_running: int
    role: str = "decode"
    flush_first_tokens_early: bool = True
    prealloc: deque[Req] = field(default_factory=deque)  # parked, waiting for pages
    transferring: dict[int, Req] = field(default_factory=dict)  # parked, registered, KV on its way
    stats_: TransferStats = field(default_factory=TransferStats)

    @property
    def has_pending(self) -> bool:
        return bool(self.prealloc or self.transferring or self.core.scheduler.quarantine)

    def admit(self, req: Req, msg: GenerateReq) -> str | None:
        if _runs_locally(msg):
            self.core.scheduler.add(req)
            return None
        error = _room_of(msg)
        room = msg.bootstrap.room if msg.bootstrap is not None else -1
        if error is None and (room in self.transferring or any(r.bootstrap_room == room for r in self.prealloc)):
            error = f"bootstrap_room {room} is already in use on this decode server"
        elif error is None and (room in self.core.scheduler.quarantine or self.mgr.room_in_use(room)):
            error = (f"bootstrap_room {room} belongs to an earlier request whose transfer is still "
                     f"winding down (its pages may still be written); use a new room")
        if error is not None or msg.bootstrap is None:  # (no bootstrap: ``_room_of`` said so)
            return error
        host, port = msg.bootstrap.host, msg.bootstrap.port
        fail = self.mgr.expect(room, host, port, self.core.clock())  # tells prefill who holds it
        if fail is not None:
            return fail.reason if _failure_status(fail) == 400 else f"cannot reach the prefill: {fail.reason}"
        req.bootstrap_room = room
        req.bootstrap_addr = (host, port)
        self.core.scheduler.park(req)
        self.prealloc.append(req)
        return None

    def on_chunk(self, req: Req, now: float) -> None:
        pass

    def on_first_token(self, req: Req, logprob: float | None, top: list | None, now: float) -> bool:
        return False  # decode streams and stop-checks it like any other token

    def forget(self, req: Req) -> None:
        pass  # decode keeps no per-room state past the transfer

    def abort(self, req: Req, now: float) -> None:
        if req in self.prealloc:
            self.prealloc.remove(req)
            self.mgr.abort(req.bootstrap_room, "aborted on the decode server", now)  # drops the claim
            return
        if self.transferring.pop(req.bootstrap_room, None) is not None:
            self.mgr.abort(req.bootstrap_room, "aborted on the decode server", now)
            self.core.scheduler.quarantine_pages(req.bootstrap_room, req)  # until prefill confirms

    def poll(self, now: float) -> None:
        self._preallocate(now)
        sched = self.core.scheduler
        for update in self.mgr.poll(now):
            req = self.transferring.pop(update.room, None)
            if req is not None and update.phase == "Success":
                try:
                    aux = msgspec.msgpack.decode(update.aux, type=FirstTokenAux)
                except msgspec.MsgspecError as e:  # a prefill bug: never decode without it
                    update = RoomUpdate(update.room, "Failed", Failure.TRANSFER_ERROR,  # noqa: PLW2901
                                        f"room {update.room}: unreadable first-token data ({e})")
                else:
                    self._start_decoding(req, aux, now)
                    continue
            if req is None:  # a claimed room that failed before its pages were reserved
                req = next((r for r in self.prealloc if r.bootstrap_room == update.room), None)
                if req is not None:
                    self.prealloc.remove(req)
            if req is not None:  # failed while this engine still waited on it
                self.stats_.failed(update)
                sched.quarantine_pages(update.room, req)
                self.core.finish(req, _transfer_failed(update), status=_failure_status(update))
            if update.pages_releasable:
                sched.release_quarantine(update.room)

    def _preallocate(self, now: float) -> None:
        sched = self.core.scheduler
        alloc = sched.allocator
        while self.prealloc:
            req = self.prealloc[0]
            need = pages_for(req.prompt_len, self.core.page_size)
            if not decode_admits(len(sched.running), len(self.transferring), self.max_running, need,
                                 self.reserved_pages, alloc.num_free):
                return  # FIFO: the head waits, and everything behind it (core/pd_rules.py)
            self.prealloc.popleft()
            sched.park(req, num_pages=need)
            self.transferring[req.bootstrap_room] = req
            host, port = req.bootstrap_addr
            fail = self.mgr.add_request(req.bootstrap_room, host, port, list(req.pages), now)
            if fail is not None:  # nothing was sent: no write can come, the pages are free now
                logger.warning("room %d: registering with %s:%d failed: %s", req.bootstrap_room, host,
                               port, fail.reason)
                self.transferring.pop(req.bootstrap_room, None)
                self.stats_.failed(fail)
                self.core.finish(req, _transfer_failed(fail), status=_failure_status(fail))

    def _start_decoding(self, req: Req, aux: FirstTokenAux, now: float) -> None:
        self.core.scheduler.start_running(req, kv_len=req.prompt_len)
        self.core.accept_token(req, aux.token_id, aux.logprob, aux.top_logprobs, now, first=True)

    def stats(self) -> dict[str, Any]:
        return {**self.stats_.as_dict(), "num_decode_prealloc_queue_reqs": len(self.prealloc),
                "num_decode_transfer_queue_reqs": len(self.transferring)}

    def close(self) -> None:
        self.mgr.close()


def create_pd_hooks(core: PDEngine, mode: str, kv_buffer: torch.Tensor, host: str, bootstrap_port: int,
                    num_reserved_decode_tokens: int, max_running: int) -> PDHooks:
    """The hooks for ``--mode``, with the NIXL transport for the PD modes."""
    if mode == "colocated":
        return NullPD(core.scheduler)
    import os
    import uuid

    from sglang_pd.disaggregation.envs import DisaggEnvs
    from sglang_pd.disaggregation.transfer.base import KVTransport
    from sglang_pd.disaggregation.transfer.faults import maybe_wrap
    from sglang_pd.disaggregation.transfer.nixl_transport import NixlKVTransport

    transport: KVTransport = NixlKVTransport(f"{mode}-{uuid.uuid4().hex[:12]}", kv_buffer)
    transport = maybe_wrap(transport, dict(os.environ))  # fault-injection tests only
    if mode == "prefill":
        from sglang_pd.disaggregation.prefill_manager import KVSenderManager

        return PrefillSide(core, KVSenderManager(transport, envs=DisaggEnvs.load(), bootstrap_host=host,
                                                 bootstrap_port=bootstrap_port))
    from sglang_pd.disaggregation.decode_manager import KVReceiverManager

    return DecodeSide(core, KVReceiverManager(transport, envs=DisaggEnvs.load()),
                      reserved_pages=pages_for(num_reserved_decode_tokens, core.page_size),
                      max_running=max_running)
