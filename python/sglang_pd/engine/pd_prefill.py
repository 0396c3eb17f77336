"""PrefillSide (``--mode prefill``): the PD hooks of a prefill server (engine/pd.py).

A request must carry bootstrap_host/port/room. It waits parked without pages ("bootstrapping",
not seen by the prefill policy) until its decode has registered destination pages for its
room, then joins the waiting queue (core/pd_rules.py: prefill_schedulable; this removes the PD
hold-and-wait with decode's FIFO pre-allocation). Its prompt's pages are allocated whole at its
first chunk (decode pre-allocates the same number), every finished chunk's pages are written
into decode's pages over NIXL while the next chunk computes, and the first sampled token
travels as aux data with the last write. The request is parked with its pages until the
transfer is done or failed, then answers its client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from sglang_pd.core.pd_rules import prefill_schedulable
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.engine.pd import TransferStats, room_error, runs_locally
from sglang_pd.engine.pd_events import Finished, FirstTokenAux, Parked, PDEvent, Queued, Unparked
from sglang_pd.engine.request import Req
from sglang_pd.protocol import GenerateReq

if TYPE_CHECKING:
    from sglang_pd.disaggregation.prefill_manager import KVSenderManager


@dataclass
class PrefillSide:
    scheduler: Scheduler  # read here; the core applies the events that move requests
    page_size: int
    mgr: KVSenderManager
    role: str = "prefill"
    flush_early: bool = True  # an ended hand-off answers before the next forward
    rooms: dict[int, Req] = field(default_factory=dict)  # every PD request on this prefill
    # parked without pages until decode registers its room (then scheduler.waiting)
    bootstrapping: dict[int, Req] = field(default_factory=dict)
    started_at: dict[int, float] = field(default_factory=dict)
    stats_: TransferStats = field(default_factory=TransferStats)
    # rooms whose last KV went out since the core last waited for hand-offs (handing_off)
    fresh: set[int] = field(default_factory=set)

    @property
    def handing_off(self) -> bool:
        return bool(self.fresh)

    def handoffs_waited(self) -> None:
        self.fresh.clear()

    @property
    def has_pending(self) -> bool:
        # also rooms decode registered before (or without) their request reaching us: an idle
        # engine must still answer them and time them out
        return bool(self.scheduler.parked) or self.mgr.has_pending

    def admit(self, req: Req, msg: GenerateReq, now: float) -> PDEvent | str:
        if runs_locally(msg):  # nothing to send: prefill_schedulable(runs_locally=True)
            return Queued(req)  # bootstrap_room stays -1: no PD hook fires for it
        error = room_error(msg)
        if error is not None:
            return error
        assert msg.bootstrap is not None  # room_error checked it
        room = msg.bootstrap.room
        if room in self.rooms or self.mgr.room_in_use(room):
            return f"bootstrap_room {room} is already in use on this prefill server"
        req.bootstrap_room = room
        self.rooms[room] = req
        self.mgr.expect(room, now)  # its bootstrap timeout counts from now
        if prefill_schedulable(self.mgr.decode_registered(room)):
            return Queued(req)  # decode registered first: schedulable at once
        # parked without pages: the engine's find/abort/shutdown see it, policies do not
        self.bootstrapping[room] = req
        return Parked(req)

    def _registered(self) -> list[PDEvent]:
        """Requests whose decode registered its pages join the waiting queue (in arrival order:
        ``Scheduler.add``; ``req.arrival`` is unchanged, so deadlines count from arrival)."""
        events: list[PDEvent] = []
        for room in self.mgr.take_registered():
            req = self.bootstrapping.get(room)
            if req is None or not prefill_schedulable(self.mgr.decode_registered(room)):
                continue  # finished meanwhile, or its room failed (poll reports it)
            del self.bootstrapping[room]
            events.append(Unparked(req))
        return events

    def on_chunk(self, req: Req, now: float) -> list[PDEvent]:
        room = req.bootstrap_room
        if room < 0:
            return []
        if room not in self.started_at:
            self.started_at[room] = now
            fail = self.mgr.add_request(room, list(req.pages), now)
            if fail is not None:  # the manager holds nothing for it: the request fails here
                return [self.stats_.failed(req, fail)]
        self.mgr.kv_ready(room, req.kv_len // self.page_size, False, now)
        return []

    def on_first_token(self, req: Req, logprob: float | None, top: list | None,
                       now: float) -> list[PDEvent]:
        """Prefill is complete: park the request (pages kept) and send the rest of its KV."""
        if req.bootstrap_room < 0:
            return []  # runs locally (health check): finished like a colocated request
        failed = self.on_chunk(req, now)
        if failed:
            return failed  # its room failed on the spot
        aux = msgspec.msgpack.encode(FirstTokenAux(req.output_ids[-1], logprob, top))
        self.mgr.kv_ready(req.bootstrap_room, len(req.pages), True, now, aux)
        self.fresh.add(req.bootstrap_room)
        return [Parked(req)]  # decode finishes or continues it

    def abort(self, req: Req, now: float) -> None:
        self.mgr.abort(req.bootstrap_room, "aborted on the prefill server", now)  # cancels writes

    def forget(self, req: Req) -> None:
        self.rooms.pop(req.bootstrap_room, None)
        self.bootstrapping.pop(req.bootstrap_room, None)
        self.started_at.pop(req.bootstrap_room, None)
        self.fresh.discard(req.bootstrap_room)

    def poll(self, now: float) -> list[PDEvent]:
        events: list[PDEvent] = []
        for update in self.mgr.poll(now):
            self.fresh.discard(update.room)  # its hand-off ended (done or failed)
            req = self.rooms.get(update.room)
            if req is None:
                continue
            if update.phase == "Done":
                self._record_speed(req.bootstrap_room, update.pages_sent, now)
                events.append(Finished(req, {"type": "length", "length": len(req.output_ids)}))
            else:  # incl. a request still bootstrapping whose decode never registered (timeout)
                events.append(self.stats_.failed(req, update))
        return events + self._registered()

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
        inflight = len(self.scheduler.parked) - len(self.bootstrapping)
        bpp = self.mgr.transport.layout.bytes_per_page_all_layers
        sent, skipped = self.mgr.pages_sent_total, self.mgr.pages_skipped_total
        return {**self.stats_.as_dict(), "num_prefill_bootstrap_queue_reqs": len(self.bootstrapping),
                # KV moved to decodes, and what decode-side reuse spared (disaggregation/decode_reuse.py)
                "kv_transfer_pages_total": sent,
                # NIXL bytes: the per-rank TP transport counts its slices (tp/rank_writer.py)
                "kv_transfer_bytes_total": getattr(self.mgr.transport, "bytes_posted", sent * bpp),
                "kv_transfer_skipped_pages_total": skipped,
                "kv_transfer_skipped_bytes_total": skipped * bpp,
                "num_prefill_inflight_queue_reqs": inflight,
                "kv_transfer_speed_gb_s": self.stats_.last_speed_gb_s,
                "kv_transfer_latency_ms": self.stats_.last_latency_ms}

    def close(self) -> None:
        self.mgr.close()
