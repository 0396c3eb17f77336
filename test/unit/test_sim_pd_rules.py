"""The simulator's PD rules are the engine's (issue 16, interface 3): engine/pd_rules.py is the
one definition, and the engine's DecodeSide and the simulator's decode instance, fed the same
requests and pool, pre-allocate the same requests in the same order."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from sglang_pd.engine.page_allocator import CountingAllocator
from sglang_pd.engine.pd import DecodeSide
from sglang_pd.engine.pd_rules import decode_admits, whole_prompt_pages
from sglang_pd.engine.scheduler import Scheduler
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from sglang_pd.sim.instance import ClusterReq, Instance, Track
from sglang_pd.sim.profiles import build_cost

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

    def add_request(self, room, host, port, pages, now):
        return None


@dataclass
class _Core:
    scheduler: Scheduler
    page_size: int = PAGE


def _engine_side() -> DecodeSide:
    cfg = PolicyConfig(page_size=PAGE, max_running_requests=MAX_RUNNING)
    sched = Scheduler(CountingAllocator(PAGES), cfg, FcfsPrefillPolicy(cfg), ContinuousDecodePolicy(cfg))
    return DecodeSide(_Core(sched), _Mgr(), reserved_pages=RESERVED, max_running=MAX_RUNNING)  # type: ignore[arg-type]


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
    e_sched, s_sched = eng.core.scheduler, sim.sched
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
    for path in (PKG / "engine" / "pd.py", PKG / "sim" / "instance.py"):
        assert "decode_admits" in _calls(path), path
    for path in (PKG / "engine" / "engine_core.py", PKG / "sim" / "instance.py"):
        assert "whole_prompt_pages" in _calls(path), path
