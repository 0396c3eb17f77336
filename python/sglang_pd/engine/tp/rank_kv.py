"""PD with TP, the per-rank design (docs/disaggregation.md section 11): every rank of a PD
server has its own NIXL agent over its own KV pool (its KV heads), and prefill ranks write
their heads straight into the decode ranks that hold them. No staging copy: each rank's KV
memory is its pool, as without PD.

- ``RankKV``: one rank's agent: load decode ranks' agents, post one head-slice WRITE
  (tp_slices.slice_table), count partial notifications (decode).
- ``RankKVService``: a rank > 0's side (worker.py): runs rank 0's KVPeers / KVWrite / KVCancel /
  KVSettle and reports KVWriteDone / KVSettled on the back channel.
- ``TPLink``: rank 0's way to those ranks (the plan channel and the back channel, both set
  when the ranks attach; launcher.py). Rank 0's transfer managers use it (tp_sides.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

import torch

from sglang_pd.disaggregation.messages import RankAgent
from sglang_pd.disaggregation.tp_slices import parse_partial, slice_table
from sglang_pd.disaggregation.transfer.base import TransferError, TransferHandle, TransferStatus
from sglang_pd.disaggregation.transfer.nixl_transport import NixlKVTransport
from sglang_pd.engine.tp.messages import (
    FromRank,
    KVCancel,
    KVDropPeer,
    KVPeers,
    KVSettle,
    KVSettled,
    KVWrite,
    KVWriteDone,
    SliceWrite,
    ToRank,
)

logger = logging.getLogger(__name__)

ROOMS_COUNTED = 4096  # rooms whose partial notifications a rank remembers (oldest dropped)
# A KVSettle is sent once decode rank 0 has the room's last notification, which prefill posts
# only after every other slice's write is done: the partials are at most in flight. A rank
# that still lacks them after this long lost a write; the server then exits.
SETTLE_TIMEOUT_S = 30.0


class RankKV:
    def __init__(self, transport: NixlKVTransport) -> None:
        self.transport = transport
        self.peers: dict[str, RankAgent] = {}
        self.partials: OrderedDict[int, int] = OrderedDict()  # room -> partial notifs counted

    @classmethod
    def create(cls, mode: str, rank: int, kv_buffer: torch.Tensor) -> RankKV:
        return cls(NixlKVTransport(f"{mode}-{uuid.uuid4().hex[:12]}-r{rank}", kv_buffer))

    def agent(self) -> RankAgent:
        t = self.transport
        return RankAgent(t.agent_name, t.metadata(), t.layout)

    def add_peer(self, a: RankAgent) -> None:
        """Load a decode rank's agent. Raises TransferError if its pages cannot take ours."""
        mine, theirs = self.transport.layout, a.layout
        diffs = [n for n in ("page_size", "dtype", "head_dim", "num_layers")
                 if getattr(mine, n) != getattr(theirs, n)]
        if diffs:
            raise TransferError(f"decode rank agent {a.agent_name}: KV layout differs in {diffs}")
        if self.peers.get(a.agent_name) == a:
            return
        try:
            self.transport.agent.add_remote_agent(a.agent_metadata)
        except self.transport._errors as e:
            raise TransferError(f"NIXL could not load agent {a.agent_name}: {e}") from e
        self.peers[a.agent_name] = a

    def drop_peer(self, name: str) -> None:
        if self.peers.pop(name, None) is None:
            return
        try:
            self.transport.agent.remove_remote_agent(name)
        except self.transport._errors as e:  # already gone
            logger.warning("remove_remote_agent(%s): %s", name, e)

    def post(self, w: SliceWrite) -> TransferHandle:
        """Post one slice's WRITE; a bad slice or unknown peer gives an ERR handle."""
        t = self.transport
        handle = TransferHandle(peer=w.peer, num_pages=len(w.src_pages), nbytes=0, notif=w.notif,
                                posted_at=time.monotonic())
        peer = self.peers.get(w.peer)

        def make_xfer() -> Any:
            if peer is None:
                raise TransferError(f"decode rank agent {w.peer!r} is not loaded")
            src = t.layout.check_pages(w.src_pages, "src_pages")
            dst = peer.layout.check_pages(w.dst_pages, "dst_pages")
            if src.size != dst.size:
                raise ValueError(f"{src.size} source pages for {dst.size} destination pages")
            local = slice_table(t.layout, src, w.src_lo, w.width, w.whole)
            remote = slice_table(peer.layout, dst, w.dst_lo, w.width, w.whole)
            handle.nbytes = int(local[:, 1].sum())
            return t.agent.initialize_xfer(
                "WRITE", t.agent.get_xfer_descs(local, t.layout.mem_type),
                t.agent.get_xfer_descs(remote, peer.layout.mem_type), w.peer, w.notif)

        return t.post_write(handle, make_xfer, ValueError, TransferError)

    def poll(self, handle: TransferHandle) -> TransferStatus:
        return self.transport.poll(handle)

    def release(self, handle: TransferHandle) -> bool:
        return self.transport.release(handle)

    def drain(self, notifs: list[bytes]) -> list[bytes]:
        """Count the partial notifications among ``notifs``; return the others."""
        rest = []
        for data in notifs:
            room = parse_partial(data)
            if room is None:
                rest.append(data)
                continue
            self.partials[room] = self.partials.pop(room, 0) + 1
            while len(self.partials) > ROOMS_COUNTED:
                self.partials.popitem(last=False)
        return rest

    def take_partials(self, room: int, count: int) -> bool:
        """Whether ``count`` partials of ``room`` arrived (then forget them)."""
        if self.partials.get(room, 0) < count:
            return False
        self.partials.pop(room, None)
        return True


