"""KV transport over NIXL (UCX backend by default).

Design (measured on a 2-core CPU host, UCX over loopback):

* The whole kv_buffer is registered once (DRAM on cpu, VRAM on cuda).
* One prepped descriptor list per side, one row per (layer, kind, page):
  local once at start, remote once per peer from the layout the peer sent in
  bootstrap. A request is one ``make_prepped_xfer`` WRITE with index arrays
  covering every layer's K and V of its pages. NIXL already coalesces adjacent
  descriptors, so runs of consecutive pages become single RMAs without any
  merging on our side (8K tokens, 1-token pages: 5.8 GB/s contiguous vs
  0.7 GB/s shuffled).
* Progress thread ON with a 1 ms poll delay. With it off, a WRITE only
  advances while the *target* process calls into NIXL: a decode busy for 3 s
  stalled a 4 MiB write for 3 s. NIXL's Python wrapper hard-codes
  ``pthrDelay=0``, which busy-spins a full core (measured 100% CPU while
  idle); we set it to ``progress_delay_us`` instead (3-4% CPU idle, same
  sub-ms latency). The thread lives inside NIXL/UCX and never touches engine
  state; all our methods are still called from the engine thread only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sglang_pd.disaggregation.kv_layout import KVLayout
from sglang_pd.disaggregation.transfer.base import (
    KVTransport,
    PeerGoneError,
    TransferError,
    TransferHandle,
    TransferStatus,
)

logger = logging.getLogger(__name__)

_construct_lock = threading.Lock()


def nixl_available() -> str | None:
    """None if nixl imports, else the reason it does not."""
    try:
        import nixl._api  # noqa: F401
    except (ImportError, OSError) as e:  # missing package, or a broken native library
        return f"{type(e).__name__}: {e}"
    return None


def _make_agent(name: str, progress_thread: bool, progress_delay_us: int) -> Any:
    import nixl._api as api

    config = api.nixl_agent_config(enable_prog_thread=progress_thread, backends=[])
    bind = api.nixlBind
    original = getattr(bind, "nixlAgent", None)
    if not progress_thread or original is None:
        return api.nixl_agent(name, config)

    def with_delay(agent_name: str, agent_config: Any) -> Any:
        agent_config.pthrDelay = progress_delay_us
        return original(agent_name, agent_config)

    # nixl_agent.__init__ sets pthrDelay = 0 right before constructing the
    # native agent; intercept that one constructor call (see module docstring).
    with _construct_lock:
        bind.nixlAgent = with_delay
        try:
            return api.nixl_agent(name, config)
        finally:
            bind.nixlAgent = original


def _nixl_errors() -> tuple[type[BaseException], ...]:
    """Every exception class NIXL's bindings raise (they share no base class),
    plus RuntimeError, which the Python wrapper raises itself. Programming
    errors (TypeError, KeyError...) are deliberately not caught."""
    import nixl._api as api

    found = [
        v for v in vars(api.nixlBind).values() if isinstance(v, type) and issubclass(v, Exception)
    ]
    return (RuntimeError, *found)


def _is_disconnect(e: BaseException) -> bool:
    return "Disconnect" in type(e).__name__ or "REMOTE_DISCONNECT" in str(e)


@dataclass
class _Peer:
    metadata: bytes
    layout: KVLayout
    dlist: Any  # nixl_prepped_dlist_handle


class NixlKVTransport(KVTransport):
    def __init__(
        self,
        agent_name: str,
        kv_buffer: torch.Tensor,
        layout: KVLayout | None = None,
        *,
        backend: str = "UCX",
        backend_params: dict[str, str] | None = None,
        progress_thread: bool = True,
        progress_delay_us: int = 1000,
    ) -> None:
        reason = nixl_available()
        if reason is not None:
            raise ImportError(f"NixlKVTransport needs the 'nixl' package: {reason}")
        self.agent_name = agent_name
        self.kv_buffer = kv_buffer
        self.layout = layout or KVLayout.from_tensor(kv_buffer)
        nbytes = kv_buffer.numel() * kv_buffer.element_size()
        if self.layout.base_addr != kv_buffer.data_ptr() or self.layout.region_bytes != nbytes:
            raise ValueError(
                f"layout does not describe kv_buffer: layout base 0x{self.layout.base_addr:x} "
                f"/ {self.layout.region_bytes} B vs tensor 0x{kv_buffer.data_ptr():x} / {nbytes} B"
            )
        self._peers: dict[str, _Peer] = {}
        self._closed = False
        self._errors = _nixl_errors()
        self.agent = _make_agent(agent_name, progress_thread, progress_delay_us)
        plugins = self.agent.get_plugin_list()
        if backend not in plugins:
            raise TransferError(
                f"NIXL backend {backend!r} is not available; available plugins: {plugins}"
            )
        self.agent.create_backend(backend, dict(backend_params or {}))
        lay = self.layout
        self._reg = self.agent.get_reg_descs(
            [(lay.base_addr, lay.region_bytes, lay.device_id, "")], lay.mem_type
        )
        self.agent.register_memory(self._reg)
        self._local = self.agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", lay.descriptor_table(), lay.mem_type
        )

    # ---- peers -----------------------------------------------------------
    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def add_peer(self, metadata: bytes, layout: KVLayout) -> str:
        err = self.layout.compatible_with(layout)
        if err:
            raise TransferError(err)
        try:
            name = self.agent.add_remote_agent(metadata)
        except self._errors as e:
            raise TransferError(
                f"NIXL could not load peer metadata ({len(metadata)} B): {e}"
            ) from e
        name = name.decode() if isinstance(name, bytes) else str(name)
        old = self._peers.get(name)
        if old is not None:
            if old.metadata == metadata and old.layout == layout:
                return name
            # Same agent name, new incarnation (restarted peer): rebuild its dlist.
            old.dlist.release()
        try:
            dlist = self.agent.prep_xfer_dlist(name, layout.descriptor_table(), layout.mem_type)
        except self._errors as e:
            raise TransferError(f"peer {name!r}: preparing its descriptor list failed: {e}") from e
        self._peers[name] = _Peer(metadata, layout, dlist)
        return name

    def remove_peer(self, peer: str) -> None:
        p = self._peers.pop(peer, None)
        if p is None:
            return
        for step in (p.dlist.release, lambda: self.agent.remove_remote_agent(peer)):
            try:
                step()
            except self._errors as e:  # the peer may already be gone; nothing to undo
                logger.warning("remove_peer(%s): %s", peer, e)

    def peer_layout(self, peer: str) -> KVLayout:
        return self._get_peer(peer).layout

    def _get_peer(self, peer: str) -> _Peer:
        p = self._peers.get(peer)
        if p is None:
            raise PeerGoneError(
                f"peer {peer!r} is unknown or was removed; known peers: {sorted(self._peers)}"
            )
        return p

    # ---- transfers -------------------------------------------------------
    def write_pages(
        self, peer: str, src_pages: Sequence[int], dst_pages: Sequence[int], notif: bytes
    ) -> TransferHandle:
        p = self._get_peer(peer)
        src, dst = self._check_pair(p.layout, src_pages, dst_pages)
        handle = TransferHandle(
            peer=peer,
            num_pages=int(src.size),
            nbytes=int(src.size) * self.layout.bytes_per_page_all_layers,
            notif=notif,
            posted_at=time.monotonic(),
        )
        return self.post_write(handle, lambda: self.agent.make_prepped_xfer(
            "WRITE",
            self._local,
            self.layout.descriptor_indices(src),
            p.dlist,
            p.layout.descriptor_indices(dst),
            notif,
        ))

    def post_write(
        self, handle: TransferHandle, make_xfer: Callable[[], Any], *errors: type[BaseException]
    ) -> TransferHandle:
        """Build a WRITE with ``make_xfer`` and post it; the one post sequence for every caller
        (the whole-page writer above and the per-rank slice writer in ``engine/tp/rank_kv.py``).
        A NIXL error (or one of ``errors``, the caller's own checks inside ``make_xfer``) ends
        the handle as ERR; a transfer that completes at once is finished here."""
        try:
            handle.impl = make_xfer()
            state = self.agent.transfer(handle.impl)
        except (*errors, *self._errors) as e:
            self._fail(handle, f"posting WRITE to {handle.peer!r} failed: {type(e).__name__}: {e}")
            return handle
        if state != "PROC":
            self._finish(handle, state)
        return handle

    def poll(self, handle: TransferHandle) -> TransferStatus:
        if handle.status != "PROC":
            return handle.status
        try:
            state = self.agent.check_xfer_state(handle.impl)
        except self._errors as e:
            self._fail(handle, f"WRITE to {handle.peer!r} failed: {type(e).__name__}: {e}")
            return handle.status
        if state != "PROC":
            self._finish(handle, state)
        return handle.status

    def release(self, handle: TransferHandle) -> bool:
        if handle.status != "PROC" or handle.impl is None:
            self._release_impl(handle)
            return True
        try:
            handle.impl.release()  # NIXL tries to cancel an active transfer
        except self._errors as e:
            # It could not: the handle stays valid and the WRITE may still land. The caller
            # keeps polling it (check_xfer_state) and retries; never claim it is gone.
            logger.warning(
                "cancelling the WRITE to %s failed (it may still land): %s", handle.peer, e
            )
            return False
        handle.impl = None
        handle.status, handle.error = "ERR", "released (cancelled) before completion"
        return True

    def _finish(self, handle: TransferHandle, state: str) -> None:
        if state == "DONE":
            handle.status = "DONE"
            self._release_impl(handle)
        else:
            self._fail(
                handle, f"WRITE to {handle.peer!r} returned {state} (peer gone or fabric error)"
            )

    def _fail(self, handle: TransferHandle, error: str) -> None:
        handle.status, handle.error = "ERR", error
        self._release_impl(handle)

    def _release_impl(self, handle: TransferHandle) -> None:
        impl, handle.impl = handle.impl, None
        if impl is None:
            return
        try:
            impl.release()
        except self._errors as e:
            # NIXL keeps un-releasable handles on the agent's leak list and
            # retries at agent teardown; we only log.
            logger.warning("releasing transfer to %s failed: %s", handle.peer, e)

    # ---- notifications ---------------------------------------------------
    def send_notif(self, peer: str, msg: bytes) -> None:
        self._get_peer(peer)
        try:
            self.agent.send_notif(peer, msg)
        except self._errors as e:
            cls = PeerGoneError if _is_disconnect(e) else TransferError
            raise cls(f"send_notif to {peer!r} failed: {type(e).__name__}: {e}") from e

    def get_notifs(self) -> list[bytes]:
        try:
            new = self.agent.get_new_notifs()
        except self._errors as e:
            logger.warning("get_new_notifs failed: %s", e)
            return []
        return [m for msgs in new.values() for m in msgs]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in list(self._peers):
            self.remove_peer(name)
        try:
            self._local.release()
            self.agent.deregister_memory(self._reg)
        except self._errors as e:
            logger.warning("NixlKVTransport.close(%s): %s", self.agent_name, e)
