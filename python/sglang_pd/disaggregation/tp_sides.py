"""The transfer managers of a PD server with tensor parallelism (docs/disaggregation.md s. 11).

Built design: rank 0 of each side moves whole pages (all KV heads) over its one NIXL agent;
the engine gathers the heads before a write (prefill) and scatters them after the last
notification (decode), engine/tp/kv_move.py. Here, only the hooks into the managers:

- ``GatherTransport`` wraps prefill's transport: the pages of every WRITE are gathered just
  before it is posted (``kv_transfer_bytes_total`` counts the pages the sender manager sends,
  engine/pd_prefill.py, one definition for every TP size).
- ``TPSenderManager`` computes the head mapping once per decode server, at its first
  Register (which carries the decode's tp_size), refusing a decode whose TP size cannot
  split the heads; the mapping is logged and kept (``mappings``).
- ``TPReceiverManager`` sends its tp_size in Register and, when a room's KV has all arrived,
  scatters the room's registered pages to the ranks before the engine hears Success.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.bootstrap import PeerDead
from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.state import RoomUpdate
from sglang_pd.disaggregation.tp_mapping import HeadSlice, describe, head_mapping
from sglang_pd.disaggregation.transfer.base import KVTransport, TransferHandle, TransferStatus

logger = logging.getLogger(__name__)

PagesHook = Callable[[list[int]], None]


class GatherTransport(KVTransport):
    """Delegates to ``inner``; ``before_write(src_pages)`` runs before each WRITE is posted."""

    def __init__(self, inner: KVTransport, before_write: PagesHook | None = None) -> None:
        self.inner, self.before_write = inner, before_write
        self.layout, self.agent_name = inner.layout, inner.agent_name

    def metadata(self) -> bytes:
        return self.inner.metadata()

    def add_peer(self, metadata: bytes, layout: Any) -> str:
        return self.inner.add_peer(metadata, layout)

    def remove_peer(self, peer: str) -> None:
        self.inner.remove_peer(peer)

    def write_pages(self, peer: str, src_pages: Sequence[int], dst_pages: Sequence[int],
                    notif: bytes) -> TransferHandle:
        if self.before_write is not None:
            self.layout.check_pages(src_pages, "src_pages")  # before any rank reads them
            self.before_write(list(src_pages))
        return self.inner.write_pages(peer, src_pages, dst_pages, notif)

    def poll(self, handle: TransferHandle) -> TransferStatus:
        return self.inner.poll(handle)

    def release(self, handle: TransferHandle) -> bool:
        return self.inner.release(handle)

    def send_notif(self, peer: str, msg: bytes) -> None:
        self.inner.send_notif(peer, msg)

    def get_notifs(self) -> list[bytes]:
        return self.inner.get_notifs()

    def close(self) -> None:
        self.inner.close()


class TPSenderManager(KVSenderManager):
    """KVSenderManager that knows its TP size and maps heads per decode server."""

    def __init__(self, transport: KVTransport, tp_size: int, **kwargs: Any) -> None:
        super().__init__(transport, **kwargs)
        self.tp_size = tp_size
        self.mappings: dict[str, list[HeadSlice]] = {}  # decode client_id -> its slices

    def _on_register(self, client_id: str, reg: m.Register, now: float) -> None:
        if client_id not in self.mappings:
            heads = self.transport.layout.kv_heads  # whole pages travel: all KV heads
            try:
                self.mappings[client_id] = head_mapping(heads, self.tp_size, reg.tp_size)
            except ValueError as e:
                why = (f"room {reg.room}: decode tp_size {reg.tp_size} and prefill tp_size "
                       f"{self.tp_size} cannot share {heads} KV heads: {e}")
                self.server.send(client_id, m.RegisterRefused(reg.room, why))
                return
            logger.info("KV head mapping to decode %s (tp %d -> %d): %s", client_id, self.tp_size,
                        reg.tp_size, describe(self.mappings[client_id]))
        super()._on_register(client_id, reg, now)

    def _on_event(self, ev: Any, now: float) -> None:
        super()._on_event(ev, now)
        if isinstance(ev, PeerDead):
            self.mappings.pop(ev.peer, None)  # a restarted decode may come back with another size


class TPReceiverManager(KVReceiverManager):
    """KVReceiverManager whose rooms' pages are scattered to the ranks on Success."""

    def __init__(self, transport: KVTransport, tp_size: int, scatter: PagesHook,
                 **kwargs: Any) -> None:
        super().__init__(transport, **kwargs)
        self.tp_size = tp_size  # sent in every Register (decode_manager reads it)
        self._scatter = scatter
        self._dst: dict[int, list[int]] = {}

    def add_request(self, room: int, bootstrap_host: str, bootstrap_port: int,
                    dst_pages: list[int], now: float, prefix_len: int = 0) -> RoomUpdate | None:
        # dst_pages are the pages registered (after a decode-side prefix hit): the scatter
        # moves only those; reused pages are on every rank already
        fail = super().add_request(room, bootstrap_host, bootstrap_port, dst_pages, now,
                                   prefix_len)
        if fail is None:
            self._dst[room] = list(dst_pages)
        return fail

    def poll(self, now: float) -> list[RoomUpdate]:
        updates = super().poll(now)
        for u in updates:
            if u.phase == "Success":
                self._scatter(self._dst.pop(u.room))  # before the engine decodes from them
            elif u.pages_releasable:
                self._dst.pop(u.room, None)
        return updates
