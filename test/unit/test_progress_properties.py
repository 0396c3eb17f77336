"""Property tests of the progress rule (core/progress.py): generated workloads through the real
torch-free Scheduler (SimReq + CountingAllocator, virtual time: progress_sim.py), for every
prefill policy x every decode policy x single/dual queues x colocated / PD prefill / PD decode.

Invariants, checked after every scheduling decision (progress_sim.drive / _check):
1. pages conserved (allocator in use == pages held by requests + quarantine) and every request's
   pages cover its KV;
2. no livelock: every request finishes or ends with a stated reason within ``step_bound``;
3. thrown-away prefill work bounded: no request's partial prefill thrown away more than
   MAX_PREFILL_PREEMPTIONS times (so at most that many prompts per request in all), never while
   no decode runs, never on a PD prefill server;
4. promises: a request whose prompt and output fit the pool is never aborted; an abort names
   its reason (larger than the pool, or a lone request filling it).
Profiles: ``ci`` (derandomized, a few examples per combination: the fixed corpus) and ``long``
(SGLANG_PD_PROPERTY_LONG=1: many random examples). Each bug of issue 28 is an @example.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from progress_sim import TokenReq, build, drive
from property_profile import property_profile
from sglang_pd.core.progress import MAX_PREFILL_PREEMPTIONS, pages_for
from sglang_pd.scheduling.registry import DECODE_POLICIES, PREFILL_POLICIES
from sglang_pd.sim.request import SimReq

PROFILE = property_profile(ci_examples=20, long_examples=300)

# a workload: (requests as (arrival ms, prompt, output, TTFT SLO s, TPOT SLO s), pool pages, config)
Workload = tuple[tuple[tuple[int, int, int, float | None, float | None], ...], int, dict]

# issue 28's bugs, as regression examples (run under every combination)
LIVELOCK_1600: Workload = (((0, 1200, 8, None, None), (15, 1200, 8, 0.5, None)), 100,
                           dict(page_size=16, chunked_prefill_size=512, max_prefill_tokens=1024,
                                max_running_requests=64, prefill_max_partial=2))
PD_WHOLE_PAGES: Workload = (((0, 1200, 1, None, None), (10, 1000, 1, 0.1, None)), 100,
                            dict(page_size=16, chunked_prefill_size=512, max_prefill_tokens=1024,
                                 max_running_requests=64, prefill_max_partial=2))
DUAL_NO_SLOT: Workload = (((0, 2000, 4, None, None), (0, 2000, 4, None, None))
                          + tuple((i, 64, 4, 0.2, None) for i in range(1, 6)), 1000,
                          dict(page_size=16, chunked_prefill_size=256, max_prefill_tokens=512,
                               max_running_requests=2, prefill_max_partial=2))


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    page_size = draw(st.sampled_from([4, 16]))
    chunk = draw(st.sampled_from([16, 64, 256, 512]))
    reqs = []
    t = 0
    for _ in range(draw(st.integers(1, 10))):
        t += draw(st.integers(0, 40))
        reqs.append((t, draw(st.integers(1, 900)), draw(st.integers(1, 24)),
                     draw(st.sampled_from([None, 0.02, 0.1, 0.5, 2.0])),
                     draw(st.sampled_from([None, 0.01, 0.05]))))
    need = max(pages_for(p + o, page_size) for _, p, o, _, _ in reqs)
    pool = draw(st.integers(max(2, need // 2), 4 * need))  # too small for some, tight, roomy
    cfg = dict(page_size=page_size, chunked_prefill_size=chunk,
               max_prefill_tokens=chunk * draw(st.sampled_from([1, 2])),
               max_running_requests=draw(st.sampled_from([1, 2, 8, 64])),
               prefill_max_partial=draw(st.sampled_from([1, 2, 4])))
    return tuple(reqs), pool, cfg


def run(prefill: str, decode: str, queues: str, role: str, wl: Workload) -> None:
    specs, pool, cfg = wl
    sched = build(prefill, decode, role, pool, prefill_queues=queues, **cfg)
    reqs = [SimReq(f"r{i}", a / 1e3, p, o, slo_ttft_s=ttft, slo_tpot_s=tpot)
            for i, (a, p, o, ttft, tpot) in enumerate(specs)]
    out = drive(sched, reqs, role)  # invariants 1-3 after every decision
    ps = cfg["page_size"]
    for r in reqs:
        if r.rid in out.aborted:  # invariant 4: only what can never fit is ended
            assert pages_for(r.prompt_len + r.output_len, ps) > pool, (r.rid, out.aborted[r.rid])
    assert out.preempted_tokens <= MAX_PREFILL_PREEMPTIONS * sum(r.prompt_len + r.output_len for r in reqs)


@pytest.mark.parametrize("role", ["colocated", "prefill", "decode"])
@pytest.mark.parametrize("queues", ["single", "dual"])
@pytest.mark.parametrize("decode", sorted(DECODE_POLICIES))
@pytest.mark.parametrize("prefill", sorted(PREFILL_POLICIES))
@settings(PROFILE)
@given(wl=workloads())
@example(wl=LIVELOCK_1600)
@example(wl=PD_WHOLE_PAGES)
@example(wl=DUAL_NO_SLOT)
def test_scheduler_makes_progress(prefill: str, decode: str, queues: str, role: str, wl: Workload) -> None:
    run(prefill, decode, queues, role, wl)


# ---- with the prefix cache (core/prefix_hits.py): requests of a few conversations whose tokens
# agree position for position, so later requests hit what earlier ones left behind
@st.composite
def cached_workloads(draw: st.DrawFn) -> tuple[Workload, tuple[int, ...]]:
    wl = draw(workloads())
    return wl, tuple(draw(st.integers(0, 2)) for _ in wl[0])


def run_cached(prefill: str, decode: str, role: str, wl: Workload, convs: tuple[int, ...]) -> list[TokenReq]:
    specs, pool, cfg = wl
    sched = build(prefill, decode, role, pool, prefix_cache=True, **cfg)
    reqs = [TokenReq(f"r{i}", a / 1e3, p, o, slo_ttft_s=ttft, slo_tpot_s=tpot, conv=c)
            for i, ((a, p, o, ttft, tpot), c) in enumerate(zip(specs, convs))]
    out = drive(sched, reqs, role)  # conservation (cached pages counted), locked pages kept
    ps = cfg["page_size"]
    for r in reqs:
        if r.rid in out.aborted:
            assert pages_for(r.prompt_len + r.output_len, ps) > pool, (r.rid, out.aborted[r.rid])
    assert sched.hits is not None
    assert sched.hits.cache.flush() >= 0 and sched.base_allocator.num_free == sched.base_allocator.num_usable
    return reqs


@pytest.mark.parametrize("role", ["colocated", "prefill"])
@pytest.mark.parametrize("prefill", ["fcfs", "sjf", "kairos+", "lars"])
@settings(PROFILE)
@given(case=cached_workloads())
def test_scheduler_with_prefix_cache_conserves_pages(prefill: str, role: str,
                                                     case: tuple[Workload, tuple[int, ...]]) -> None:
    run_cached(prefill, "continuous", role, *case)


def test_prefix_cache_hits_under_a_tight_pool() -> None:
    """One conversation's growing requests in a pool that holds about two of them: later ones
    hit (cached_len > 0), eviction makes room, every page is accounted for after every step."""
    specs = tuple((40 * i, 100 + 60 * i, 8, None, None) for i in range(6))
    wl: Workload = (specs, 60, dict(page_size=4, chunked_prefill_size=64, max_prefill_tokens=128,
                                    max_running_requests=8, prefill_max_partial=2))
    reqs = run_cached("fcfs", "continuous", "colocated", wl, (0,) * len(specs))
    assert sum(r.cached_len > 0 for r in reqs[1:]) >= 3
