"""The KV transport interface the engine drives (NIXL in production, a fake in tests).

Every method is non-blocking: ``write_pages`` posts and returns a handle, the
engine calls ``poll(handle)`` once per loop iteration until it is not "PROC".
A handle is released automatically when poll returns "DONE" or "ERR"; call
``release(handle)`` to cancel one that is still in progress (it returns False when the cancel
failed and the write may still land).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sglang_pd.disaggregation.kv_layout import KVLayout

TransferStatus = Literal["DONE", "PROC", "ERR"]


class TransferError(RuntimeError):
    """A transport operation failed; the message says which peer and why."""


class PeerGoneError(TransferError):
    """The peer is unknown, was removed, or disconnected."""


@dataclass
class TransferHandle:
    peer: str
    num_pages: int
    nbytes: int
    notif: bytes
    posted_at: float
    status: TransferStatus = "PROC"
    error: str = ""
    # Transport-private state (the NIXL xfer handle, fake copy closure, ...).
    impl: Any = field(default=None, repr=False)


class KVTransport(ABC):
    """Moves whole pages (all layers' K and V) of a local KV pool into a peer's."""

    layout: KVLayout
    agent_name: str

    @abstractmethod
    def metadata(self) -> bytes:
        """Opaque bytes a peer passes to ``add_peer`` to reach this transport."""

    @abstractmethod
    def add_peer(self, metadata: bytes, layout: KVLayout) -> str:
        """Load a peer (idempotent for the same metadata). Returns its name.

        Raises TransferError if ``layout`` is incompatible with ours."""

    @abstractmethod
    def remove_peer(self, peer: str) -> None:
        """Forget a peer; later writes to it raise PeerGoneError."""

    @abstractmethod
    def write_pages(
        self, peer: str, src_pages: Sequence[int], dst_pages: Sequence[int], notif: bytes
    ) -> TransferHandle:
        """Post one WRITE of local ``src_pages`` into the peer's ``dst_pages``
        (pairwise, every layer's K and V); ``notif`` reaches the peer's
        ``get_notifs`` after the data. Raises ValueError for bad page lists and
        PeerGoneError for a peer never added (or removed); a fabric failure
        (peer crashed, disconnected) instead yields a handle whose status is
        already "ERR", so the engine handles every runtime failure in poll."""

    @abstractmethod
    def poll(self, handle: TransferHandle) -> TransferStatus:
        """ "DONE", "PROC" or "ERR" (see handle.error). Never blocks, never raises."""

    @abstractmethod
    def release(self, handle: TransferHandle) -> bool:
        """Cancel (if still in progress) and free the handle. True when its write can no
        longer land (it had ended, or is now cancelled). False when the transport could not
        cancel it: the write may still land, the handle stays valid (status "PROC"), and the
        caller must keep polling it (or call release again) before telling the peer that
        nothing is in flight."""

    @abstractmethod
    def send_notif(self, peer: str, msg: bytes) -> None:
        """Standalone notification. Raises PeerGoneError if the peer is gone."""

    @abstractmethod
    def get_notifs(self) -> list[bytes]:
        """Notifications received since the last call (non-blocking)."""

    def close(self) -> None:
        """Release transport resources; the object is unusable afterwards."""

    def _check_pair(
        self, peer_layout: KVLayout, src_pages: Sequence[int], dst_pages: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        src = self.layout.check_pages(src_pages, "src_pages")
        dst = peer_layout.check_pages(dst_pages, "dst_pages")
        if src.size != dst.size:
            raise ValueError(
                f"src_pages has {src.size} pages but dst_pages has {dst.size}; "
                "they are paired one-to-one and must be the same length"
            )
        return src, dst
