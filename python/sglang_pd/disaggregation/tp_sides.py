"""The transfer managers of a PD server in the per-rank design (docs/disaggregation.md s. 11).

Every PD server uses them, TP size 1 included, so that any prefill TP size pairs with any
decode TP size the KV heads allow; between two TP-1 servers nothing changes on the wire.

- ``RankSenderManager`` (prefill rank 0): loads each registering decode through
  ``RankWriteTransport.add_decode`` (every decode rank's agent; the head mapping is computed
  there, once per decode server, and logged), refusing a pair the heads cannot split; its
  RegisterAck carries the prefill's TP size.
- ``RankReceiverManager`` (decode rank 0): its Register carries every rank's agent; when a
  room's last notification has arrived it holds the room's Success back until every decode
  rank has counted the partial notifications of the slices written into it (tp_slices.py), so
  the engine never decodes from a page another prefill rank is still writing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.bootstrap import PeerDead
from sglang_pd.disaggregation.bootstrap.server import BootstrapServer
from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.state import RoomUpdate
from sglang_pd.disaggregation.tp_mapping import head_mapping
from sglang_pd.disaggregation.tp_slices import partials_expected
from sglang_pd.disaggregation.transfer.base import KVTransport

if TYPE_CHECKING:
    from sglang_pd.engine.tp.rank_kv import TPLink
    from sglang_pd.engine.tp.rank_writer import RankWriteTransport

logger = logging.getLogger(__name__)

ROOMS_KEPT = 4096


class RankSenderManager(KVSenderManager):
    def __init__(self, transport: KVTransport, writer: RankWriteTransport, *,
                 envs: DisaggEnvs, bootstrap_host: str, bootstrap_port: int) -> None:
        # layouts differ per rank: add_decode checks each decode rank's against the mapping
        server = BootstrapServer(bootstrap_host, bootstrap_port, local_layout=None,
                                 heartbeat_interval=envs.heartbeat_interval,
                                 heartbeat_max_failure=envs.heartbeat_max_failure)
        super().__init__(transport, server, envs)
        self.writer, self.tp_size = writer, writer.tp_size
        self.mappings: dict[str, str] = {}  # decode client_id -> its mapping, as logged

    def _add_peer(self, reg: m.Register) -> str:
        peer, mapping = self.writer.add_decode(reg)
        if self.mappings.get(reg.client_id) != mapping:
            self.mappings[reg.client_id] = mapping
            logger.info("KV head mapping to decode %s (tp %d -> %d): %s", reg.client_id,
                        self.tp_size, max(len(reg.ranks), 1), mapping)
        return peer

    def _on_event(self, ev: Any, now: float) -> None:
        super()._on_event(ev, now)
        if isinstance(ev, PeerDead):
            self.mappings.pop(ev.peer, None)  # a restarted decode may come back with another size


@dataclass
class _Settling:
    update: RoomUpdate
    own: int  # partials rank 0 still needs
    waiting: set[int]  # ranks > 0 whose KVSettled is outstanding
    deadline: float


class RankReceiverManager(KVReceiverManager):
    def __init__(self, transport: KVTransport, link: TPLink, num_kv_heads: int,
                 **kwargs: Any) -> None:
        super().__init__(transport, **kwargs)
        self.link, self.heads, self.tp_size = link, num_kv_heads, link.tp_size
        self._prefill_tp: OrderedDict[int, int] = OrderedDict()  # room -> its prefill's TP size
        self._chunks: OrderedDict[int, int] = OrderedDict()  # room -> chunks (from the last one)
        self._settling: dict[int, _Settling] = {}

    @property
    def rank_agents(self) -> list[m.RankAgent]:
        """Sent in Register: empty for TP 1 (the Register's own agent holds every head)."""
        return [] if self.tp_size == 1 else self.link.agents()

    def _on_event(self, ev: Any, now: float) -> None:
        msg = getattr(ev, "msg", None)
        if isinstance(msg, m.RegisterAck) and msg.room in self.rooms:
            _remember(self._prefill_tp, msg.room, msg.tp_size)
        super()._on_event(ev, now)

    def _on_notif(self, data: bytes, now: float) -> None:
        if self.link.kv.drain([data]):  # not a partial: the chunk's own notification
            n = m.parse_kv_notif(data)
            if n is not None and n.last and n.room in self.rooms:
                _remember(self._chunks, n.room, n.chunk + 1)
            super()._on_notif(data, now)

    def poll(self, now: float) -> list[RoomUpdate]:
        out: list[RoomUpdate] = []
        for u in super().poll(now):
            if u.phase == "Success":
                self._settle(u, now)
                continue
            if u.pages_releasable:
                self._prefill_tp.pop(u.room, None)
                self._chunks.pop(u.room, None)
            out.append(u)
        return out + self._settled(now)

    def _settle(self, u: RoomUpdate, now: float) -> None:
        prefill_tp = self._prefill_tp.pop(u.room, 1)
        chunks = self._chunks.pop(u.room, 1)
        slices = head_mapping(self.heads, prefill_tp, self.tp_size)  # prefill checked the pair
        counts = [partials_expected(slices, d, chunks) for d in range(self.tp_size)]
        waiting = set(range(1, self.tp_size))
        if waiting:
            from sglang_pd.engine.tp.messages import KVSettle

            self.link.send(KVSettle(u.room, counts))
        self._settling[u.room] = _Settling(u, counts[0], waiting, now + SETTLE_TIMEOUT_S)

    def _settled(self, now: float) -> list[RoomUpdate]:
        from sglang_pd.engine.tp.messages import KVSettled

        for msg in self.link.recv():
            if not isinstance(msg, KVSettled):
                continue
            s = self._settling.get(msg.room)
            if s is None:
                continue
            if not msg.ok:
                logger.error("room %d: %s; the ranks are out of step", msg.room, msg.error)
                self.link.broken = True
            s.waiting.discard(msg.rank)
        out = []
        for room, s in list(self._settling.items()):
            if s.own == 0 or self.link.kv.take_partials(room, s.own):
                s.own = 0
                if not s.waiting:
                    out.append(s.update)
                    del self._settling[room]
                    continue
            if now > s.deadline:
                logger.error("room %d: not every rank's KV arrived within %gs; the ranks are "
                             "out of step", room, SETTLE_TIMEOUT_S)
                self.link.broken = True  # the engine exits (TPRanks.failure)
                s.deadline = float("inf")  # said once
        return out


SETTLE_TIMEOUT_S = 30.0


def _remember(d: OrderedDict[int, int], room: int, value: int) -> None:
    d[room] = value
    while len(d) > ROOMS_KEPT:
        d.popitem(last=False)
