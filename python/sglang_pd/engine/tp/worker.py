"""A tensor-parallel rank > 0: ``python -m sglang_pd.engine.tp.worker ARGS_FILE RANK PORT PARENT``.

It holds its shard of the weights and of the KV heads, and runs rank 0's plans: one forward per
StepPlan, in order, and on a PD server its own KV writes and settles (rank_kv.py); nothing else
(no scheduler, no sampler, no HTTP). It exits on TPShutdown, when rank 0 dies (PR_SET_PDEATHSIG,
and a parent check while idle), or when a forward fails (its peers' collectives then fail at
once instead of hanging, and rank 0 takes the server down).
SIGTERM/SIGINT are ignored, as in rank 0: the frontend drains, then rank 0 stops us.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

import msgspec
import zmq

from sglang_pd.engine.attention import create_attention_backend
from sglang_pd.engine.build import cpu_aware_dtype
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.tp.group import JOIN_TIMEOUT_S, make_group, make_store, share_cpu_threads
from sglang_pd.engine.tp.rank_kv import RankKV, RankKVService
from sglang_pd.engine.tp.messages import (
    KVCancel,
    KVDropPeer,
    KVPeers,
    KVSettle,
    KVWrite,
    StepPlan,
    TPInit,
    TPReady,
    TPShutdown,
    decode_to_rank,
    encode,
    plan_addr,
    ready_addr,
)
from sglang_pd.models.loader import load_model
from sglang_pd.models.parallel import local_kv_heads
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger("sglang_pd.engine.tp")

IDLE_POLL_MS = 500
BUSY_POLL_MS = 1  # per-rank PD: writes or a settle in flight, checked this often
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # the parent check in the loop still catches it
    if os.getppid() != parent:  # rank 0 died before the line above
        sys.exit(1)


def main(argv: list[str]) -> int:
    args_file, rank, port, parent = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(args_file, "rb") as f:
        args = msgspec.json.decode(f.read(), type=ServerArgs)
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s [tp{rank}] %(levelname)s %(name)s: %(message)s")
    ctx = zmq.Context()
    plans = ctx.socket(zmq.PULL)
    plans.connect(plan_addr(args.ipc_dir, rank))
    ready = ctx.socket(zmq.PUSH)
    ready.connect(ready_addr(args.ipc_dir))
    ready.send(encode(TPReady(rank, "joined")))
    try:
        runner = _build(args, rank, port, plans, parent)
    except Exception as exc:
        logger.exception("rank %d failed to start", rank)
        ready.send(encode(TPReady(rank, "ready", False, f"{type(exc).__name__}: {exc}")))
        ready.close(linger=2000)
        return 1
    kv = getattr(runner, "tp_rank_kv", None)
    ready.send(encode(TPReady(rank, "ready", kv_agent=kv.kv.agent() if kv is not None else None)))
    try:
        return _serve(runner, plans, ready, parent)
    finally:
        plans.close(linger=0)
        ready.close(linger=0)
        ctx.term()


def _recv(plans: zmq.Socket, parent: int, kv: RankKVService | None = None,
          ready: zmq.Socket | None = None) -> object:
    while plans.poll(BUSY_POLL_MS if kv is not None and kv.busy else IDLE_POLL_MS) == 0:
        if os.getppid() != parent:
            raise SystemExit("rank 0 is gone")
        if kv is not None and ready is not None:
            _report(ready, kv.progress())
    return decode_to_rank(plans.recv())


def _report(ready: zmq.Socket, msgs: list) -> None:
    for msg in msgs:
        ready.send(encode(msg))


def _build(args: ServerArgs, rank: int, port: int, plans: zmq.Socket, parent: int) -> ModelRunner:
    # "joined" was sent after every import: from here on rank 0 waits in the group's
    # rendezvous, so what can fail (loading) comes after it and is reported as "ready"
    store = make_store(rank, args.tp_size, port, JOIN_TIMEOUT_S)
    group = make_group(store, rank, args.tp_size, args.device)
    if args.device == "cpu":
        share_cpu_threads(args.tp_size)
    model, cfg = load_model(args.model_path, cpu_aware_dtype(args.dtype, args.device), args.device,
                            args.load_format, group)
    attention = create_attention_backend(args.attention_backend, args.device, cuda_graph=False)
    init = _recv(plans, parent)
    if not isinstance(init, TPInit):
        raise TypeError(f"expected TPInit from rank 0, got {type(init).__name__}")
    dtype = next(model.parameters()).dtype
    pool = KVPool(cfg.num_layers, init.num_pages, args.page_size, local_kv_heads(cfg, group),
                  cfg.head_dim, dtype, args.device)
    runner = ModelRunner(model, pool, attention, max_positions=cfg.max_position_embeddings)
    runner.tp_store = store  # type: ignore[attr-defined]  # alive as long as the group
    if args.disaggregation_mode != "colocated":
        # this rank's own NIXL agent over its own pool (rank_kv.py)
        runner.tp_rank_kv = RankKVService(  # type: ignore[attr-defined]
            RankKV.create(args.disaggregation_mode, rank, pool.kv_buffer), rank)
    logger.info("rank %d ready: %d of %d KV heads, %d pages", rank, local_kv_heads(cfg, group),
                cfg.num_kv_heads, init.num_pages)
    return runner


def _serve(runner: ModelRunner, plans: zmq.Socket, ready: zmq.Socket, parent: int) -> int:
    steps = 0
    kv: RankKVService | None = getattr(runner, "tp_rank_kv", None)
    while True:
        msg = _recv(plans, parent, kv, ready)
        if isinstance(msg, TPShutdown):
            logger.info("stopping after %d steps (%s)", steps, msg.reason or "shutdown")
            return 0
        if isinstance(msg, StepPlan):
            try:
                runner.forward(runner.build_plan(msg))
            except Exception:
                logger.exception("forward failed; this rank exits (rank 0 takes the server down)")
                return 1
            steps += 1
        elif isinstance(msg, KVPeers | KVDropPeer | KVWrite | KVCancel | KVSettle):
            if kv is None:
                logger.error("got %s but this rank has no NIXL agent; exiting", type(msg).__name__)
                return 1
            _report(ready, kv.handle(msg))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
