"""Rank 0's side of tensor parallelism: start ranks 1..N-1, join the group, send each step's
plan, watch the ranks, stop them.

Start-up: refuse an N the model cannot split (models/parallel.check_tp_size) before any process
starts; spawn the ranks (``python -m sglang_pd.engine.tp.worker``: plain subprocesses, since the
engine process is a daemon and may not fork multiprocessing children); wait until each says it
is up, checking that it is still alive, then build the group (every rank joins it at once);
after EngineCore is built, send TPInit (the pool size rank 0 chose) and wait for every rank's
"ready". Every wait is bounded and a rank's own error text is reported.

Lifetime: ranks die with rank 0 (PR_SET_PDEATHSIG, and a parent check), and rank 0 exits when
a rank dies (``dead_rank``, polled by the engine loop), so the frontend sees its engine die and
takes the server down. ``close`` sends TPShutdown, waits, then kills what is left.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import torch
import zmq

from sglang_pd.engine.tp.group import JOIN_TIMEOUT_S, make_group, make_store, share_cpu_threads
from sglang_pd.engine.tp.messages import (
    FromRank,
    TPInit,
    TPReady,
    TPShutdown,
    ToRank,
    decode_from_rank,
    encode,
    plan_addr,
    ready_addr,
)
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.parallel import TPGroup, check_tp_size
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
# a live rank takes a plan within microseconds (its queue is unbounded up to the HWM); only a
# rank that died (its PULL socket gone) leaves the send waiting
PLAN_SEND_TIMEOUT_S = 10.0


class TPStartError(RuntimeError):
    pass


@dataclass
class PlanStats:
    """What sending the plans cost rank 0 (encode + one send per rank), for the overhead bench."""

    plans: int = 0
    seconds: float = 0.0
    bytes: int = 0

    def summary(self) -> str:
        if not self.plans:
            return "no plans sent"
        return (f"{self.plans} plans, {self.seconds / self.plans * 1e6:.1f} us and "
                f"{self.bytes / self.plans:.0f} bytes per plan (encode + send)")


def tp_server_args(args: ServerArgs) -> ServerArgs:
    """The settings every rank runs with: no CUDA graphs (captured forwards would bypass the
    plan the other ranks follow; see docs/disaggregation.md, TP notes)."""
    return replace(args, disable_cuda_graph=True) if args.tp_size > 1 else args


@dataclass
class TPRanks:
    args: ServerArgs
    group: TPGroup
    procs: dict[int, subprocess.Popen]
    ctx: zmq.Context
    plan_socks: list[zmq.Socket]
    ready_sock: zmq.Socket
    store: object = None  # the rendezvous store lives as long as the group
    ready_timeout_s: float = 1800.0
    threads_before: int = 0  # rank 0's torch threads before sharing the cores (restored at close)
    stats: PlanStats = field(default_factory=PlanStats)
    # a forward failed on rank 0: the ranks may be inside a collective rank 0 left, so the
    # group is out of step for good and the engine must exit (engine_process polls this)
    broken: bool = False
    kv_link: Any = None  # PD: rank 0's TPLink (engine/tp/rank_kv.py; its ``broken`` counts too)
    rank_agents: dict[int, Any] = field(default_factory=dict)  # per-rank PD: each rank's agent
    _closed: bool = False

    # ------------------------------------------------------------------ start-up
    @classmethod
    def start(cls, args: ServerArgs, ready_timeout_s: float = 1800.0) -> TPRanks:
        n = args.tp_size
        check_tp_size(ModelConfig.from_pretrained(args.model_path), n)
        if args.device.startswith("cuda") and torch.cuda.device_count() < n:
            raise ValueError(f"--tp-size {n} needs {n} GPUs; this host has "
                             f"{torch.cuda.device_count()}")
        args.ensure_ipc_dir()
        store = make_store(0, n, 0, JOIN_TIMEOUT_S)
        ctx = zmq.Context()
        ready_sock = ctx.socket(zmq.PULL)
        ready_sock.bind(ready_addr(args.ipc_dir))
        plan_socks = []
        for rank in range(1, n):
            sock = ctx.socket(zmq.PUSH)
            # a PUSH with no live peer blocks a send for ever: a dead rank must fail the step
            sock.setsockopt(zmq.SNDTIMEO, int(PLAN_SEND_TIMEOUT_S * 1000))
            sock.bind(plan_addr(args.ipc_dir, rank))
            plan_socks.append(sock)
        args_file = os.path.join(args.ipc_dir, "tp_args.json")
        with open(args_file, "wb") as f:
            f.write(msgspec.json.encode(args))
        procs = {rank: subprocess.Popen([sys.executable, "-m", "sglang_pd.engine.tp.worker",
                                         args_file, str(rank), str(store.port), str(os.getpid())])
                 for rank in range(1, n)}
        ranks = cls(args, TPGroup.single(), procs, ctx, plan_socks, ready_sock, store,
                    ready_timeout_s)
        try:
            ranks._wait_all("joined", JOIN_TIMEOUT_S)
            ranks.group = make_group(store, 0, n, args.device)
            if args.device == "cpu":
                ranks.threads_before = share_cpu_threads(n)
        except BaseException:
            ranks.close()
            raise
        logger.info("tensor parallelism: %d ranks joined (%s)", n,
                    "nccl" if args.device.startswith("cuda") else "gloo")
        return ranks

    def attach(self, runner: object, num_pages: int) -> None:
        """EngineCore is built: give the ranks its pool size, wait until they are ready, then
        route every step's plan to them."""
        for sock in self.plan_socks:
            sock.send(encode(TPInit(num_pages)))
        self._wait_all("ready", self.ready_timeout_s)
        runner.step_sink = self.send  # type: ignore[attr-defined]
        runner.tp_back = self.recv_back  # type: ignore[attr-defined]  # per-rank PD reports
        runner.tp_rank_agents = self.rank_agents  # type: ignore[attr-defined]
        self.kv_link = getattr(runner, "tp_kv_link", None)  # PD servers only (rank_kv.py)
        forward = runner.forward  # type: ignore[attr-defined]

        def guarded(batch: object) -> object:
            try:
                return forward(batch)
            except BaseException:
                self.broken = True
                raise

        runner.forward = guarded  # type: ignore[attr-defined]

    def _wait_all(self, stage: str, timeout_s: float) -> None:
        waiting = set(self.procs)
        deadline = time.monotonic() + timeout_s
        while waiting:
            if self.ready_sock.poll(200):
                msg = decode_from_rank(self.ready_sock.recv())
                if not isinstance(msg, TPReady):
                    continue
                if msg.kv_agent is not None:
                    self.rank_agents[msg.rank] = msg.kv_agent
                if not msg.ok:
                    raise TPStartError(f"tensor-parallel rank {msg.rank} failed to start: {msg.error}")
                if msg.stage == stage:
                    waiting.discard(msg.rank)
                continue
            dead = self.dead_rank()
            if dead is not None:
                raise TPStartError(f"tensor-parallel rank {dead} exited with code "
                                   f"{self.procs[dead].returncode} while starting (see its log)")
            if time.monotonic() > deadline:
                raise TPStartError(f"tensor-parallel ranks {sorted(waiting)} not {stage} within "
                                   f"{timeout_s:g}s")

    # ------------------------------------------------------------------ serving
    def send(self, plan: ToRank) -> None:
        """Every other rank gets ``plan``. Raises (the step fails, its requests end with an
        error, and the engine loop's failure check takes the server down) when a rank has died
        or the group is out of step: a send to a dead rank would otherwise block the loop."""
        failure = self.failure()
        if failure is not None:
            raise RuntimeError(failure)
        t0 = time.perf_counter()
        data = encode(plan)
        for sock in self.plan_socks:
            try:
                sock.send(data)
            except zmq.Again as exc:
                self.broken = True
                raise RuntimeError(f"a tensor-parallel rank took no step plan within "
                                   f"{PLAN_SEND_TIMEOUT_S:g}s") from exc
        self.stats.plans += 1
        self.stats.bytes += len(data)
        self.stats.seconds += time.perf_counter() - t0

    def recv_back(self) -> list[FromRank]:
        """The ranks' per-rank PD reports since the last call (never blocks; rank 0's engine
        thread only, as the start-up waits are over)."""
        out = []
        while self.ready_sock.poll(0):
            out.append(decode_from_rank(self.ready_sock.recv()))
        return out

    def dead_rank(self) -> int | None:
        """A rank whose process has exited, if any."""
        return next((r for r, p in self.procs.items() if p.poll() is not None), None)

    def failure(self) -> str | None:
        """Why the server cannot go on (a rank died, or a forward failed on rank 0), or None."""
        dead = self.dead_rank()
        if dead is not None:
            return f"tensor-parallel rank {dead} died (exit code {self.procs[dead].returncode})"
        if self.kv_link is not None and self.kv_link.broken:
            return "a rank-to-rank KV transfer failed on rank 0; the ranks are out of step"
        return "a forward failed on rank 0; the ranks are out of step" if self.broken else None

    # ------------------------------------------------------------------ shutdown
    def close(self, reason: str = "") -> None:
        """Stop every rank (TPShutdown, then terminate, then kill) and free the sockets."""
        if self._closed:
            return
        self._closed = True
        data = encode(TPShutdown(reason))
        for sock in self.plan_socks:
            try:
                sock.send(data, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for rank, proc in self.procs.items():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                logger.warning("tensor-parallel rank %d did not stop; killing it", rank)
                proc.kill()
                proc.wait(5.0)
        for sock in (*self.plan_socks, self.ready_sock):
            sock.close(linger=0)
        self.ctx.term()
        ipc = self.args.ipc_dir  # ours only: the directory may be the user's (--ipc-dir)
        for name in ("tp_args.json", "tp_ready", *(f"tp_plan_{r}" for r in self.procs)):
            try:
                os.remove(os.path.join(ipc, name))
            except OSError:
                pass
        if self.threads_before:
            torch.set_num_threads(self.threads_before)
        logger.info("tensor parallelism stopped: %s", self.stats.summary())
