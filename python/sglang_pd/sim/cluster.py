"""A simulated cluster of instances (sim/instance.py), routed by the router's own pure policies;
its events are driven by ``sim/event_loop.py``, its pool controller by ``sim/pool_control.py``.

An idle instance with work starts its next step at once, as the engine's loop does. A PD request
is routed at arrival to one prefill and one decode instance (as the PD router does): decode parks
it for pre-allocation (FIFO), prefill holds it aside until that pre-allocation (its Register) and
only then queues it (core/pd_rules.py: prefill_schedulable, so no hold-and-wait between the two);
the transfer streams from the first chunk (sim/transfer.py) and its end is the first token (the
decode engine flushes first tokens as their KV arrives). A decode engine reads its messages only
between steps, as the engine's loop polls: a new request registers, and arrived KV joins, when
the decode's running step ends (at once when it is idle). Colocated instances do both.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from collections.abc import Callable

from sglang_pd_router.controller import InstanceSignals, PoolController, RoleMove
from sglang_pd_router.policies import RouteRequest, WorkerView, classify, create_routing_policy

from sglang_pd.core.pd_rules import pages_for
from sglang_pd.core.step import ReqState
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim.cluster_spec import ClusterSpec, SimResult
from sglang_pd.sim.event_loop import BOOT, STEP, TIMEOUT, WAKE, XFER, run_events
from sglang_pd.sim.instance import ClusterReq, Instance, Track
from sglang_pd.sim.pool_control import instance_signals, make_controller
from sglang_pd.sim.prefix_cache import PrefixCache
from sglang_pd.sim.profiles import StepCost
from sglang_pd.sim.transfer import TransferModel
from sglang_pd.sim.workload import Arrival, Workload


def _cfg_for(base: PolicyConfig, role: str, prefill_role: str) -> PolicyConfig:
    kw: dict = {"role": role}
    if hasattr(base, "prefill_role"):
        kw["prefill_role"] = prefill_role
    return replace(base, **kw)


class Cluster:
    def __init__(self, spec: ClusterSpec, cost: StepCost, decode_cost: StepCost | None = None) -> None:
        """``decode_cost``: the decode instances' own step costs (another TP size than prefill's,
        ``--decode-tp``); None: they share ``cost``. Colocated instances use ``cost``."""
        self.spec, self.cost = spec, cost
        d_cost = decode_cost or cost
        self.transfer = TransferModel(cost.kv_bytes_per_token, spec.link_gb_s * 1e9, spec.link_latency_ms / 1e3)
        reserved = pages_for(spec.num_reserved_decode_tokens, spec.cfg.page_size)

        def make(i: int, role: str, prole: str = "both") -> Instance:
            size = spec.decode_prefix_cache_tokens if role == "decode" else spec.prefix_cache_tokens
            cache = PrefixCache(size) if size else None
            return Instance(i, role, _cfg_for(spec.cfg, role, prole), d_cost if role == "decode" else cost,
                            spec.prefill_policy, spec.decode_policy, spec.exact, cache, reserved)

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
        self.moves: list[tuple[float, RoleMove]] = []  # (time, move): the controller's history
        self.controller: PoolController | None = make_controller(spec.pool_controller, self.front, self.pd)
        self.views_d = [WorkerView(inst.name, "decode") for inst in self.decodes]
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.now = 0.0
        self.on_finish: Callable[[Track], None] | None = None
        self.num_finished = 0
        # per decode instance: requests whose KV arrived during its running step (taken at its end)
        self._kv_arrived: dict[int, list[Track]] = {}

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
            self._push(end, STEP, inst)
            return
        hold = inst.sched.hold_deadline
        if hold is not None and hold > self.now and inst.wake_at != hold:
            inst.wake_at = hold
            self._push(hold, WAKE, inst)

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
            self._push(self.now + self.spec.pd_timeout_s, BOOT, t)
            if d.step is None:  # else its loop reads the request when the step ends (_step_done)
                self._poll_decode(d)
        else:
            p.add(preq)
        self._kick(p)
        return t

    def _poll_decode(self, d: Instance) -> None:
        for r in d.preallocate():
            t = r.track
            t.decode_ready = self.now
            if d.prefix_cache is not None and t.hash_ids:
                # decode-side reuse, matched when pages are reserved (as the engine): whole
                # blocks below the one holding the last token, which always travels
                full = (t.prompt_len - 1) // d.prefix_cache.block_tokens
                t.reused_len = d.prefix_cache.match(t.hash_ids[:full], t.prompt_len)
            p = self.front[t.p_inst]
            assert t.preq is not None  # (a PD request: both sides' requests exist)
            if p.decode_reserved(t.preq):  # decode's Register: the prefill may schedule it now
                self._kick(p)
            if t.prefill_done is not None:
                self._start_transfer(t)
            else:
                self._push(self.now + self.spec.pd_timeout_s, TIMEOUT, t)

    def _start_transfer(self, t: Track) -> None:
        assert t.prefill_done is not None and t.decode_ready is not None  # (both sides ready)
        # decode-side reuse: only the pages past what decode holds cross the link (the pages
        # decode allocates stay the whole prompt's here: the cache sits beside its pool)
        t.transfer_tokens = t.prompt_len - t.reused_len
        done = self.transfer.done_at(t.transfer_tokens, min(t.last_chunk, t.transfer_tokens),
                                     t.first_chunk_done or t.prefill_done, t.prefill_done, t.decode_ready)
        t.xfer_started = True
        self._push(done, XFER, t)

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
                    self._push(now + self.spec.pd_timeout_s, TIMEOUT, t)
            else:
                t.first_token = now
                if r.done:
                    self._finish(inst, r)
        for r in done:
            self._finish(inst, r)
        if inst.role == "decode":
            for t in self._kv_arrived.pop(inst.index, []):
                self._take_kv(t, kick_decode=False)  # the loop's poll, before its next step
            self._poll_decode(inst)
        self._kick(inst)

    def _transfer_done(self, t: Track) -> None:
        if t.error:
            return
        p, d = self.front[t.p_inst], self.decodes[t.d_inst]
        assert t.preq is not None and t.dreq is not None  # (a PD request)
        p.sched.remove(t.preq)  # the prefill's pages are free again
        t.preq.state = ReqState.FINISHED
        p.in_flight -= 1
        if d.step is not None:  # the decode engine sees its KV between steps (_step_done)
            self._kv_arrived.setdefault(d.index, []).append(t)
        else:
            self._take_kv(t)
        self._kick(p)

    def _take_kv(self, t: Track, kick_decode: bool = True) -> None:
        """The decode engine takes an arrived transfer: the first token goes out, decoding starts."""
        if t.error:
            return  # failed while its KV waited for the decode's step to end
        d = self.decodes[t.d_inst]
        assert t.dreq is not None  # (a PD request)
        d.transferring -= 1
        t.first_token = self.now
        r = t.dreq
        r.n_generated = 1
        r.first_token_time = self.now  # the first token arrived with the KV
        if r.done:
            self._finish(d, r)
        else:
            d.sched.start_running(r, kv_len=t.prompt_len)
        if kick_decode:
            self._poll_decode(d)
            self._kick(d)

    def _finish(self, inst: Instance, r: ClusterReq) -> None:
        inst.sched.remove(r)
        r.state = ReqState.FINISHED
        inst.in_flight -= 1
        t = r.track
        t.finish = self.now
        if inst.role == "decode" and inst.prefix_cache is not None and t.hash_ids:
            inst.prefix_cache.insert(t.hash_ids)  # a finished request's KV stays (decode reuse)
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
        return instance_signals(self.front, self.now)

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
        return run_events(self, workload, progress, sample_s)
