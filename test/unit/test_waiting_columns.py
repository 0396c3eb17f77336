"""The Scheduler's columnar waiting queue (scheduling/waiting.py): its columns stay equal to the
requests through everything the Scheduler does, and every prefill policy plans the same from it
as from a plain list of the same requests (issue 20: decision time without changing decisions).
The walk's batched paths are checked against a one-request-at-a-time reference walk."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from policy_helpers import CountingKV
from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.common import Order, Queue, fcfs_finish, walk
from sglang_pd.scheduling.prefill.kairos_plus import RESCUING, URGENT, KairosPlusPrefillPolicy
from sglang_pd.scheduling.prefill.order import first_of
from sglang_pd.scheduling.registry import PREFILL_POLICIES, create_prefill_policy
from sglang_pd.scheduling.slo import no_slo_ttft_s
from sglang_pd.scheduling.types import PrefillBudget
from sglang_pd.scheduling.waiting import WaitingQueue
from sglang_pd.sim.request import SimReq

POLICIES = [*PREFILL_POLICIES, *(f"dual({p})" for p in PREFILL_POLICIES)]


def _random_reqs(rng: random.Random, n: int, start: int = 0) -> list[SimReq]:
    """Arrival order with ties, long-tailed lengths, partial prefills, prefix hits, re-prefills
    of retracted requests, SLOs and none."""
    reqs, t = [], 0.0
    for i in range(n):
        t += rng.choice((0.0, 0.0, 1e-3, 0.02, 0.3))
        prompt = min(int(rng.lognormvariate(5.0, 1.4)) + 1, 20_000)
        r = SimReq(str(start + i), t, prompt, 8, slo_ttft_s=rng.choice((None, 0.0, 0.2, 1.0, 2.0, 8.0)))
        if rng.random() < 0.2 and prompt > 1:
            r.cached_len = rng.randrange(1, prompt)
        r.kv_len = r.cached_len
        if rng.random() < 0.15:
            r.kv_len = rng.randrange(r.kv_len, prompt)  # partly prefilled
        if rng.random() < 0.05:
            r.n_generated = rng.randrange(1, 5)  # retracted: re-prefill over its output too
        reqs.append(r)
    return reqs


def _cfg(rng: random.Random, policy: str) -> PolicyConfig:
    chunk = rng.choice((64, 512, 2048))
    return PolicyConfig(
        chunked_prefill_size=chunk, max_prefill_tokens=rng.choice((chunk, 4 * chunk, 16_384)),
        prefill_max_partial=rng.choice((1, 2, 4)), slo_ttft_ms=rng.choice((None, 1000.0)),
        prefill_time_budget_ms=rng.choice((None, None, 30.0)),
        prefill_queues="dual" if policy.startswith("dual(") else "single")


def _policy(name: str, cfg: PolicyConfig):  # type: ignore[no-untyped-def]
    return create_prefill_policy(name[5:-1] if name.startswith("dual(") else name, cfg)


def _budget(cfg: PolicyConfig, slots: int, free: int) -> PrefillBudget:
    return PrefillBudget(cfg.max_prefill_tokens, cfg.chunked_prefill_size, slots, CountingKV(free))


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_plans_the_same_from_the_columns_as_from_a_list(name: str) -> None:
    rng = random.Random(POLICIES.index(name))
    for trial in range(40):
        cfg = _cfg(rng, name)
        reqs = _random_reqs(rng, rng.choice((0, 1, 5, 40, 300)))
        # the queue's ``due`` column: kept for the policies' no-SLO default (the Scheduler's
        # queue), not kept, or kept for another default (the policies must not use it then)
        cols = WaitingQueue(no_slo_s=(no_slo_ttft_s(cfg), None, 7.0)[trial % 3])
        for r in reqs:
            cols.add(r)
        plain = list(cols)
        a, b = _policy(name, cfg), _policy(name, cfg)  # state (kairos+ rescues, AWD) evolves alike
        now = (reqs[-1].arrival if reqs else 0.0) + rng.choice((0.0, 0.5, 3.0))
        for _ in range(3):
            slots, free = rng.choice((0, 1, 8, 256)), rng.choice((100, 5_000, 10**9))
            ba, bb = _budget(cfg, slots, free), _budget(cfg, slots, free)
            pa, pb = a.schedule(cols, now, ba), b.schedule(plain, now, bb)
            assert [(r.rid, n) for r, n in pa] == [(r.rid, n) for r, n in pb], (name, trial)
            assert all(x is y for (x, _), (y, _) in zip(pa, pb))
            assert (ba.token_budget, ba.new_req_slots, ba.hold_deadline) == \
                   (bb.token_budget, bb.new_req_slots, bb.hold_deadline)
            now += rng.choice((0.01, 0.4))


def _reference_walk(q: Queue, order: list[int], budget: PrefillBudget, max_partial: int, fits=None) -> list:  # type: ignore[no-untyped-def]
    """The walk one request at a time, straight from the rules in common.py's docstring."""
    plan = []
    partial = started_left = sum(1 for r in q.reqs if r.prefilled_len > r.cached_len)
    for i in order:
        req = q.reqs[i]
        rem, fresh = req.prefill_remaining, req.prefilled_len <= req.cached_len
        n_want = min(rem, budget.token_budget, budget.chunk_size)
        if fresh:
            if budget.new_req_slots <= 0:
                if started_left <= 0:
                    break
                continue
            if n_want < rem and partial >= max_partial:
                continue
        else:
            started_left -= 1
        if fits is not None:
            ok = fits(req, n_want)
            if not ok:
                if ok is None:
                    break
                continue
        n = budget.grant(req)
        if n == 0:
            break
        plan.append((req, n))
        if fresh and n < rem:
            partial += 1
        if budget.token_budget <= 0:
            break
    return plan


