"""Two processes, real NIXL (UCX over loopback) + real bootstrap: the full PD KV hand-off.

The pytest process plays one role, a spawned child the other. KV contents are
seeded, so the decode child can check byte-exactness on its own.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
from typing import Any

import pytest
import torch

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

from sglang_pd.disaggregation.decode_manager import KVReceiverManager
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.prefill_manager import KVSenderManager
from sglang_pd.disaggregation.state import Failure, RoomUpdate
from sglang_pd.disaggregation.transfer.nixl_transport import (
    NixlKVTransport,
    nixl_available,
)

_why = nixl_available()
pytestmark = [
    pytest.mark.skipif(_why is not None, reason=f"nixl cannot be imported: {_why}"),
    pytest.mark.timeout(120),
]
ENVS = DisaggEnvs(
    bootstrap_timeout=20, waiting_timeout=20, heartbeat_interval=0.5, heartbeat_max_failure=2
)
SEED = 1234
# [layers, 2, pages, page_size, kv_heads, head_dim]: the tiny model's KV shape.
PREFILL_SHAPE = (4, 2, 40, 4, 2, 32)


def prefill_buffer(shape: tuple[int, ...] = PREFILL_SHAPE) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED)
    buf = torch.randn(shape, generator=g)
    buf[:, :, 0] = 0  # dummy page
    return buf


def decode_child(cmds: Any, out: Any, page_size: int) -> None:
    """Decode: registers rooms on command, verifies the pages on Success."""
    buf = torch.zeros(4, 2, 64, page_size, 2, 32)
    dm = KVReceiverManager(NixlKVTransport(f"decode-{os.getpid()}", buf), envs=ENVS)
    expected = prefill_buffer()
    src_of: dict[int, tuple[list[int], list[int]]] = {}
    out.put(("ready", os.getpid()))
    while True:
        try:
            cmd = cmds.get_nowait()
        except queue.Empty:
            cmd = None
        if cmd and cmd[0] == "stop":
            break
        if cmd and cmd[0] == "add":
            _, room, port, src, dst = cmd
            src_of[room] = (src, dst)
            dm.add_request(room, "127.0.0.1", port, dst, time.monotonic())
        for u in dm.poll(time.monotonic()):
            ok = None
            if u.phase == "Success":
                src, dst = src_of[u.room]
                others = [p for p in range(64) if p not in dst]
                ok = torch.equal(buf[:, :, dst], expected[:, :, src]) and bool(
                    (buf[:, :, others] == 0).all()
                )
            out.put(
                ("update", u.room, u.phase, u.failure.value if u.failure else None, u.reason, ok)
            )
        time.sleep(0.0005)
    dm.close()


def prefill_child(out: Any) -> None:
    """Prefill that acks registrations and then just idles (to be killed)."""
    t = NixlKVTransport(f"prefill-{os.getpid()}", prefill_buffer())
    pm = KVSenderManager(t, envs=ENVS, bootstrap_host="127.0.0.1", bootstrap_port=0)
    out.put(("ready", pm.server.port))
    while True:
        pm.poll(time.monotonic())
        time.sleep(0.001)


def start(target: Any, *args: Any) -> tuple[Any, Any, Any, Any]:
    ctx = mp.get_context("spawn")
    cmds, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(
        target=target,
        args=(cmds, out, *args) if target is decode_child else (out, *args),
        daemon=True,
    )
    proc.start()
    tag, value = out.get(timeout=60)
    assert tag == "ready"
    return proc, cmds, out, value


def wait_update(out: Any, pm: KVSenderManager | None, timeout: float = 30) -> tuple:
    """Next decode update, driving the prefill manager meanwhile; (decode msg, prefill updates)."""
    deadline = time.monotonic() + timeout
    pupdates: list[RoomUpdate] = []
    while time.monotonic() < deadline:
        if pm is not None:
            pupdates += pm.poll(time.monotonic())
        try:
            msg = out.get(timeout=0.001)
            if msg[0] == "update":
                return msg, pupdates
        except queue.Empty:
            pass
    raise AssertionError("no update from decode child")


@pytest.fixture
def prefill() -> Any:
    t = NixlKVTransport("prefill-main", prefill_buffer())
    pm = KVSenderManager(t, envs=ENVS, bootstrap_host="127.0.0.1", bootstrap_port=0)
    yield pm
    pm.close()
    t.close()


def test_pages_arrive_byte_exact_and_mismatch_is_refused(prefill: KVSenderManager) -> None:
    proc, cmds, out, _ = start(decode_child, 4)
    try:
        src, dst = [5, 6, 7, 20, 21, 9, 33], [60, 2, 3, 4, 17, 40, 1]
        cmds.put(("add", 77, prefill.server.port, src, dst))
        prefill.add_request(77, src, time.monotonic())
        prefill.kv_ready(77, 3, last=False, now=time.monotonic())  # chunked: 3 pages first
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.3:
            prefill.poll(time.monotonic())
        prefill.kv_ready(77, len(src), last=True, now=time.monotonic())
        msg, pupd = wait_update(out, prefill)
        assert msg[1:3] == (77, "Success") and msg[5] is True, msg
        while not pupd:
            pupd = prefill.poll(time.monotonic())
        assert pupd == [RoomUpdate(77, "Done")]
    finally:
        cmds.put(("stop",))
        proc.join(timeout=10)
    proc, cmds, out, _ = start(decode_child, 8)  # page_size 8 vs prefill's 4
    try:
        cmds.put(("add", 78, prefill.server.port, [1], [1]))
        msg, _ = wait_update(out, prefill)
        assert msg[1:4] == (78, "Failed", Failure.REFUSED.value)
        assert "page_size: local=4 remote=8" in msg[4] and "only num_pages may differ" in msg[4]
    finally:
        cmds.put(("stop",))
        proc.join(timeout=10)


def test_killed_decode_gives_err_not_hang() -> None:
    big = torch.randn(4, 2, 300, 16, 8, 128)  # 512 KiB per page id, ~150 MiB pool
    t = NixlKVTransport("prefill-big", big)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=passive_child, args=(out,), daemon=True)
    proc.start()
    md, layout_bytes = out.get(timeout=60)
    import msgspec
    from sglang_pd.disaggregation.kv_layout import KVLayout

    peer = t.add_peer(md, msgspec.msgpack.decode(layout_bytes, type=KVLayout))
    h = t.write_pages(peer, list(range(1, 257)), list(range(1, 257)), b"kv|1|0|1")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=10)
    deadline = time.monotonic() + 30
    while t.poll(h) == "PROC" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert h.status in ("DONE", "ERR")  # raced the kill either way, but never hangs
    h2 = t.write_pages(peer, [1, 2], [1, 2], b"kv|2|0|1")
    while t.poll(h2) == "PROC" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert h2.status == "ERR" and h2.error, h2
    with pytest.raises(Exception, match="send_notif"):
        t.send_notif(peer, b"hello?")
    t.remove_peer(peer)
    t.close()


def passive_child(out: Any) -> None:
    import msgspec

    buf = torch.zeros(4, 2, 300, 16, 8, 128)
    t = NixlKVTransport(f"decode-big-{os.getpid()}", buf)
    out.put((t.metadata(), msgspec.msgpack.encode(t.layout)))
    while True:
        time.sleep(1)  # never calls into NIXL: the progress thread must carry the write


def test_killed_prefill_fails_decode_room_via_heartbeat() -> None:
    proc, _, _, port = start(prefill_child)
    dm = KVReceiverManager(
        NixlKVTransport("decode-main", torch.zeros(4, 2, 16, 4, 2, 32)), envs=ENVS
    )
    try:
        dm.add_request(5, "127.0.0.1", port, [1, 2], time.monotonic())
        deadline = time.monotonic() + 30
        while dm.rooms[5].state.acked_at is None and time.monotonic() < deadline:
            dm.poll(time.monotonic())
            time.sleep(0.001)
        assert dm.rooms[5].state.acked_at is not None
        os.kill(proc.pid, signal.SIGKILL)
        updates: list[RoomUpdate] = []
        while not updates and time.monotonic() < deadline:
            updates = dm.poll(time.monotonic())
            time.sleep(0.005)
        assert [(u.room, u.failure, u.pages_releasable) for u in updates] == [
            (5, Failure.PEER_DEAD, True)
        ]
        # PEER_DEAD, not WAITING_TIMEOUT: the heartbeats (0.5 s * 2) noticed it, not the 20 s
        # waiting timeout (the failure kind says which; no wall-clock bar)
    finally:
        proc.join(timeout=5)
        dm.close()
        dm.transport.close()
