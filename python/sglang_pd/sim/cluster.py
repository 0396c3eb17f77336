"""The discrete-event core: arrivals, step ends and KV transfer ends over a cluster of
instances (sim/instance.py), routed by the router's own pure policies.

Time advances from event to event (a heap); an idle instance with work starts its next step
at once, as the engine's loop does. A PD request is routed at arrival to one prefill and one
decode instance (as the PD router does): decode parks it for pre-allocation (FIFO), prefill
holds it aside until that pre-allocation (its Register) and only then queues it
(core/pd_rules.py: prefill_schedulable, so no hold-and-wait between the two); the transfer
streams from the first chunk (sim/transfer.py) and its end is the first token (the decode
engine flushes first tokens as their KV arrives). Colocated instances do both.

With a pool controller (``ClusterSpec.pool_controller``), every control period the router's own
``PoolController`` gets one ``InstanceSignals`` per short/long prefill instance, built as the
router builds them from ``/get_load``: queued prefill tokens (the router's count of tokens routed
there and not yet computed), the TTFT SLO deviation of the instance's class and the busy fraction
(the engine's ``LoadTracker``). A move switches the instance's role at once (the server's
``set_prefill_role``); the router's drain-then-switch is simplified away: the dual-queue policy
serves the other class's leftovers anyway, so nothing is stranded.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import cast

from sglang_pd_router.controller import ControllerConfig, InstanceSignals, PoolController, RoleMove
from sglang_pd_router.policies import (RouteRequest, RoutingConfig, WorkerView, classify,
                                       create_routing_policy)

from sglang_pd.core.pd_rules import pages_for
from sglang_pd.core.step import ReqState
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim.instance import ClusterReq, Instance, Track
from sglang_pd.sim.prefix_cache import PrefixCache
from sglang_pd.sim.profiles import StepCost
from sglang_pd.sim.transfer import TransferModel
from sglang_pd.sim.workload import Arrival, Workload

_STEP, _XFER, _WAKE, _TIMEOUT, _CONTROL, _BOOT = 0, 1, 2, 3, 4, 5


def _stale(kind: int, obj: object) -> bool:
    """A timeout that can no longer fire (the clock must not run on to it)."""
    if kind == _TIMEOUT:
        return obj.xfer_started or obj.finish is not None  # type: ignore[attr-defined]
    if kind == _BOOT:
        return obj.decode_ready is not None or obj.finish is not None  # type: ignore[attr-defined]
    return False


@dataclass
class ClusterSpec:
    num_prefill: int = 1
    num_decode: int = 1
    num_colocated: int = 0  # > 0: a colocated cluster (num_prefill / num_decode ignored)
    prefill_roles: list[str] | None = None  # per prefill instance: both | short | long
    prefill_policy: str = "fcfs"
    decode_policy: str = "continuous"
    router_prefill: str = "round_robin"
    router_decode: str = "round_robin"
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    cfg: PolicyConfig = field(default_factory=PolicyConfig)
    exact: bool = False  # schedulers get the true prefill cost model
    prefix_cache_tokens: int = 0  # per prefill instance; 0 = off
    num_reserved_decode_tokens: int = 512
    link_gb_s: float = 25.0
    link_latency_ms: float = 1.0
    # the transfer layer's timeouts (DisaggEnvs, 300 s): decode not pre-allocated this long
    # after arrival (prefill's bootstrap timeout), or decode ready and the prefill not done
    # this long after (decode's waiting timeout): the request fails
    pd_timeout_s: float = 300.0
    # TTFT SLO of long-class requests (new prompt tokens over routing.short_prefill_threshold)
    # carrying none; short ones get cfg.slo_ttft_ms (the router's per-class --slo-ttft-ms SHORT LONG)
    slo_ttft_s_long: float | None = None
    pool_controller: ControllerConfig | None = None  # PLA's Alg. 2 over short/long prefill roles
    seed: int = 0

    @property
    def num_gpus_instances(self) -> int:
        return self.num_colocated or self.num_prefill + self.num_decode

    def describe(self) -> str:
        shape = f"{self.num_colocated} colocated" if self.num_colocated else f"{self.num_prefill}P+{self.num_decode}D"
        return f"{shape} {self.prefill_policy}+{self.decode_policy}{' exact' if self.exact else ''}"


@dataclass
class SimResult:
    tracks: list[Track]
    instances: list[Instance]
    samples: list[tuple[float, list[tuple[int, int, int, float]]]]  # t, per instance (wait, run, park, usage)
    sim_end_s: float
    wall_s: float
    num_events: int
    moves: list[tuple[float, RoleMove]] = field(default_factory=list)  # the pool controller's


def _cfg_for(base: PolicyConfig, role: str, prefill_role: str) -> PolicyConfig:
    kw: dict = {"role": role}
    if hasattr(base, "prefill_role"):
        kw["prefill_role"] = prefill_role
    return replace(base, **kw)


class Cluster:
    def __init__(self, spec: ClusterSpec, cost: StepCost) -> None:
        self.spec, self.cost = spec, cost
        self.transfer = TransferModel(cost.kv_bytes_per_token, spec.link_gb_s * 1e9, spec.link_latency_ms / 1e3)
        reserved = pages_for(spec.num_reserved_decode_tokens, spec.cfg.page_size)

        def make(i: int, role: str, prole: str = "both") -> Instance:
            cache = PrefixCache(spec.prefix_cache_tokens) if spec.prefix_cache_tokens and role != "decode" else None
            return Instance(i, role, _cfg_for(spec.cfg, role, prole), cost, spec.prefill_policy, spec.decode_policy,
                            spec.exact, cache, reserved)

        if spec.num_colocated:
            self.front = [make(i, "colocated") for i in range(spec.num_colocated)]
            self.decodes: list[Instance] = []
        else:
            if spec.num_prefill < 1 or spec.num_decode < 1:
                raise ValueError("a PD cluster needs >= 1 prefill and >= 1 decode instance (or use --colocated N)")
            roles = spec.prefill_roles or ["both"] * spec.num_prefill
            if len(roles) != spec.num_prefill:
                raise ValueError(f"{len(roles)} prefill roles for {spec.num_prefill} prefill instances")
            self.front = [make(i, "prefill", roles[i]) for i in range(spec.num_prefill)]
            self.decodes = [make(i, "decode") for i in range(spec.num_decode)]
        self.pd = not spec.num_colocated
        self.route_p = create_routing_policy(spec.router_prefill, spec.routing, seed=spec.seed)
        self.route_d = create_routing_policy(spec.router_decode, spec.routing, seed=spec.seed + 1)
        self.views_p = [WorkerView(inst.name, "prefill", self._prole(inst)) for inst in self.front]
        self.controller: PoolController | None = None
        self.moves: list[tuple[float, RoleMove]] = []  # (time, move): the controller's history
        if spec.pool_controller is not None:
            managed = [inst for inst in self.front if self._prole(inst) in ("short", "long")]
            if not self.pd or len(managed) < 2:
                raise ValueError("the pool controller needs a PD cluster with >= 2 prefill instances given "
                                 "short/long roles (--prefill-role short,...,long)")
            for inst in managed:
                if not inst.sched.prefill_policy.serves_roles:
                    raise ValueError("the pool controller switches roles: use --prefill-queues dual")
            self.controller = PoolController(spec.pool_controller)
        self.views_d = [WorkerView(inst.name, "decode") for inst in self.decodes]
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.now = 0.0
        self.on_finish: Callable[[Track], None] | None = None
        self.num_finished = 0

    @staticmethod
    def _prole(inst: Instance) -> str:
        return inst.prefill_role

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, obj: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj))

    def _kick(self, inst: Instance) -> None:
        if inst.step is not None:
            return
        end, aborted = inst.start_step(self.now)
        for r, reason in aborted:
            self._fail(r.track, reason)
        if end is not None:
            self._push(end, _STEP, inst)
            return
        hold = inst.sched.hold_deadline
        if hold is not None and hold > self.now and inst.wake_at != hold:
            inst.wake_at = hold
            self._push(hold, _WAKE, inst)

    def _select(self, policy, views: list[WorkerView], insts: list[Instance], a: Arrival) -> Instance:
        for v, inst in zip(views, insts):
            v.in_flight = inst.in_flight
            v.queued_prefill_tokens = inst.queued_tokens
            v.num_running_reqs = len(inst.sched.running)
            v.token_usage = inst.token_usage()
            v.prefill_role = self._prole(inst) if v.kind == "prefill" else v.prefill_role
        cls = classify(a.prompt_len - a.cached_len, self.spec.routing.short_prefill_threshold)
        # Mooncake hash_ids are the prompt's blocks: what cache_aware routing matches
        i = policy.select(RouteRequest(a.prompt_len, a.cached_len, self.spec.cfg.slo_ttft_s, cls,
                                       prefix_blocks=a.hash_ids), views, self.now)
        if i is None:
            raise RuntimeError(f"routing policy {policy.name!r} chose no instance for a request")
        return insts[i]

    def _new_req(self, t: Track, rid: str) -> ClusterReq:
        cfg = self.spec.cfg
        return ClusterReq(rid, t.arrival, t.prompt_len, t.output_len, slo_ttft_s=t.slo_ttft_s or cfg.slo_ttft_s,
                          slo_tpot_s=cfg.slo_tpot_s, cached_len=t.cached_len, track=t)

    def _arrive(self, index: int, a: Arrival) -> Track:
        t = Track(index, self.now, a.prompt_len, a.output_len, a.hash_ids, a.cached_len, a.source, a.slo_ttft_s)
        # the class by new tokens, as the servers classify (a known history is not prefilled)
        t.request_class = classify(a.prompt_len - a.cached_len, self.spec.routing.short_prefill_threshold)
        if t.slo_ttft_s is None and t.request_class == "long" and self.spec.slo_ttft_s_long is not None:
            t.slo_ttft_s = self.spec.slo_ttft_s_long
        p = self._select(self.route_p, self.views_p, self.front, a)
        t.p_inst = p.index
        d = self._select(self.route_d, self.views_d, self.decodes, a) if self.pd else None
        why = p.refuses(a.prompt_len) or (d.refuses(a.prompt_len) if d is not None else None)
        if why is not None:  # a 400 at admission, before anything is queued (EngineCore._validate)
            self._fail(t, why)  # (else a prompt decode can never hold would block its FIFO)
            return t
        if p.prefix_cache is not None and a.hash_ids:
            t.cached_len = max(t.cached_len, p.prefix_cache.match(a.hash_ids, a.prompt_len))
        t.cached_len = min(t.cached_len, a.prompt_len - 1)
        preq = self._new_req(t, f"{index}")
        preq.kv_len = t.cached_len  # prefix hit: KV present (its pages are taken at the first grant)
        t.preq = preq
        p.in_flight += 1
        p.queued_tokens += a.prompt_len - t.cached_len
        if self.pd:
            assert d is not None
            p.add_pd(preq, decode_reserved=False)  # queued when decode pre-allocates (_poll_decode)
            t.d_inst = d.index
            dreq = self._new_req(t, f"{index}d")
            t.dreq = dreq
            d.in_flight += 1
            d.park_for_decode(dreq)
            self._push(self.now + self.spec.pd_timeout_s, _BOOT, t)
            self._poll_decode(d)
        else:
            p.add(preq)
        self._kick(p)
        return t

    def _poll_decode(self, d: Instance) -> None:
        for r in d.preallocate():
            t = r.track
            t.decode_ready = self.now
            p = self.front[t.p_inst]
            assert t.preq is not None  # (a PD request: both sides' requests exist)
            if p.decode_reserved(t.preq):  # decode's Register: the prefill may schedule it now
                self._kick(p)
            if t.prefill_done is not None:
                self._start_transfer(t)
            else:
                self._push(self.now + self.spec.pd_timeout_s, _TIMEOUT, t)

    def _start_transfer(self, t: Track) -> None:
        assert t.prefill_done is not None and t.decode_ready is not None  # (both sides ready)
        done = self.transfer.done_at(t.prompt_len, t.last_chunk, t.first_chunk_done or t.prefill_done,
                                     t.prefill_done, t.decode_ready)
        t.xfer_started = True
        self._push(done, _XFER, t)

    def _step_done(self, inst: Instance) -> None:
        first, done = inst.finish_step(self.now)
        now = self.now
        for r in first:
            t = r.track
            r.first_token_time = now  # as EngineCore.accept_token (pacing policies read it)
            if inst.role != "decode":
                inst.record_first_token(r, now)
            if inst.prefix_cache is not None and t.hash_ids:
                inst.prefix_cache.insert(t.hash_ids)
            if inst.role == "prefill":
                t.prefill_done = now
                inst.sched.park(r)  # pages kept until the transfer ends (PrefillSide.on_first_token)
                if t.decode_ready is not None:
                    self._start_transfer(t)
                else:
                    self._push(now + self.spec.pd_timeout_s, _TIMEOUT, t)
            else:
                t.first_token = now
                if r.done:
                    self._finish(inst, r)
        for r in done:
            self._finish(inst, r)
        if inst.role == "decode":
            self._poll_decode(inst)
        self._kick(inst)

    def _transfer_done(self, t: Track) -> None:
        if t.error:
            return
        p, d = self.front[t.p_inst], self.decodes[t.d_inst]
        assert t.preq is not None and t.dreq is not None  # (a PD request)
        p.sched.remove(t.preq)
        t.preq.state = ReqState.FINISHED
        p.in_flight -= 1
        d.transferring -= 1
        t.first_token = self.now
        r = t.dreq
        r.n_generated = 1
        r.first_token_time = self.now  # the first token arrived with the KV
        if r.done:
            self._finish(d, r)
        else:
            d.sched.start_running(r, kv_len=t.prompt_len)
        self._poll_decode(d)
        self._kick(d)
        self._kick(p)

    def _finish(self, inst: Instance, r: ClusterReq) -> None:
        inst.sched.remove(r)
        r.state = ReqState.FINISHED
        inst.in_flight -= 1
        t = r.track
        t.finish = self.now
        self.num_finished += 1
        if self.on_finish is not None:
            self.on_finish(t)

    def _stepping(self, t: Track) -> Instance | None:
        """The instance whose running step includes one of ``t``'s requests (a timeout then
        waits for the step's end: the step would advance a request already taken out)."""
        for req, insts, i in ((t.preq, self.front, t.p_inst), (t.dreq, self.decodes, t.d_inst)):
            if req is not None and i >= 0:
                step = insts[i].step
                if step is not None and any(r is req for r in step.reqs):
                    return insts[i]
        return None

    def _fail(self, t: Track, reason: str) -> None:
        """A request that can never run: taken out of both sides, its pages freed."""
        if t.error or t.finish is not None:
            return
        t.error = reason
        for req, insts in ((t.preq, self.front), (t.dreq, self.decodes)):
            if req is None or req.state is ReqState.FINISHED:
                continue
            inst = insts[t.p_inst if req is t.preq else t.d_inst]
            if req in inst.prealloc:
                inst.prealloc.remove(req)
            elif req in inst.bootstrapping:
                del inst.bootstrapping[req]
            elif req is t.dreq and req.state is ReqState.PARKED and req.pages:
                inst.transferring -= 1
            inst.sched.remove(req)
            req.state = ReqState.FINISHED
            inst.in_flight -= 1
            if inst.role == "decode":
                self._poll_decode(inst)
            self._kick(inst)
        t.finish = self.now
        self.num_finished += 1
        if self.on_finish is not None:
            self.on_finish(t)

    # ------------------------------------------------------------------ pool controller
    def signals(self) -> list[InstanceSignals]:
        """One per short/long prefill instance, as the router's ``Monitor.signals``."""
        out = []
        for inst in self.front:
            role = inst.prefill_role
            if role not in ("short", "long"):
                continue
            out.append(InstanceSignals(inst.name, role, queued_prefill_tokens=inst.queued_tokens,
                                       slo_ttft_deviation=inst.loads.mean_deviation(role),
                                       busy_fraction=inst.loads.busy_fraction(self.now)))
        return out

    def _control(self) -> None:
        assert self.controller is not None
        move = self.controller.step(self.now, self.signals())
        if move is None:
            return
        inst = next(x for x in self.front if x.name == move.url)
        inst.set_prefill_role(move.to_role)  # immediate (see the module docstring)
        self.moves.append((self.now, move))
        self._kick(inst)

    # ------------------------------------------------------------------ run
    def run(self, workload: Workload, progress: bool = False, sample_s: float | None = None) -> SimResult:
        wall0 = time.perf_counter()
        for inst in self.front:
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

            self.on_finish = on_finish
            arrivals = []
        bar = _progress(n, progress)
        horizon = arrivals[-1].arrival_s if arrivals else 0.0
        sample_s = sample_s or max(horizon / 400.0, 0.5)
        samples: list[tuple[float, list[tuple[int, int, int, float]]]] = []
        next_sample = 0.0
        insts = self.front + self.decodes
        heap = self._heap
        i = 0
        events = 0
        if self.controller is not None:
            self._push(self.spec.pool_controller.period_s, _CONTROL, None)  # type: ignore[union-attr]
        if closed:
            for _ in range(min(closed, len(pending))):
                tracks.append(self._arrive(len(tracks), pending.pop()))
        while True:
            t_arr = arrivals[i].arrival_s if i < len(arrivals) else math.inf
            if heap and heap[0][0] <= t_arr:
                t_ev, _, kind, obj = heapq.heappop(heap)
                if kind >= _TIMEOUT and _stale(kind, obj):
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
            self.now = t_ev
            if kind == -1:
                tracks.append(self._arrive(i, arrivals[i]))
                i += 1
            elif kind == _STEP:
                self._step_done(obj)  # type: ignore[arg-type]
            elif kind == _XFER:
                self._transfer_done(obj)  # type: ignore[arg-type]
            elif kind == _CONTROL:
                self._control()
                # keep ticking while anything else can still happen (a stale timeout cannot)
                if i < len(arrivals) or (closed and pending) or any(
                        k != _CONTROL and not _stale(k, o) for _, _, k, o in heap):
                    period = self.spec.pool_controller.period_s  # type: ignore[union-attr]
                    self._push(self.now + period, _CONTROL, None)
            elif kind in (_TIMEOUT, _BOOT):
                busy = self._stepping(obj)  # type: ignore[arg-type]
                if busy is not None:  # the engine polls its transfers between steps, not in one
                    self._push(busy.step_started + busy.step_s, kind, obj)
                elif kind == _TIMEOUT:
                    self._fail(obj, f"KV transfer never started within {self.spec.pd_timeout_s:g} s "  # type: ignore[arg-type]
                                    "(PD timeout: the other side never got ready)")
                else:
                    self._fail(obj, f"decode did not pre-allocate within {self.spec.pd_timeout_s:g} s "  # type: ignore[arg-type]
                                    "of arrival (PD bootstrap timeout)")
            else:
                inst = cast(Instance, obj)
                inst.wake_at = None
                self._kick(inst)
            if closed:
                if not pending:
                    issue_queue.clear()
                while issue_queue and pending:  # several may finish in one event
                    issue_queue.pop()
                    tracks.append(self._arrive(len(tracks), replace(pending.pop(), arrival_s=self.now)))
            if bar is not None and events % 4096 == 0:
                bar.update(self.num_finished - bar.n)
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()
        for t in tracks:
            if t.finish is None and not t.error:
                t.error = "not finished when the simulation ran out of events (stuck)"
        return SimResult(tracks, insts, samples, self.now, time.perf_counter() - wall0, events, list(self.moves))


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # declared dependency; a bare install still runs, without a bar
        return None
    return tqdm(total=total, unit="req", desc="simulating", mininterval=0.5)
