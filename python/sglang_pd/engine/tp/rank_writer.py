"""Prefill rank 0's transport in per-rank PD with TP (docs/disaggregation.md section 11).

To ``KVSenderManager`` it is one ``KVTransport`` writing a chunk's pages to one decode server;
underneath, one chunk is one WRITE per ``HeadSlice`` of the pair's head mapping (computed once,
at the decode's first Register: ``add_decode``), each posted by the prefill rank that holds the
heads straight into the decode rank that holds them:

- slices of ranks > 0 travel to those ranks in one ``KVWrite`` (the plan channel, so after the
  forward that filled the pages); each rank reports ``KVWriteDone`` on the back channel;
- rank 0 posts its own slices itself;
- the slice prefill rank 0 -> decode rank 0 carries the chunk's notification and is posted
  last, once every other slice of the chunk is done, so decode rank 0 hears of the chunk only
  after the rest of it was written (the other slices carry partial notifications that the
  decode ranks count before the room decodes: tp_sides.RankReceiverManager).

The handle is DONE when that last WRITE is; ERR (any slice failed, or cancelled) only once no
slice of it can still land, so the manager's cancel rules hold unchanged. A TP-1 pair (one
whole-page slice) goes straight to rank 0's NIXL transport, as without TP.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.messages import RankAgent
from sglang_pd.disaggregation.tp_mapping import HeadSlice, describe, head_mapping, rank_heads
from sglang_pd.disaggregation.tp_slices import local_range, partial_notif
from sglang_pd.disaggregation.transfer.base import (
    KVTransport,
    PeerGoneError,
    TransferError,
    TransferHandle,
    TransferStatus,
)
from sglang_pd.engine.tp.messages import KVCancel, KVDropPeer, KVPeers, KVWrite, KVWriteDone, SliceWrite
from sglang_pd.engine.tp.rank_kv import TPLink


@dataclass
class _Decode:
    agents: list[RankAgent]  # by decode rank
    slices: list[HeadSlice]
    fast: bool  # 1 -> 1: rank 0's transport writes whole pages as without TP


@dataclass
class _Xfer:
    xfer: int
    own: list[TransferHandle]
    remote: set[int]  # ranks > 0 whose KVWriteDone is outstanding
    final: SliceWrite | None  # p0 -> d0, posted last; None once cancelled
    final_handle: TransferHandle | None = None
    errors: list[str] = field(default_factory=list)
    cancelled: bool = False


class RankWriteTransport(KVTransport):
    def __init__(self, link: TPLink, num_kv_heads: int) -> None:
        self.link, self.inner = link, link.kv.transport
        self.heads, self.tp_size = num_kv_heads, link.tp_size
        own = self.inner.layout
        # all KV heads: what a page of the model is (page checks, and the logical KV size)
        self.layout = msgspec.structs.replace(own, kv_heads=num_kv_heads)
        self.agent_name = self.inner.agent_name
        self.decodes: dict[str, _Decode] = {}  # by decode rank 0's agent name (the peer)
        self.xfers: dict[int, tuple[TransferHandle, _Xfer]] = {}
        self._next = 0
        self.bytes_posted = 0  # NIXL bytes, every rank's slices (kv_transfer_bytes_total)

    # ---- peers -----------------------------------------------------------
    def add_decode(self, reg: m.Register) -> tuple[str, str]:
        """Load a decode server (all its ranks' agents); returns (peer, mapping text). Raises
        TransferError when the TP sizes cannot share the heads or a layout does not fit."""
        agents = list(reg.ranks) or [RankAgent(reg.agent_name, reg.agent_metadata, reg.layout)]
        size = len(agents)
        try:
            slices = head_mapping(self.heads, self.tp_size, size)
        except ValueError as e:
            raise TransferError(f"prefill tp_size {self.tp_size} and decode tp_size {size} "
                                f"cannot share {self.heads} KV heads: {e}") from e
        for d, a in enumerate(agents):
            want = len(rank_heads(self.heads, size, d))
            if a.layout.kv_heads != want:
                raise TransferError(f"decode rank {d} has {a.layout.kv_heads} KV heads in its "
                                    f"pool; rank {d} of {size} holds {want}")
        peer = agents[0].agent_name
        fast = self.tp_size == 1 and size == 1
        old = self.decodes.get(peer)
        if old is not None and old.agents == agents:
            return peer, describe(slices)
        if fast:
            self.inner.add_peer(agents[0].agent_metadata, agents[0].layout)
        else:
            for d in sorted({s.dst_rank for s in slices if s.src_rank == 0}):
                self.link.kv.add_peer(agents[d])
            remote = sorted({s.dst_rank for s in slices if s.src_rank > 0})
            if remote:
                self._send(KVPeers([agents[d] for d in remote]))
        self.decodes[peer] = _Decode(agents, slices, fast)
        return peer, describe(slices)

    def add_peer(self, metadata: bytes, layout: m.KVLayout) -> str:
        raise TransferError("a per-rank TP transport loads decodes from their Register "
                            "(add_decode)")

    def remove_peer(self, peer: str) -> None:
        dec = self.decodes.pop(peer, None)
        if dec is None:
            return
        if dec.fast:
            self.inner.remove_peer(peer)
            return
        for a in dec.agents:
            self.link.kv.drop_peer(a.agent_name)
        try:
            self._send(KVDropPeer([a.agent_name for a in dec.agents]))
        except TransferError:
            pass  # the ranks are gone or out of step: the server is going down anyway

    def metadata(self) -> bytes:
        return self.inner.metadata()

    def _send(self, msg: KVPeers | KVDropPeer | KVWrite | KVCancel) -> None:
        try:
            self.link.send(msg)
        except (RuntimeError, OSError) as e:
            raise TransferError(f"tensor-parallel ranks unreachable: {e}") from e

    # ---- transfers -------------------------------------------------------
    def write_pages(self, peer: str, src_pages: Sequence[int], dst_pages: Sequence[int],
                    notif: bytes) -> TransferHandle:
        dec = self.decodes.get(peer)
        if dec is None:
            raise PeerGoneError(f"decode {peer!r} is unknown or was removed")
        if dec.fast:
            h = self.inner.write_pages(peer, src_pages, dst_pages, notif)
            self.bytes_posted += h.nbytes
            return h
        src, dst = [int(p) for p in src_pages], [int(p) for p in dst_pages]
        self.layout.check_pages(src, "src_pages")
        n = m.parse_kv_notif(notif)
        room = n.room if n is not None else -1
        size = len(dec.agents)
        writes = [SliceWrite(
            s.src_rank, dec.agents[s.dst_rank].agent_name, src, dst,
            local_range(self.heads, self.tp_size, s.src_rank, s),
            local_range(self.heads, size, s.dst_rank, s), s.width,
            s.width == len(rank_heads(self.heads, self.tp_size, s.src_rank))
            == len(rank_heads(self.heads, size, s.dst_rank)),
            notif if (s.src_rank, s.dst_rank) == (0, 0) else partial_notif(room),
        ) for s in dec.slices]
        final = next(w for w, s in zip(writes, dec.slices, strict=True)
                     if (s.src_rank, s.dst_rank) == (0, 0))
        remote = [w for w in writes if w.src_rank > 0]
        xfer, self._next = self._next, self._next + 1
        if remote:
            self._send(KVWrite(xfer, remote))
        own = [self.link.kv.post(w) for w in writes if w.src_rank == 0 and w is not final]
        x = _Xfer(xfer, own, {w.src_rank for w in remote}, final)
        nbytes = sum(self.inner.layout.num_layers * 2 * len(src) * self.inner.layout.page_size
                     * w.width * self.inner.layout.head_dim * self.inner.layout.itemsize
                     for w in writes)
        handle = TransferHandle(peer=peer, num_pages=len(src), nbytes=nbytes, notif=notif,
                                posted_at=time.monotonic(), impl=x)
        self.bytes_posted += nbytes
        self.xfers[xfer] = (handle, x)
        self._advance(handle, x)
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        x = handle.impl
        if not isinstance(x, _Xfer):
            return self.inner.poll(handle)
        if handle.status == "PROC":
            self._drain()
            self._advance(handle, x)
        return handle.status

    def release(self, handle: TransferHandle) -> bool:
        x = handle.impl
        if not isinstance(x, _Xfer):
            return self.inner.release(handle)
        if handle.status != "PROC":
            return True
        self._cancel(x)
        self._drain()
        self._advance(handle, x)
        return handle.status != "PROC"

    def _drain(self) -> None:
        for msg in self.link.recv():
            if isinstance(msg, KVWriteDone) and msg.xfer in self.xfers:
                x = self.xfers[msg.xfer][1]
                x.remote.discard(msg.rank)
                if not msg.ok:
                    x.errors.append(f"prefill rank {msg.rank}: {msg.error}")

    def _advance(self, handle: TransferHandle, x: _Xfer) -> None:
        kv = self.link.kv
        for h in x.own:
            if h.status == "PROC" and kv.poll(h) == "ERR" and not x.cancelled:
                x.errors.append(h.error)
        f = x.final_handle
        if f is not None and f.status == "PROC" and kv.poll(f) == "ERR" and not x.cancelled:
            x.errors.append(f.error)
        if x.errors and not x.cancelled:
            self._cancel(x)
        pending = bool(x.remote) or any(h.status == "PROC" for h in x.own) or (
            x.final_handle is not None and x.final_handle.status == "PROC")
        if pending:
            return
        if x.final is not None and x.final_handle is None and not x.cancelled:
            x.final_handle = kv.post(x.final)  # every other slice of the chunk has landed
            if x.final_handle.status == "PROC":
                return
            if x.final_handle.status == "ERR":
                x.errors.append(x.final_handle.error)
        if x.errors or x.cancelled or x.final_handle is None:
            handle.status = "ERR"
            handle.error = "; ".join(x.errors) or "released (cancelled) before completion"
        else:
            handle.status = "DONE"
        self.xfers.pop(x.xfer, None)

    def _cancel(self, x: _Xfer) -> None:
        if x.cancelled:
            return
        x.cancelled, x.final = True, None
        for h in [*x.own, *([x.final_handle] if x.final_handle is not None else [])]:
            if h.status == "PROC":
                self.link.kv.release(h)  # one that cannot be cancelled is polled until it ends
        if x.remote:
            try:
                self._send(KVCancel(x.xfer))
            except TransferError:
                x.remote.clear()  # the ranks are gone: nothing of theirs can still be written

    # ---- notifications ---------------------------------------------------
    def send_notif(self, peer: str, msg: bytes) -> None:
        self.inner.send_notif(peer, msg)

    def get_notifs(self) -> list[bytes]:
        return self.inner.get_notifs()

    def close(self) -> None:
        self.inner.close()
