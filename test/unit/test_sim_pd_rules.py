"""The simulator's PD rules are the engine's (issue 16, interface 3): core/pd_rules.py is the
one definition, and the engine's DecodeSide and the simulator's decode instance, fed the same
requests and pool, pre-allocate the same requests in the same order. A prefill instance
schedules a PD request only once its decode has pre-allocated (no hold-and-wait)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.pd_rules import decode_admits, prefill_schedulable, whole_prompt_pages
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.engine.pd_decode import DecodeSide
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec, SimResult
from sglang_pd.sim.instance import ClusterReq, Instance, Track
from sglang_pd.sim.profiles import StepCost, build_cost
from sglang_pd.sim.workload import Arrival, Workload, synthetic

PKG = Path(__file__).resolve().parents[2] / "python" / "sglang_pd"
PAGE, PAGES, RESERVED, MAX_RUNNING = 4, 41, 2, 3


def test_decode_admission_rule() -> None:
    assert decode_admits(0, 0, 3, need_pages=10, reserved_pages=2, num_free=10)  # alone: no headroom needed
    assert not decode_admits(1, 0, 3, need_pages=10, reserved_pages=2, num_free=11)  # headroom for the running one
    assert decode_admits(1, 0, 3, need_pages=10, reserved_pages=2, num_free=12)
    assert not decode_admits(2, 1, 3, need_pages=1, reserved_pages=0, num_free=99)  # arriving KV counts as running
    assert not decode_admits(0, 0, 3, need_pages=11, reserved_pages=0, num_free=10)
    assert whole_prompt_pages("prefill") and not whole_prompt_pages("decode") and not whole_prompt_pages("colocated")


class _Mgr:
    """The receiver manager surface _preallocate touches: registration always succeeds."""

    def add_request(self, room, host, port, pages, now, prefix_len=0):
        return None


def _engine_side() -> DecodeSide:
    cfg = PolicyConfig(page_size=PAGE, max_running_requests=MAX_RUNNING)
    sched = Scheduler(CountingAllocator(PAGES), cfg, FcfsPrefillPolicy(cfg), ContinuousDecodePolicy(cfg))
    return DecodeSide(sched, PAGE, _Mgr(), reserved_pages=RESERVED, max_running=MAX_RUNNING)  # type: ignore[arg-type]


def _sim_side() -> Instance:
    cfg = PolicyConfig(page_size=PAGE, max_running_requests=MAX_RUNNING, role="decode")
    cost = build_cost("llama-3-8b@h100", kv_capacity_tokens=(PAGES - 1) * PAGE)
    return Instance(0, "decode", cfg, cost, "fcfs", "continuous", reserved_pages=RESERVED)


def _req(i: int, prompt: int) -> ClusterReq:
    r = ClusterReq(f"{i}", float(i), prompt, 4, track=Track(i, float(i), prompt, 4))
    r.bootstrap_room, r.bootstrap_addr = i, ("h", 1)  # type: ignore[attr-defined]
    return r


def test_engine_and_sim_preallocate_alike() -> None:
    eng, sim = _engine_side(), _sim_side()
    prompts = [60, 30, 8, 100, 4, 40, 12]
    e_reqs = [_req(i, p) for i, p in enumerate(prompts)]
    s_reqs = [_req(i, p) for i, p in enumerate(prompts)]
    e_sched, s_sched = eng.scheduler, sim.sched
    for e, s in zip(e_reqs, s_reqs):
        e_sched.park(e)
        eng.prealloc.append(e)
        sim.park_for_decode(s)
    rounds = []
    for _ in range(len(prompts)):
        eng._preallocate(0.0)
        got_sim = [r.rid for r in sim.preallocate()]
        got_eng = sorted(eng.transferring, key=lambda k: k)
        assert [r.rid for r in s_sched.parked if r.pages] == [str(k) for k in got_eng]
        assert e_sched.allocator.num_free == s_sched.allocator.num_free
        rounds.append(got_sim)
        # the oldest admitted request of each side finishes: its pages come back
        if not eng.transferring:
            break
        room = min(eng.transferring)
        e_sched.remove(eng.transferring.pop(room))
        sim_done = next(r for r in s_sched.parked if r.rid == str(room))
        s_sched.remove(sim_done)
        sim.transferring -= 1
    assert [rid for r in rounds for rid in r] == [str(i) for i in range(len(prompts))]  # FIFO, all admitted
    assert len(rounds[0]) < len(prompts)  # the pool and max_running made some wait


def _calls(path: Path) -> set[str]:
    return {n.func.id for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def test_engine_and_sim_call_the_one_rule() -> None:
    for path in (PKG / "engine" / "pd_decode.py", PKG / "sim" / "instance.py"):
        assert "decode_admits" in _calls(path), path
    for path in (PKG / "engine" / "pd_prefill.py", PKG / "sim" / "instance.py"):
        assert "prefill_schedulable" in _calls(path), path
    for path in (PKG / "engine" / "build.py", PKG / "sim" / "instance.py"):
        assert "whole_prompt_pages" in _calls(path), path


# ---------------------------------------------------------------- prefill waits for decode


def test_prefill_schedulable_rule() -> None:
    assert not prefill_schedulable(decode_reserved=False)
    assert prefill_schedulable(decode_reserved=True)
    assert prefill_schedulable(decode_reserved=False, runs_locally=True)  # health checks


class _Checked(Cluster):
    """At every instance kick: a prefill instance's scheduler (waiting, running, parked) holds
    only requests whose decode has pre-allocated, and its holding area only the others."""

    max_held = 0

    def _kick(self, inst: Instance) -> None:
        if inst.role == "prefill":
            for r in inst.sched.all_reqs():
                assert r.track.decode_ready is not None, r.rid
            for r in inst.bootstrapping:
                assert r.track.decode_ready is None and not r.pages, r.rid
            self.max_held = max(self.max_held, len(inst.bootstrapping))
        super()._kick(inst)


def _conserved(res: SimResult) -> None:
    for inst in res.instances:
        s = inst.sched
        s.check_integrity()
        assert s.allocator.num_used == 0, inst.name
        assert not (s.waiting or s.running or s.parked or inst.prealloc or inst.bootstrapping), inst.name
        assert inst.transferring == 0 and inst.in_flight == 0, inst.name


def test_memory_tight_priority_pd_has_no_hold_and_wait() -> None:
    """kairos on prefill, slack on decode, a decode pool of a few requests: before the rule,
    146 of these 200 requests timed out (prefill full of finished prompts without decode pages,
    decode's pages reserved for prompts kairos had not run) and the run took 4546 simulated s."""
    spec = ClusterSpec(num_prefill=1, num_decode=1, prefill_policy="kairos", decode_policy="slack",
                       cfg=PolicyConfig(slo_ttft_ms=2000, slo_tpot_ms=100, max_running_requests=64))
    wl = synthetic([("sharegpt-lengths", 0.9), ("fixed:6000:300", 0.1)], 200, qps=2.0, seed=3)
    cluster = _Checked(spec, build_cost("llama-3-8b@h100", kv_capacity_tokens=20_000))
    res = cluster.run(wl)
    assert [t.error for t in res.tracks if t.error] == []
    assert all(t.first_token is not None and t.finish is not None for t in res.tracks)
    assert cluster.max_held > 0  # decode memory did hold requests back from prefill
    assert all(t.decode_ready <= t.first_chunk_done for t in res.tracks)  # type: ignore[operator]
    assert res.sim_end_s < 300  # 200 requests at 2/s: no 300 s timeout was waited out
    _conserved(res)


def _toy_cost(capacity: int) -> StepCost:
    """Prefill step: 0.1 s + 1 ms per token; decode step: 10 ms; 1000 bytes of KV per token."""
    return StepCost("toy", PrefillCoeffs(launch_s=0.1, b=0.001), lambda b, ctx, cmax: 0.01, 1000.0, capacity)


def test_decode_never_reserving_fails_with_the_bootstrap_timeout_unprefilled() -> None:
    """The first request fills most of decode's pool for ~4 s; the second's decode cannot
    reserve its pages within the PD timeout (1 s): it fails without ever being prefilled; the
    third queues behind it (decode is FIFO) and does not fit either: it fails the same way."""
    spec = ClusterSpec(num_prefill=1, num_decode=1, pd_timeout_s=1.0, num_reserved_decode_tokens=0)
    arrivals = [Arrival(0.0, 1500, 400), Arrival(0.01, 1000, 2), Arrival(0.02, 600, 2)]
    res = Cluster(spec, _toy_cost(2000)).run(Workload(arrivals))
    first, second, third = res.tracks
    assert not first.error and first.finish is not None
    for t in (second, third):
        assert "bootstrap timeout" in t.error and t.first_chunk_done is None and t.decode_ready is None
        assert t.finish == pytest.approx(t.arrival + 1.0)
    assert res.instances[0].prefill_tokens == 1500  # only the first was prefilled
    _conserved(res)


def test_prompt_larger_than_a_pool_is_refused_at_arrival() -> None:
    """As EngineCore._validate: refused at once, not left at the head of decode's FIFO."""
    arrivals = [Arrival(0.0, 5000, 2), Arrival(0.01, 300, 2)]
    res = Cluster(ClusterSpec(num_prefill=1, num_decode=1), _toy_cost(2000)).run(Workload(arrivals))
    big, ok = res.tracks
    assert "KV pool holds only 2000" in big.error and big.finish == 0.0
    assert not ok.error and ok.finish is not None and ok.finish < 1.0
    _conserved(res)


def test_decode_reads_requests_and_kv_between_its_steps() -> None:
    """As the decode engine's loop: a request that arrives during a decode step registers (and
    so may start on prefill) when that step ends, and KV that lands during a step joins at its
    end; an idle decode takes both at once."""
    decode_step_s = 0.25
    cost = StepCost("toy", PrefillCoeffs(launch_s=0.1, b=0.001), lambda b, ctx, cmax: decode_step_s,
                    1000.0, 20_000)
    spec = ClusterSpec(num_prefill=1, num_decode=1)
    res = Cluster(spec, cost).run(Workload([Arrival(0.0, 100, 20), Arrival(0.3, 100, 20)]))
    first, second = res.tracks
    assert first.decode_ready == 0.0 and first.prefill_started == 0.0  # idle decode: at once
    assert first.first_token is not None and first.first_token > 0.2
    # the second arrives while the first decodes (steps of 0.25 s from its first token)
    steps_end = [first.first_token + k * decode_step_s for k in range(1, 20)]
    assert second.decode_ready == pytest.approx(min(t for t in steps_end if t > 0.3))
    assert second.prefill_started == pytest.approx(second.decode_ready)
    assert second.prefill_done is not None and second.first_token is not None
    assert second.first_token == pytest.approx(min(t for t in steps_end if t > second.prefill_done))
    _conserved(res)
