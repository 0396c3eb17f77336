"""In-process fake KV transport: copies between tensors of one process.

For unit tests of the state machines and engine glue. Transports that share a
``FakeFabric`` can reach each other; ``FakeFabric.kill(name)`` simulates a
crashed peer, and ``cancel_fails = True`` makes ``release`` fail to cancel a
running write (as NIXL's can). A write completes (and its bytes are copied,
and its notif delivered) on the ``complete_after``-th poll, so tests can
observe "PROC".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sglang_pd.disaggregation.kv_layout import KVLayout
from sglang_pd.disaggregation.transfer.base import (
    KVTransport,
    PeerGoneError,
    TransferError,
    TransferHandle,
    TransferStatus,
)

_PREFIX = b"fake:"


@dataclass
class FakeFabric:
    nodes: dict[str, FakeKVTransport] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)

    def kill(self, name: str) -> None:
        self.dead.add(name)

    def alive(self, name: str) -> bool:
        return name in self.nodes and name not in self.dead


@dataclass
class _FakeXfer:
    src: torch.Tensor
    dst_pages: torch.Tensor
    polls_left: int


class FakeKVTransport(KVTransport):
    def __init__(
        self,
        agent_name: str,
        kv_buffer: torch.Tensor,
        fabric: FakeFabric,
        layout: KVLayout | None = None,
        complete_after: int = 1,
    ) -> None:
        if agent_name in fabric.nodes:
            raise ValueError(
                f"agent name {agent_name!r} already exists on this fabric; names must be unique"
            )
        self.agent_name = agent_name
        self.kv_buffer = kv_buffer
        self.layout = layout or KVLayout.from_tensor(kv_buffer)
        self.fabric = fabric
        self.complete_after = complete_after
        self.cancel_fails = False  # tests: release() of a running write fails, as NIXL's can
        self._peers: dict[str, KVLayout] = {}
        self._inbox: list[bytes] = []
        fabric.nodes[agent_name] = self

    def metadata(self) -> bytes:
        return _PREFIX + self.agent_name.encode()

    def add_peer(self, metadata: bytes, layout: KVLayout) -> str:
        if not metadata.startswith(_PREFIX):
            raise TransferError(f"not fake-transport metadata: {metadata[:16]!r}")
        name = metadata[len(_PREFIX) :].decode()
        if not self.fabric.alive(name):
            raise PeerGoneError(f"peer {name!r} is not on the fabric (never started or dead)")
        err = self.layout.compatible_with(layout)
        if err:
            raise TransferError(f"peer {name!r}: {err}")
        self._peers[name] = layout
        return name

    def remove_peer(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def _peer(self, peer: str) -> FakeKVTransport:
        if peer not in self._peers:
            raise PeerGoneError(f"peer {peer!r} is unknown or was removed; call add_peer first")
        return self.fabric.nodes[peer]

    def write_pages(
        self, peer: str, src_pages: Sequence[int], dst_pages: Sequence[int], notif: bytes
    ) -> TransferHandle:
        self._peer(peer)
        src, dst = self._check_pair(self._peers[peer], src_pages, dst_pages)
        if not self.fabric.alive(peer):
            return TransferHandle(
                peer, int(src.size), 0, notif, time.monotonic(), "ERR", f"peer {peer!r} is gone"
            )
        # Snapshot now: a real RDMA write reads the source around post time.
        data = self.kv_buffer[:, :, torch.from_numpy(src)].clone()
        return TransferHandle(
            peer=peer,
            num_pages=int(src.size),
            nbytes=int(src.size) * self.layout.bytes_per_page_all_layers,
            notif=notif,
            posted_at=time.monotonic(),
            impl=_FakeXfer(data, torch.from_numpy(dst), self.complete_after),
        )

    def poll(self, handle: TransferHandle) -> TransferStatus:
        if handle.status != "PROC":
            return handle.status
        xfer: _FakeXfer = handle.impl
        if not self.fabric.alive(handle.peer):
            handle.status, handle.error = "ERR", f"peer {handle.peer!r} disconnected"
            return handle.status
        xfer.polls_left -= 1
        if xfer.polls_left > 0:
            return "PROC"
        target = self.fabric.nodes[handle.peer]
        target.kv_buffer[:, :, xfer.dst_pages] = xfer.src
        if handle.notif:
            target._inbox.append(handle.notif)
        handle.status, handle.impl = "DONE", None
        return "DONE"

    def release(self, handle: TransferHandle) -> bool:
        if handle.status == "PROC":
            if self.cancel_fails:  # like NIXL when the backend cannot abort: it keeps going
                return False
            handle.status, handle.error = "ERR", "released (cancelled) before completion"
        handle.impl = None
        return True

    def send_notif(self, peer: str, msg: bytes) -> None:
        target = self._peer(peer)
        if not self.fabric.alive(peer):
            raise PeerGoneError(f"send_notif: peer {peer!r} is gone")
        target._inbox.append(msg)

    def get_notifs(self) -> list[bytes]:
        out, self._inbox = self._inbox, []
        return out

    def close(self) -> None:
        self.fabric.nodes.pop(self.agent_name, None)