class RankKVService:
    """A rank > 0's part of per-rank PD transfers; ``handle`` and ``progress`` return the
    reports for rank 0."""

    def __init__(self, kv: RankKV, rank: int) -> None:
        self.kv, self.rank = kv, rank
        self.xfers: dict[int, list[TransferHandle]] = {}
        self.settles: dict[int, tuple[int, float]] = {}  # room -> (count, deadline)

    @property
    def busy(self) -> bool:
        return bool(self.xfers or self.settles)

    def handle(self, msg: ToRank) -> list[FromRank]:
        if isinstance(msg, KVPeers):
            for a in msg.agents:
                try:
                    self.kv.add_peer(a)
                except TransferError as e:  # its writes fail (KVWriteDone not ok) and say why
                    logger.error("%s", e)
        elif isinstance(msg, KVDropPeer):
            for name in msg.agent_names:
                self.kv.drop_peer(name)
        elif isinstance(msg, KVWrite):
            mine = [w for w in msg.writes if w.src_rank == self.rank]
            if mine:
                self.xfers[msg.xfer] = [self.kv.post(w) for w in mine]
        elif isinstance(msg, KVCancel):
            for h in self.xfers.get(msg.xfer, []):
                self.kv.release(h)  # one that cannot be cancelled is polled until it ends
        elif isinstance(msg, KVSettle):
            self.settles[msg.room] = (msg.counts[self.rank], time.monotonic() + SETTLE_TIMEOUT_S)
        return self.progress()

    def progress(self) -> list[FromRank]:
        out: list[FromRank] = []
        for xfer, hs in list(self.xfers.items()):
            if any(self.kv.poll(h) == "PROC" for h in hs):
                continue
            del self.xfers[xfer]
            errors = [h.error for h in hs if h.status == "ERR"]
            out.append(KVWriteDone(self.rank, xfer, not errors, "; ".join(errors)))
        stray = self.kv.drain(self.kv.transport.get_notifs())
        if stray:
            logger.warning("rank %d: ignoring %d non-KV notifications", self.rank, len(stray))
        for room, (count, deadline) in list(self.settles.items()):
            if self.kv.take_partials(room, count):
                out.append(KVSettled(self.rank, room, True))
            elif time.monotonic() > deadline:
                out.append(KVSettled(self.rank, room, False,
                                     f"rank {self.rank}: {count} writes of room {room} expected, "
                                     f"{self.kv.partials.get(room, 0)} arrived"))
            else:
                continue
            del self.settles[room]
        return out


class TPLink:
    """Rank 0's per-rank KV: its own ``RankKV`` and the way to the other ranks (``runner``
    gets ``step_sink``, ``tp_back`` and ``tp_rank_agents`` when they attach; a TP-1 server
    has none of them and never needs them)."""

    def __init__(self, runner: Any, kv: RankKV, tp_size: int) -> None:
        self.runner, self.kv, self.tp_size = runner, kv, tp_size
        # the ranks are out of step (a send or a settle failed): TPRanks.failure reads this
        # and the engine exits
        self.broken = False
        runner.tp_kv_link = self

    def send(self, msg: ToRank) -> None:
        if self.tp_size == 1:
            return
        sink = cast(Callable[[Any], None] | None, getattr(self.runner, "step_sink", None))
        if sink is None:
            raise RuntimeError("tensor-parallel ranks are not attached; cannot move KV")
        try:
            sink(msg)
        except BaseException:
            self.broken = True
            raise

    def recv(self) -> list[FromRank]:
        """The ranks' reports since the last call (never blocks)."""
        if self.tp_size == 1:
            return []
        back = cast(Callable[[], list[FromRank]] | None, getattr(self.runner, "tp_back", None))
        return back() if back is not None else []

    def agents(self) -> list[RankAgent]:
        """Every rank's agent, by rank."""
        others: dict[int, RankAgent] = getattr(self.runner, "tp_rank_agents", {})
        return [self.kv.agent(), *(others[r] for r in range(1, self.tp_size))]
