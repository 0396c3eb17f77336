"""Fault injection at the transport seam, for tests: wraps any ``KVTransport`` (the fake or NIXL).

The faults are the ways a real fabric misbehaves that the state machines must survive without
ever decoding from pages that were not written whole:

* ``delay_write_every=k, delay_write_s=t``: every k-th WRITE is posted only t seconds after the
  engine asked (a write that lands late, perhaps after the room was aborted or timed out).
  Cancelling it before it is posted succeeds, as a NIXL cancel of a queued write does.
* ``duplicate_notifs``: every notification is delivered twice (a repeated done notice).
* ``reverse_notifs``: each batch of notifications is delivered in reverse order.
* ``drop_notif_every=k``: every k-th notification is lost (its data landed; the notice did not).
* ``hold_notifs``: notifications are kept back until ``release_held()`` (tests: deliver a done
  notice for a room that was aborted meanwhile).

The engine wraps its transport when ``SGLANG_PD_TEST_KV_FAULTS`` is set, e.g.
``"duplicate_notifs,reverse_notifs,drop_notif_every=7"``; never set it in production.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sglang_pd.disaggregation.transfer.base import KVTransport, TransferHandle, TransferStatus

logger = logging.getLogger(__name__)

FAULTS_ENV = "SGLANG_PD_TEST_KV_FAULTS"


@dataclass(frozen=True)
class FaultPlan:
    delay_write_every: int = 0
    delay_write_s: float = 0.0
    duplicate_notifs: bool = False
    reverse_notifs: bool = False
    drop_notif_every: int = 0
    hold_notifs: bool = False

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``"name[=value],..."``; an unknown name or a bad value raises ValueError naming it."""
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, raw = item.partition("=")
            if name not in kinds:
                raise ValueError(f"{FAULTS_ENV}: unknown fault {name!r}; known: {sorted(kinds)}")
            kind = kinds[name]
            try:
                values[name] = (
                    raw in ("", "1", "true") if kind == "bool" else int(raw) if kind == "int"
                    else float(raw)
                )
            except ValueError:
                raise ValueError(f"{FAULTS_ENV}: {name}={raw!r} is not a valid {kind}") from None
        return cls(**values)  # type: ignore[arg-type]


@dataclass
class _Deferred:
    post: Callable[[], TransferHandle]
    post_at: float
    inner: TransferHandle | None = None


@dataclass
class FaultyTransport(KVTransport):
    inner: KVTransport
    plan: FaultPlan
    clock: Callable[[], float] = time.monotonic
    held: list[bytes] = field(default_factory=list)
    writes: int = 0
    notifs: int = 0
    injected: dict[str, int] = field(default_factory=dict)
    _ready: list[bytes] = field(default_factory=list)  # released by release_held()

    def __post_init__(self) -> None:
        self.layout = self.inner.layout
        self.agent_name = self.inner.agent_name

    def _count(self, fault: str) -> None:
        self.injected[fault] = self.injected.get(fault, 0) + 1

    def metadata(self) -> bytes:
        return self.inner.metadata()

    def add_peer(self, metadata: bytes, layout) -> str:
        return self.inner.add_peer(metadata, layout)

    def remove_peer(self, peer: str) -> None:
        self.inner.remove_peer(peer)

    def write_pages(
        self, peer: str, src_pages: Sequence[int], dst_pages: Sequence[int], notif: bytes
    ) -> TransferHandle:
        self.writes += 1
        every = self.plan.delay_write_every
        if not every or self.writes % every:
            return self.inner.write_pages(peer, src_pages, dst_pages, notif)
        self._count("delay_write")
        self.inner._check_pair(self.inner.layout, src_pages, src_pages)  # bad pages raise now
        src, dst = list(src_pages), list(dst_pages)
        return TransferHandle(
            peer, len(src), 0, notif, self.clock(),
            impl=_Deferred(lambda: self.inner.write_pages(peer, src, dst, notif),
                           self.clock() + self.plan.delay_write_s),
        )

    def poll(self, handle: TransferHandle) -> TransferStatus:
        d = handle.impl
        if not isinstance(d, _Deferred):
            return self.inner.poll(handle)
        if d.inner is None:
            if self.clock() < d.post_at:
                return "PROC"
            try:
                d.inner = d.post()
            except Exception as e:  # noqa: BLE001 (the peer was removed meanwhile)
                handle.status, handle.error = "ERR", f"{type(e).__name__}: {e}"
                return "ERR"
        status = self.inner.poll(d.inner)
        handle.status, handle.error = status, d.inner.error
        return status

    def release(self, handle: TransferHandle) -> bool:
        d = handle.impl
        if not isinstance(d, _Deferred):
            return self.inner.release(handle)
        if d.inner is None:  # never posted: nothing can land
            handle.status, handle.error = "ERR", "released (cancelled) before it was posted"
            return True
        ok = self.inner.release(d.inner)
        if ok:
            handle.status = d.inner.status if d.inner.status != "PROC" else "ERR"
        return ok

    def send_notif(self, peer: str, msg: bytes) -> None:
        self.inner.send_notif(peer, msg)

    def get_notifs(self) -> list[bytes]:
        out, self._ready = self._ready, []
        for n in self.inner.get_notifs():
            self.notifs += 1
            every = self.plan.drop_notif_every
            if every and self.notifs % every == 0:
                self._count("drop_notif")
                continue
            out.append(n)
            if self.plan.duplicate_notifs:
                self._count("duplicate_notif")
                out.append(n)
        if self.plan.reverse_notifs and len(out) > 1:  # (released held ones included)
            self._count("reverse_notifs")
            out.reverse()
        if self.plan.hold_notifs:
            self.held.extend(out)
            return []
        return out

    def release_held(self) -> None:
        """Deliver the held notifications with the next ``get_notifs`` (and hold no more)."""
        self.plan = dataclasses.replace(self.plan, hold_notifs=False)
        self._ready, self.held = self._ready + self.held, []

    def close(self) -> None:
        if self.injected:
            logger.warning("injected KV transport faults: %s", self.injected)
        self.inner.close()


def maybe_wrap(transport: KVTransport, env: dict[str, str]) -> KVTransport:
    """The transport wrapped in the faults ``SGLANG_PD_TEST_KV_FAULTS`` names, if it is set."""
    text = env.get(FAULTS_ENV, "")
    if not text:
        return transport
    plan = FaultPlan.parse(text)
    logger.warning("%s=%r: injecting KV transport faults (tests only)", FAULTS_ENV, text)
    return FaultyTransport(transport, plan)
