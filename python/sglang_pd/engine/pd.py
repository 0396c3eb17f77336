"""Prefill/decode disaggregation inside the engine (DESIGN.md section 2).

PrefillSide (``--mode prefill``): a request must carry bootstrap_host/port/room. Its prompt's
pages are allocated whole at its first chunk (decode pre-allocates the same number), every
finished chunk's pages are written into decode's pages over NIXL while the next chunk computes,
and the first sampled token travels as aux data with the last write. The request holds its
pages until the transfer is done or failed, then answers its client.

DecodeSide (``--mode decode``): a request waits in the pre-allocation queue until its prompt's
pages (plus --num-reserved-decode-tokens headroom) are free, registers those pages with the
prefill's bootstrap server, and joins the running batch with the first token when the KV has
arrived. Pages that prefill might still be writing after a failure are quarantined until the
transfer layer says they are safe.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.disaggregation.transfer.nixl_transport import NixlKVTransport
from sglang_pd.engine.request import Req, ReqState
from sglang_pd.protocol import GenerateReq

if TYPE_CHECKING:
    from sglang_pd.engine.engine_core import EngineCore

logger = logging.getLogger(__name__)

_BOOTSTRAP_FAILURES = {Failure.BOOTSTRAP_TIMEOUT, Failure.REFUSED}


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
        if update.failure in _BOOTSTRAP_FAILURES:
            self.bootstrap_failed += 1
        else:
            self.transfer_failed += 1


def _room_of(msg: GenerateReq) -> str | None:
    b = msg.bootstrap
    if b is None:
        return "this server runs in PD mode: requests need bootstrap_host, bootstrap_port and bootstrap_room"
    if not 0 <= b.room < 2**63:
        return f"bootstrap_room must be a 63-bit non-negative integer, got {b.room}"
    return None


@dataclass
class PrefillSide:
    core: EngineCore
    mgr: KVSenderManager = field(init=False)
    rooms: dict[int, Req] = field(default_factory=dict)  # every PD request on this prefill
    transferring: dict[int, Req] = field(default_factory=dict)  # compute done, KV in flight
    started_at: dict[int, float] = field(default_factory=dict)
    stats: TransferStats = field(default_factory=TransferStats)

    def __post_init__(self) -> None:
        args = self.core.args
        transport = NixlKVTransport(f"prefill-{uuid.uuid4().hex[:12]}", self.core.kv_pool.kv_buffer)
        self.mgr = KVSenderManager(transport, envs=DisaggEnvs.load(), bootstrap_host=args.host,
                                   bootstrap_port=args.disaggregation_bootstrap_port)

    @property
    def has_pending(self) -> bool:
        # also rooms decode registered before (or without) their request reaching us: an idle
        # engine must still answer them and time them out
        return bool(self.transferring) or self.mgr.has_pending

    def held_pages(self) -> int:
        return sum(len(r.pages) for r in self.transferring.values())

    def parked_reqs(self) -> list[Req]:
        return list(self.transferring.values())

    def admit(self, req: Req, msg: GenerateReq) -> str | None:
        error = _room_of(msg)
        if error is None and msg.bootstrap.room in self.rooms:
            error = f"bootstrap_room {msg.bootstrap.room} is already in use on this prefill server"
        if error is None:
            req.bootstrap_room = msg.bootstrap.room
            self.rooms[req.bootstrap_room] = req
            self.mgr.expect(req.bootstrap_room, self.core.clock())
        return error

    def on_chunk(self, req: Req, now: float) -> None:
        room = req.bootstrap_room
        if room not in self.started_at:
            self.started_at[room] = now
            self.mgr.add_request(room, list(req.pages), now)
        self.mgr.kv_ready(room, req.kv_len // self.core.args.page_size, False, now)

    def on_first_token(self, req: Req, logprob: float | None, top: list | None, now: float) -> None:
        """Prefill is complete: park the request (pages kept) and send the rest of its KV."""
        self.on_chunk(req, now)
        self.core.scheduler.running.remove(req)  # parked: pages kept until the transfer ends
        self.transferring[req.bootstrap_room] = req
        aux = msgspec.msgpack.encode(FirstTokenAux(req.output_ids[-1], logprob, top))
        self.mgr.kv_ready(req.bootstrap_room, len(req.pages), True, now, aux)

    def abort(self, req: Req, now: float) -> None:
        self.mgr.abort(req.bootstrap_room, "aborted on the prefill server", now)  # cancels writes
        self.transferring.pop(req.bootstrap_room, None)

    def forget(self, req: Req) -> None:
        self.rooms.pop(req.bootstrap_room, None)
        self.started_at.pop(req.bootstrap_room, None)

    def poll(self, now: float) -> None:
        for update in self.mgr.poll(now):
            req = self.rooms.get(update.room)
            if req is None:
                continue
            parked = self.transferring.pop(update.room, None)
            sent_pages = len(parked.pages) if parked is not None else 0
            if parked is not None:  # the queues no longer know it: free its pages here
                self.core.allocator.free(parked.pages)
                parked.pages = []
            if update.phase == "Done":
                self._record_speed(req.bootstrap_room, sent_pages, now)
                self.core.finish(req, {"type": "length", "length": len(req.output_ids)})
            else:
                self.stats.failed(update)
                self.core.finish(req, {"type": "abort", "message": f"KV transfer failed: {update.reason}"},
                                 status=503 if update.failure in _BOOTSTRAP_FAILURES else 502)

    def _record_speed(self, room: int, pages: int, now: float) -> None:
        """From the first chunk's hand-off to the last write's completion (overlaps compute)."""
        start = self.started_at.get(room)
        if start is None:
            return
        pool = self.core.kv_pool
        nbytes = pages * pool.page_bytes * 2 * pool.num_layers
        elapsed = max(now - start, 1e-6)
        self.stats.last_latency_ms = elapsed * 1e3
        self.stats.last_speed_gb_s = nbytes / elapsed / 1e9

    def close(self) -> None:
        self.mgr.close()


@dataclass
class DecodeSide:
    core: EngineCore
    mgr: KVReceiverManager = field(init=False)
    prealloc: deque[Req] = field(default_factory=deque)  # waiting for pages
    transferring: dict[int, Req] = field(default_factory=dict)  # registered, KV on its way
    quarantine: dict[int, list[int]] = field(default_factory=dict)  # pages prefill may still write
    stats: TransferStats = field(default_factory=TransferStats)

    def __post_init__(self) -> None:
        transport = NixlKVTransport(f"decode-{uuid.uuid4().hex[:12]}", self.core.kv_pool.kv_buffer)
        self.mgr = KVReceiverManager(transport, envs=DisaggEnvs.load())
        self.reserved_pages = -(-self.core.args.num_reserved_decode_tokens // self.core.args.page_size)

    @property
    def has_pending(self) -> bool:
        return bool(self.prealloc or self.transferring or self.quarantine)

    def held_pages(self) -> int:
        return sum(len(r.pages) for r in self.transferring.values()) + sum(map(len, self.quarantine.values()))

    def admit(self, req: Req, msg: GenerateReq) -> str | None:
        error = _room_of(msg)
        if error is None and (msg.bootstrap.room in self.transferring or
                              any(r.bootstrap_room == msg.bootstrap.room for r in self.prealloc)):
            error = f"bootstrap_room {msg.bootstrap.room} is already in use on this decode server"
        if error is None:
            req.bootstrap_room = msg.bootstrap.room
            req.bootstrap_addr = (msg.bootstrap.host, msg.bootstrap.port)
            self.prealloc.append(req)
        return error

    def parked_reqs(self) -> list[Req]:
        return list(self.prealloc) + list(self.transferring.values())

    def forget(self, req: Req) -> None:
        pass  # decode keeps no per-room state past the transfer

    def abort(self, req: Req, now: float) -> None:
        if req in self.prealloc:
            self.prealloc.remove(req)
            return
        if self.transferring.pop(req.bootstrap_room, None) is not None:
            self.mgr.abort(req.bootstrap_room, "aborted on the decode server", now)
            self.quarantine[req.bootstrap_room] = req.pages  # until prefill confirms
            req.pages = []

    def poll(self, now: float) -> None:
        self._preallocate(now)
        for update in self.mgr.poll(now):
            req = self.transferring.pop(update.room, None)
            if req is not None and update.phase == "Success":
                self._start_decoding(req, update.aux, now)
                continue
            if req is not None:  # failed while this engine still waited on it
                self.stats.failed(update)
                self.quarantine[update.room] = req.pages
                req.pages = []
                self.core.finish(req, {"type": "abort", "message": f"KV transfer failed: {update.reason}"},
                                 status=503 if update.failure in _BOOTSTRAP_FAILURES else 502)
            if update.pages_releasable and update.room in self.quarantine:
                self.core.allocator.free(self.quarantine.pop(update.room))

    def _preallocate(self, now: float) -> None:
        alloc = self.core.allocator
        while self.prealloc:
            req = self.prealloc[0]
            need = -(-req.prompt_len // self.core.args.page_size)
            if need + self.reserved_pages > alloc.num_free and (self.core.scheduler.running or self.transferring):
                return  # wait for memory; with nothing else running, admit without headroom
            if need > alloc.num_free:
                return
            self.prealloc.popleft()
            req.pages = alloc.alloc(need)
            self.transferring[req.bootstrap_room] = req
            host, port = req.bootstrap_addr
            self.mgr.add_request(req.bootstrap_room, host, port, list(req.pages), now)

    def _start_decoding(self, req: Req, aux_bytes: bytes, now: float) -> None:
        aux = msgspec.msgpack.decode(aux_bytes, type=FirstTokenAux)
        req.kv_len = req.prompt_len
        req.state = ReqState.RUNNING
        self.core.scheduler.running.append(req)
        self.core.accept_token(req, aux.token_id, aux.logprob, aux.top_logprobs, now, first=True)

    def close(self) -> None:
        self.mgr.close()
