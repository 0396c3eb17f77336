"""The engine process: ZMQ in, EngineCore steps, ZMQ out.

The loop never blocks while there is work: it drains the inbox without waiting, runs one step,
and sends that step's outputs. When idle it waits on the socket (bounded) and checks the KV
pool's conservation invariant. It exits on a Shutdown control call or when the frontend (its
parent) is gone; SIGTERM/SIGINT are the frontend's to handle (it drains, then tells us).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from multiprocessing.connection import Connection

import zmq

from sglang_pd.engine.control import handle_control
from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.engine.tp.launcher import TPRanks, tp_server_args
from sglang_pd.protocol import (
    AbortReq, BatchOut, ControlReq, ControlResp, EngineReady, GenerateReq, Shutdown, decode_to_engine, encode,
)
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger("sglang_pd.engine")

IDLE_POLL_MS = 50
STATS_INTERVAL_S = 1.0


def run_engine_process(server_args: ServerArgs, ready_conn: Connection) -> None:
    logging.basicConfig(level=server_args.log_level.upper(),
                        format="%(asctime)s [engine] %(levelname)s %(name)s: %(message)s")
    # The frontend owns SIGINT/SIGTERM: it drains in-flight requests, then sends us a shutdown
    # ControlReq. Ignoring the signals here keeps a process-group SIGTERM (systemd, k8s) from
    # killing the engine under requests that are still draining; parent death still stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop = {"flag": False}
    parent = os.getppid()
    tp: TPRanks | None = None  # ranks 1..N-1 with --tp-size N (engine/tp/)
    try:
        if server_args.tp_size > 1:
            server_args = tp_server_args(server_args)
            tp = TPRanks.start(server_args)
        core = EngineCore(server_args, tp=tp.group if tp else None)
        if tp is not None:
            tp.attach(core.runner, core.kv_pool.num_pages)
    except Exception as exc:
        logger.exception("engine failed to start")
        if tp is not None:
            tp.close("rank 0 failed to start")
        ready_conn.send_bytes(encode(EngineReady(ok=False, error=f"{type(exc).__name__}: {exc}")))
        return
    ctx = zmq.Context()
    server_args.ensure_ipc_dir()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(server_args.frontend_to_engine_addr)
    outbox = ctx.socket(zmq.PUSH)
    outbox.connect(server_args.engine_to_frontend_addr)
    ready_conn.send_bytes(encode(core.ready_info()))
    try:
        _loop(core, inbox, outbox, stop, parent, tp)
    finally:
        core.close()
        if tp is not None:
            tp.close()
        inbox.close(linger=0)
        outbox.close(linger=500)
        ctx.term()
        logger.info("engine stopped")


def _loop(core: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket, stop: dict, parent: int,
          tp: TPRanks | None = None) -> None:
    last_stats = 0.0
    last_parent_check = time.monotonic()
    while not stop["flag"]:
        wait = core.wait_s()
        if wait is None:  # idle: sleep on the socket, check the KV pool's books when nothing came
            if inbox.poll(IDLE_POLL_MS) == 0:
                core.check_integrity()
        elif wait > 0:  # a policy holds, or transfers must free pages: sleep, wake on a message
            inbox.poll(min(math.ceil(wait * 1000), IDLE_POLL_MS))
        replies: list[ControlResp] = []
        while True:
            try:
                data = inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            reply = _handle(core, data, stop)
            if reply is not None:
                replies.append(reply)
        outputs = core.step() if core.has_work or core.has_pending or core.outbox else []
        now = time.monotonic()
        stats = None
        if now - last_stats >= STATS_INTERVAL_S or outputs:
            stats = core.stats(step_samples=True)  # per-step samples for /metrics histograms
            last_stats = now
        if outputs or stats is not None:
            outbox.send(encode(BatchOut(outputs=outputs, stats=stats)))
        for reply in replies:
            outbox.send(encode(reply))
        if now - last_parent_check > 1.0:
            last_parent_check = now
            if os.getppid() != parent:
                logger.warning("frontend process is gone; engine exiting")
                return
            failure = tp.failure() if tp is not None else None
            if failure is not None:  # the ranks cannot compute apart: the server goes down
                logger.error("%s; engine exiting", failure)
                return


def _handle(core: EngineCore, data: bytes, stop: dict) -> ControlResp | None:
    """One inbound message. Nothing one message does may leave the loop: a failure answers
    that request (or call) with an error and the engine carries on."""
    try:
        msg = decode_to_engine(data)
    except Exception:
        logger.exception("undecodable message from the frontend (%d bytes); dropped", len(data))
        return None
    try:
        if isinstance(msg, GenerateReq):
            core.add_request(msg)
        elif isinstance(msg, AbortReq):
            core.abort(msg.rid)
        elif isinstance(msg, Shutdown):
            stop["flag"] = True
            core.abort("", "server shutting down")
            return ControlResp(msg.call_id, True)
        else:
            return handle_control(core, msg)
    except Exception:
        logger.exception("handling %s failed", type(msg).__name__)
        if isinstance(msg, ControlReq):
            return ControlResp(msg.call_id, False, {}, "internal error in the engine")
        if isinstance(msg, GenerateReq):
            core.fail_request(msg.rid, len(msg.input_ids))
    return None