def test_walk_batched_paths_match_the_one_by_one_walk() -> None:
    rng = random.Random(7)
    for trial in range(400):
        reqs = _random_reqs(rng, rng.choice((1, 10, 100, 700)))
        if rng.random() < 0.1:
            for r in reqs[: len(reqs) // 2]:
                r.kv_len = r.prefill_target  # nothing left to prefill (a 0-token request)
        chunk = rng.choice((16, 256, 2048))
        order = list(range(len(reqs)))
        rng.shuffle(order)
        args = (rng.choice((chunk, 3 * chunk, 16_384)), chunk, rng.choice((-1, 0, 1, 3, 64, 512)),
                rng.choice((50, 3_000, 10**9)))
        max_partial = rng.choice((0, 1, 3))
        fits = None
        if rng.random() < 0.3:
            fits = lambda r, n: None if n > 1500 else (n % 7 != 0)  # noqa: E731
        got_b = PrefillBudget(*args[:3], CountingKV(args[3]))
        want_b = PrefillBudget(*args[:3], CountingKV(args[3]))
        cols = WaitingQueue(reqs)
        got = walk(Queue(cols), np.array(order), got_b, max_partial, fits)
        want = _reference_walk(Queue(list(reqs)), order, want_b, max_partial, fits)
        assert [(r.rid, n) for r, n in got] == [(r.rid, n) for r, n in want], trial
        assert (got_b.token_budget, got_b.new_req_slots, got_b.kv.free, got_b.granted) == \
               (want_b.token_budget, want_b.new_req_slots, want_b.kv.free, want_b.granted)


def test_fcfs_finish_runs_of_equal_arrivals() -> None:
    rng = random.Random(3)
    for _ in range(100):
        n = rng.randrange(0, 30)
        arrivals = sorted(rng.choice((0.0, 1.0, 2.0, 3.5)) for _ in range(n))
        works = [rng.random() for _ in range(n)]
        fin, t = [], 10.0
        for w in works:
            t += w
            fin.append(t)
        for i in range(n - 2, -1, -1):
            if arrivals[i] == arrivals[i + 1]:
                fin[i] = fin[i + 1]
        assert fcfs_finish(arrivals, works, 10.0) == fin


def _assert_columns(q: WaitingQueue) -> None:
    q.check()
    assert q.arrival.tolist() == [r.arrival for r in q]
    assert q.remaining.tolist() == [r.prefill_remaining for r in q]
    assert q.prefilled.tolist() == [r.prefilled_len for r in q]
    assert q.cached.tolist() == [r.cached_len for r in q]
    assert [None if math.isnan(s) else s for s in q.slo.tolist()] == [r.slo_ttft_s or None for r in q]
    assert [r.arrival for r in q] == sorted(r.arrival for r in q)


@pytest.mark.parametrize("policy", ["fcfs", "kairos+", "sjf", "lars"])
def test_scheduler_keeps_the_columns_through_chunks_preemption_retraction_and_aborts(policy: str) -> None:
    """A small KV pool so that partial prefills give their pages back and running requests are
    retracted; arrivals with ties; random aborts of waiting requests."""
    rng = random.Random(11)
    cfg = PolicyConfig(page_size=16, chunked_prefill_size=128, max_prefill_tokens=256,
                       max_running_requests=16, prefill_max_partial=4)
    sched = Scheduler(CountingAllocator(120), cfg, create_prefill_policy(policy, cfg), ContinuousDecodePolicy(cfg))
    assert isinstance(sched.waiting, WaitingQueue)
    now, made, seen = 0.0, 0, {"retract": 0, "preempt": 0, "chunk": 0}
    for _ in range(1500):
        if made < 300 and rng.random() < 0.3:
            for r in _random_reqs(rng, rng.randrange(1, 4), start=made):
                r.arrival = now - rng.choice((0.0, 0.0, 0.05))
                r.kv_len = r.cached_len = min(r.cached_len, 300)
                r.n_generated = 0
                r.prompt_len = min(r.prompt_len, 1500)
                r.output_len = rng.randrange(1, 200)
                sched.add(r)
                made += 1
        if sched.waiting and rng.random() < 0.03:
            sched.remove(rng.choice(list(sched.waiting)))  # an abort
        retracted, preempted = sched.num_retractions, sched.num_preempted_prefills
        victim = sched._victim_partial() if rng.random() < 0.3 else None
        if victim is not None:  # as when decodes grew into the reserve (core/progress.py)
            sched.preempt_prefill(victim)
        step = sched.schedule(now)
        if step is None:
            for r, _ in sched.unblock(now):
                sched.remove(r)
        elif step.mode is ForwardMode.DECODE:
            sched.after_decode(step.reqs)
            for r in step.reqs:
                r.n_generated += 1
                if r.done:
                    sched.remove(r)
        else:
            seen["chunk"] += any(n < r.prefill_remaining for r, n in step.prefill_plan)
            first = sched.after_extend(step.prefill_plan)
            sched.after_decode(step.decode_reqs)
            for r in step.decode_reqs:
                r.n_generated += 1
            for r in first:
                r.n_generated = 1
            for r in [*first, *step.decode_reqs]:
                if r.done and r in sched.running:
                    sched.remove(r)
        seen["retract"] += sched.num_retractions > retracted
        seen["preempt"] += sched.num_preempted_prefills > preempted
        _assert_columns(sched.waiting)
        sched.check_integrity()
        now += 0.01
    assert all(seen.values()), seen  # every kind of change happened


def test_list_behaviour_and_refusals() -> None:
    reqs = [SimReq(str(i), float(i // 2), 10 + i, 4, slo_ttft_s=None if i % 2 else 1.0) for i in range(6)]
    q = WaitingQueue()
    for r in reversed(reqs):
        q.add(r)  # equal arrivals keep the order they were added in
    assert [r.rid for r in q] == ["1", "0", "3", "2", "5", "4"]
    assert q == [reqs[1], reqs[0], reqs[3], reqs[2], reqs[5], reqs[4]] and [] + q == list(q)
    q.remove(reqs[3])
    assert reqs[3] not in q and reqs[2] in q and len(q) == 5
    assert q.pop(0) is reqs[1]
    q.insert(1, reqs[3])
    _assert_columns(WaitingQueue(q))  # a copy reads the requests afresh
    q.check()
    sub = q.subset([4, 0])
    assert list(sub) == [q[4], q[0]] and sub.remaining.tolist() == [q[4].prefill_remaining, q[0].prefill_remaining]
    for bad in (q.sort, q.reverse, lambda: q.__setitem__(0, reqs[0])):
        with pytest.raises(TypeError):
            bad()
    reqs[0].kv_len = 3  # changed behind the queue's back: check() notices, refresh() mends
    with pytest.raises(RuntimeError):
        q.check()
    q.refresh(reqs[0])
    q.check()
    for _ in range(200):  # growth past the first capacity
        q.append(SimReq("x", 10.0, 5, 1))
    q.check()
    q.clear()
    assert len(q) == 0 and q.remaining.size == 0


def test_queue_counts_empty_requests_and_tokens_left_as_they_change() -> None:
    """``n_empty`` and ``remaining_total`` (issue 28: the plan skips its empty-request tests and
    the sum over the queue on them) follow inserts, removals, refreshes and subsets; ``slo_or``
    is the SLO with the queue's no-SLO default."""
    reqs = [SimReq(str(i), float(i), 10 * (i + 1), 4, slo_ttft_s=None if i % 2 else 1.0) for i in range(5)]
    q = WaitingQueue(no_slo_s=30.0)
    for r in reqs:
        q.add(r)
    assert (q.n_empty, q.remaining_total) == (0, 150)
    assert q.views().slo_or.tolist() == [1.0, 30.0, 1.0, 30.0, 1.0]
    reqs[1].kv_len = 20  # all of it prefilled: nothing left
    q.refresh(reqs[1])
    assert (q.n_empty, q.remaining_total) == (1, 130)
    sub = q.subset([1, 3])
    assert (sub.n_empty, sub.remaining_total) == (1, 40)
    assert (q.subset([0, 2]).n_empty, Queue(q.subset([0, 2])).rem_total) == (0, 40)
    q.remove(reqs[1])
    assert (q.n_empty, q.remaining_total) == (0, 130)
    empty = SimReq("e", 9.0, 7, 1)
    empty.kv_len = 7
    q.add(empty)
    assert (q.n_empty, q.remaining_total, Queue(q).n_empty) == (1, 130, 1)
    q.check()
    q.pop()
    assert (q.n_empty, q.remaining_total) == (0, 130)
    q.check()
    q._empty += 1  # a count gone wrong: check() notices
    with pytest.raises(RuntimeError):
        q.check()


def test_order_reads_the_stable_order_lazily() -> None:
    """``Order.head`` / ``after`` (top-k reads of the policy's order) give exactly the stable full
    sort: ties in queue order, NaN last, by group first when groups are given."""
    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.choice((1, 7, 60, 400, 2000)))
        key = rng.choice((0.0, 1.0, 2.5, -1.0, np.nan), n) if trial % 3 == 0 else rng.random(n)
        group = rng.integers(0, 6, n) if trial % 2 else None
        if group is None:
            want = np.argsort(key, kind="stable")
        else:
            want = np.lexsort((key, group))
        for k in (1, 5, 50, n // 5 + 1, n):
            o = Order(key, group)
            assert o.head(k).tolist() == want[:k].tolist(), (trial, k)
            p = int(rng.integers(0, k + 1))
            mask = rng.random(n) < rng.choice((0.02, 0.5))
            rest = want[p:]
            assert o.after(p, mask).tolist() == rest[mask[rest]].tolist(), (trial, k, p)
        assert Order.of(want).head(3).tolist() == want[:3].tolist()


def test_request_times_array_equals_request_times() -> None:
    from sglang_pd.scheduling.cost_model import (DEFAULT_PREFILL_PRIOR, PrefillCostModel, work_features,
                                                 work_features_array)
    model = PrefillCostModel.fixed(DEFAULT_PREFILL_PRIOR)
    rng = np.random.default_rng(2)
    for _ in range(50):
        n = int(rng.integers(0, 300))
        r = rng.integers(0, 40_000, n)
        h = rng.integers(0, 30_000, n)
        chunk = int(rng.choice((64, 512, 2048, 8192)))
        got = model.request_times_array(r, h, chunk).tolist()
        assert got == model.request_times(r.tolist(), h.tolist(), chunk)
        # the float columns (WaitingQueue keeps remaining/prefilled as floats too) give the same
        assert model.request_times_array(r.astype(float), h.astype(float), chunk).tolist() == got
        zero = model.request_times_array(r, h, chunk, empty_is_zero=True).tolist()
        assert zero == [model.request_s(x, y, chunk) if x > 0 else 0.0 for x, y in zip(r.tolist(), h.tolist())]
        # the waiting queue's work features (whole numbers) give the same through ``times_of``
        feats = work_features_array(r.astype(float), h, chunk)
        assert [tuple(x) for x in np.stack(feats, 1).tolist()] == \
               [tuple(map(float, work_features(x, y, chunk))) for x, y in zip(r.tolist(), h.tolist())]
        assert model.times_of(*feats, r.astype(float)).tolist() == \
               [model.request_s(x, y, chunk) if x > 0 else model.request_times([x], [y], chunk)[0]
                for x, y in zip(r.tolist(), h.tolist())]


def test_order_rest_finds_the_first_as_the_full_sort() -> None:
    """``Order.rest`` + ``first_of`` (the walk's tail: the first in the order of a subset, found
    without sorting it) agree with the stable full sort, NaN keys and groups included, and so
    for an order given as positions."""
    rng = np.random.default_rng(9)
    for trial in range(300):
        n = int(rng.choice((1, 7, 60, 400)))
        key = rng.choice((0.0, 1.0, 2.5, -1.0, np.nan), n) if trial % 3 == 0 else rng.random(n)
        group = rng.integers(0, 6, n) if trial % 2 else None
        want = np.argsort(key, kind="stable") if group is None else np.lexsort((key, group))
        o = Order(key, group) if trial % 5 else Order.of(want)
        k = int(rng.integers(1, n + 1))
        o.head(k)
        p = int(rng.integers(0, k + 1))
        mask = rng.random(n) < rng.choice((0.05, 0.5, 1.0))
        rest = want[p:][mask[want[p:]]].tolist()
        idx, keys, groups = o.rest(p, mask.copy())
        assert sorted(idx.tolist()) == sorted(rest)
        while len(idx):  # taking the first, again and again, gives the order
            j = first_of(keys, groups)
            assert int(idx[j]) == rest.pop(0), trial
            keep = np.ones(len(idx), dtype=bool)
            keep[j] = False
            idx, keys = idx[keep], keys[keep]
            groups = None if groups is None else groups[keep]


class _KairosPlusOneByOne(KairosPlusPrefillPolicy):
    """kairos+ with its urgent-room rule asked request by request (``fits``), as first written:
    the reference for the array form (``cut``) that the policy uses."""

    def schedule(self, waiting, now, budget):  # type: ignore[no-untyped-def]
        q = Queue(waiting)
        model = self.model
        group, key, laxity, work = self.classify(q, now, model.request_s(budget.token_budget))
        rush = ((group == RESCUING) | (group == URGENT)).nonzero()[0]
        room = dict(zip(q.pick(rush), np.maximum(laxity[rush] - self.SAFETY * work[rush], 0.0).tolist()))
        spare: list = []

        def fits(req, n):  # type: ignore[no-untyped-def]
            if spare:
                delta = model.marginal_s(n, req.prefilled_len)
                if delta > spare[0]:
                    return None
                spare[0] -= delta
            if req in room:
                spare[:] = [min(spare[0], room[req])] if spare else [room[req]]
            return True

        plan = walk(q, Order(key, group), budget, self.max_partial, fits if room else None)
        self._urgent = {r for r in room if r in self._urgent} | {r for r, _ in plan if r in room}
        return plan


def test_kairos_plus_cut_plans_as_its_request_by_request_rule() -> None:
    rng = random.Random(21)
    cuts = 0
    for trial in range(60):
        cfg = dataclasses.replace(_cfg(rng, "kairos+"), prefill_time_budget_ms=None)  # no chunker: ``cut``
        reqs = _random_reqs(rng, rng.choice((5, 40, 300)))
        cols = WaitingQueue()
        for r in reqs:
            cols.add(r)
        a, b = create_prefill_policy("kairos+", cfg), _KairosPlusOneByOne(cfg)
        now = reqs[-1].arrival + rng.choice((0.0, 0.5, 3.0))
        for _ in range(4):
            slots, free = rng.choice((1, 8, 256)), rng.choice((5_000, 10**9))
            ba, bb = _budget(cfg, slots, free), _budget(cfg, slots, free)
            pa, pb = a.schedule(cols, now, ba), b.schedule(list(cols), now, bb)
            assert [(r.rid, n) for r, n in pa] == [(r.rid, n) for r, n in pb], trial
            assert a._urgent == b._urgent, trial
            cuts += bool(b._urgent)
            now += rng.choice((0.01, 0.4))
    assert cuts  # urgent requests were served (the rule was in play)
