"""The simulator's clock: one heap of timed events (step ends, KV transfer ends, wake-ups,
timeouts, control ticks) merged with the workload's arrivals, each handed to the cluster's handler
(``sim/cluster.py``). Time advances from event to event; a stale timeout is dropped so the
clock never runs on to it. A closed-loop workload issues its next request on every finish.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from sglang_pd.sim.cluster_spec import SimResult
from sglang_pd.sim.instance import Instance, Track
from sglang_pd.sim.workload import Workload

if TYPE_CHECKING:
    from sglang_pd.sim.cluster import Cluster

STEP, XFER, WAKE, TIMEOUT, CONTROL, BOOT = 0, 1, 2, 3, 4, 5  # event kinds (arrivals are -1)


def stale(kind: int, obj: object) -> bool:
    """A timeout that can no longer fire (the clock must not run on to it)."""
    if kind == TIMEOUT:
        return obj.xfer_started or obj.finish is not None  # type: ignore[attr-defined]
    if kind == BOOT:
        return obj.decode_ready is not None or obj.finish is not None  # type: ignore[attr-defined]
    return False


def run_events(cluster: Cluster, workload: Workload, progress: bool = False,
               sample_s: float | None = None) -> SimResult:
    wall0 = time.perf_counter()
    for inst in cluster.front:
        if inst.prefix_cache is not None:
            for ids in workload.warm_hash_ids:
                inst.prefix_cache.insert(ids)
    arrivals = workload.arrivals
    n = len(arrivals)
    tracks: list[Track] = []
    closed = workload.concurrency
    if closed:
        pending = list(reversed(arrivals))  # closed loop: pop the next on every finish
        issue_queue: list[int] = []

        def on_finish(_: Track) -> None:
            if pending:
                issue_queue.append(1)

        cluster.on_finish = on_finish
        arrivals = []
    bar = _progress(n, progress)
    horizon = arrivals[-1].arrival_s if arrivals else 0.0
    sample_s = sample_s or max(horizon / 400.0, 0.5)
    samples: list[tuple[float, list[tuple[int, int, int, float]]]] = []
    next_sample = 0.0
    insts = cluster.front + cluster.decodes
    heap = cluster._heap
    i = 0
    events = 0
    if cluster.controller is not None:
        cluster._push(cluster.spec.pool_controller.period_s, CONTROL, None)  # type: ignore[union-attr]
    if closed:
        for _ in range(min(closed, len(pending))):
            tracks.append(cluster._arrive(len(tracks), pending.pop()))
    while True:
        t_arr = arrivals[i].arrival_s if i < len(arrivals) else math.inf
        if heap and heap[0][0] <= t_arr:
            t_ev, _, kind, obj = heapq.heappop(heap)
            if kind >= TIMEOUT and stale(kind, obj):
                continue  # stale: the clock must not run on to a timeout that cannot fire
        elif i < len(arrivals):
            t_ev, kind, obj = t_arr, -1, None
        else:
            break
        events += 1
        while next_sample <= t_ev:
            samples.append((next_sample, [(len(x.sched.waiting), len(x.sched.running),
                                           len(x.sched.parked) + len(x.bootstrapping), x.token_usage())
                                          for x in insts]))
            next_sample += sample_s
        cluster.now = t_ev
        if kind == -1:
            tracks.append(cluster._arrive(i, arrivals[i]))
            i += 1
        elif kind == STEP:
            cluster._step_done(obj)  # type: ignore[arg-type]
        elif kind == XFER:
            cluster._transfer_done(obj)  # type: ignore[arg-type]
        elif kind == CONTROL:
            cluster._control()
            # keep ticking while anything else can still happen (a stale timeout cannot)
            if i < len(arrivals) or (closed and pending) or any(
                    k != CONTROL and not stale(k, o) for _, _, k, o in heap):
                period = cluster.spec.pool_controller.period_s  # type: ignore[union-attr]
                cluster._push(cluster.now + period, CONTROL, None)
        elif kind in (TIMEOUT, BOOT):
            busy = cluster._stepping(obj)  # type: ignore[arg-type]
            if busy is not None:  # the engine polls its transfers between steps, not in one
                cluster._push(busy.step_started + busy.step_s, kind, obj)
            elif kind == TIMEOUT:
                cluster._fail(obj, f"KV transfer never started within {cluster.spec.pd_timeout_s:g} s "  # type: ignore[arg-type]
                                   "(PD timeout: the other side never got ready)")
            else:
                cluster._fail(obj, f"decode did not pre-allocate within {cluster.spec.pd_timeout_s:g} s "  # type: ignore[arg-type]
                                   "of arrival (PD bootstrap timeout)")
        else:
            inst = cast(Instance, obj)
            inst.wake_at = None
            cluster._kick(inst)
        if closed:
            if not pending:
                issue_queue.clear()
            while issue_queue and pending:  # several may finish in one event
                issue_queue.pop()
                tracks.append(cluster._arrive(len(tracks), replace(pending.pop(), arrival_s=cluster.now)))
        if bar is not None and events % 4096 == 0:
            bar.update(cluster.num_finished - bar.n)
    if bar is not None:
        bar.update(n - bar.n)
        bar.close()
    for t in tracks:
        if t.finish is None and not t.error:
            t.error = "not finished when the simulation ran out of events (stuck)"
    return SimResult(tracks, insts, samples, cluster.now, time.perf_counter() - wall0, events, list(cluster.moves))


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # declared dependency; a bare install still runs, without a bar
        return None
    return tqdm(total=total, unit="req", desc="simulating", mininterval=0.5)
