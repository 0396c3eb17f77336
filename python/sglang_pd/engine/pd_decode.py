"""DecodeSide (``--mode decode``): the PD hooks of a decode server (engine/pd.py).

A request waits parked (no pages) until its prompt's pages (plus --num-reserved-decode-tokens
headroom) are free and fewer than --max-running-requests are running or arriving, registers
those pages with the prefill's bootstrap server, and joins the running batch with the first
token when the KV has arrived. Pages that prefill might still be writing after a failure are
quarantined until the transfer layer says they are safe.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from sglang_pd.core.pd_rules import decode_admits
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.disaggregation import decode_reuse
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.engine.pd import TransferStats, failure_status, room_error, runs_locally
from sglang_pd.engine.pd_events import FirstTokenAux, Parked, PDEvent, Queued, Unparked
from sglang_pd.engine.request import Req
from sglang_pd.protocol import GenerateReq

if TYPE_CHECKING:
    from sglang_pd.disaggregation.decode_manager import KVReceiverManager

logger = logging.getLogger(__name__)


@dataclass
class DecodeSide:
    scheduler: Scheduler  # pages reserved and quarantined here; the core applies the events
    page_size: int
    mgr: KVReceiverManager
    reserved_pages: int  # --num-reserved-decode-tokens in pages: room to decode into
    max_running: int
    role: str = "decode"
    flush_early: bool = True
    handing_off: bool = False  # decode receives; it hands nothing off
    prealloc: deque[Req] = field(default_factory=deque)  # parked, waiting for pages
    transferring: dict[int, Req] = field(default_factory=dict)  # parked, registered, KV on its way
    stats_: TransferStats = field(default_factory=TransferStats)
    reuse: decode_reuse.ReuseStats = field(default_factory=decode_reuse.ReuseStats)

    @property
    def has_pending(self) -> bool:
        return bool(self.prealloc or self.transferring or self.scheduler.quarantine)

    def admit(self, req: Req, msg: GenerateReq, now: float) -> PDEvent | str:
        if runs_locally(msg):
            return Queued(req)
        error = room_error(msg)
        if error is not None:
            return error
        assert msg.bootstrap is not None  # room_error checked it
        room, host, port = msg.bootstrap.room, msg.bootstrap.host, msg.bootstrap.port
        if room in self.transferring or any(r.bootstrap_room == room for r in self.prealloc):
            return f"bootstrap_room {room} is already in use on this decode server"
        if room in self.scheduler.quarantine or self.mgr.room_in_use(room):
            return (f"bootstrap_room {room} belongs to an earlier request whose transfer is still "
                    f"winding down (its pages may still be written); use a new room")
        fail = self.mgr.expect(room, host, port, now)  # tells prefill who holds it
        if fail is not None:
            return fail.reason if failure_status(fail) == 400 else f"cannot reach the prefill: {fail.reason}"
        req.bootstrap_room = room
        req.bootstrap_addr = (host, port)
        self.prealloc.append(req)
        return Parked(req)

    def on_chunk(self, req: Req, now: float) -> list[PDEvent]:
        return []

    def on_first_token(self, req: Req, logprob: float | None, top: list | None,
                       now: float) -> list[PDEvent]:
        return []  # decode streams and stop-checks it like any other token

    def forget(self, req: Req) -> None:
        pass  # decode keeps no per-room state past the transfer

    def handoffs_waited(self) -> None:
        pass

    def abort(self, req: Req, now: float) -> None:
        if req in self.prealloc:
            self.prealloc.remove(req)
            self.mgr.abort(req.bootstrap_room, "aborted on the decode server", now)  # drops the claim
            return
        if self.transferring.pop(req.bootstrap_room, None) is not None:
            self.mgr.abort(req.bootstrap_room, "aborted on the decode server", now)
            self.scheduler.quarantine_pages(req.bootstrap_room, req)  # until prefill confirms

    def poll(self, now: float) -> list[PDEvent]:
        events = self._preallocate(now)
        sched = self.scheduler
        for update in self.mgr.poll(now):
            req = self.transferring.pop(update.room, None)
            if req is not None and update.phase == "Success":
                try:
                    aux = msgspec.msgpack.decode(update.aux, type=FirstTokenAux)
                except msgspec.MsgspecError as e:  # a prefill bug: never decode without it
                    update = RoomUpdate(update.room, "Failed", Failure.TRANSFER_ERROR,  # noqa: PLW2901
                                        f"room {update.room}: unreadable first-token data ({e})")
                else:
                    events.append(Unparked(req, aux))  # runs, from the token its KV came with
                    continue
            if req is None:  # a claimed room that failed before its pages were reserved
                req = next((r for r in self.prealloc if r.bootstrap_room == update.room), None)
                if req is not None:
                    self.prealloc.remove(req)
            if req is not None:  # failed while this engine still waited on it
                sched.quarantine_pages(update.room, req)
                events.append(self.stats_.failed(req, update))
            if update.pages_releasable:
                sched.release_quarantine(update.room)
        return events

    def _preallocate(self, now: float) -> list[PDEvent]:
        events: list[PDEvent] = []
        sched = self.scheduler
        while self.prealloc:
            req = self.prealloc[0]
            # with a decode-side cache, the prompt's cached pages are reused, not received
            res = decode_reuse.plan(sched, req)
            if not decode_admits(len(sched.running), len(self.transferring), self.max_running,
                                 res.need, self.reserved_pages, sched.allocator.num_free):
                break  # FIFO: the head waits, and everything behind it (core/pd_rules.py)
            self.prealloc.popleft()
            decode_reuse.reserve(sched, req, res)
            self.reuse.count(res, self.page_size)
            self.transferring[req.bootstrap_room] = req
            host, port = req.bootstrap_addr
            fail = self.mgr.add_request(req.bootstrap_room, host, port, req.pages[res.hit:], now,
                                        prefix_len=res.hit * self.page_size)
            if fail is not None:  # nothing was sent: no write can come, the pages are free now
                logger.warning("room %d: registering with %s:%d failed: %s", req.bootstrap_room, host,
                               port, fail.reason)
                self.transferring.pop(req.bootstrap_room, None)
                sched.release(req)  # for the next request in the FIFO; the core then ends it
                events.append(self.stats_.failed(req, fail))
        return events

    def stats(self) -> dict[str, Any]:
        return {**self.stats_.as_dict(), **self.reuse.as_dict(),
                "num_decode_prealloc_queue_reqs": len(self.prealloc),
                "num_decode_transfer_queue_reqs": len(self.transferring)}

    def close(self) -> None:
        self.mgr.close()
