"""The shortcuts that keep a prefill decision under 100 us at 1,000 waiting (issue 20) decide
exactly as the plain rules: kairos+'s classification against the rules applied request by
request, the lazily refined order against the eager one, the waiting queue's arrival-pair counts
against a recount, and the room cut's loop and array paths against each other (the work
features against ``request_s``: test_waiting_columns.py)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from policy_helpers import CountingKV
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.prefill import kairos_plus, plan
from sglang_pd.scheduling.prefill.common import Order, Queue, fcfs_finish
from sglang_pd.scheduling.prefill.kairos_plus import (LOST, ON_TIME, RESCUING, SALVAGEABLE, STARVING, URGENT,
                                                      KairosPlusPrefillPolicy)
from sglang_pd.scheduling.types import PrefillBudget
from sglang_pd.scheduling.waiting import WaitingQueue
from sglang_pd.sim.request import SimReq


def _reqs(rng: random.Random, n: int) -> list[SimReq]:
    reqs, t = [], 0.0
    for i in range(n):
        t += rng.choice((0.0, 1e-3, 0.05, 0.4))  # some equal arrivals
        prompt = min(int(rng.lognormvariate(5.5, 1.5)) + 1, 40_000)
        r = SimReq(str(i), t, prompt, 8, slo_ttft_s=rng.choice((None, 0.5, 1.0, 2.0, 8.0)))
        if rng.random() < 0.15:
            r.kv_len = rng.randrange(0, prompt)  # partly prefilled
        reqs.append(r)
    return reqs


def _groups_one_by_one(policy: KairosPlusPrefillPolicy, reqs: list[SimReq], now: float,
                       step_s: float) -> tuple[list[int], list[float]]:
    """kairos+'s groups and keys, straight from its docstring, one request at a time."""
    works = [policy.work_s(r) for r in reqs]
    fins = fcfs_finish([r.arrival for r in reqs], works, now)
    groups, keys = [], []
    for r, w, fin in zip(reqs, works, fins):
        slo, d = policy.slo_s(r), policy.deadline(r)
        lax = d - now - w
        tight = lax <= step_s + policy.SAFETY * w
        if tight and lax >= 0 and r in policy._urgent:
            g, k = RESCUING, lax
        elif now - r.arrival >= policy.starve_factor * max(slo, policy.total_work_s(r)):
            g, k = STARVING, r.arrival
        elif lax < 0:
            g, k = LOST, w
        elif tight:
            g, k = URGENT, lax
        elif fin <= d:
            g, k = ON_TIME, (fin - d) / slo / max(w, 1e-12)
        else:
            g, k = SALVAGEABLE, w
        groups.append(g)
        keys.append(k)
    return groups, keys


@pytest.mark.parametrize("columns", [True, False])
def test_kairos_plus_classify_per_request(columns: bool) -> None:
    rng = random.Random(3)
    seen: set[int] = set()
    for trial in range(120):
        cfg = PolicyConfig(chunked_prefill_size=rng.choice((512, 2048)), slo_ttft_ms=rng.choice((None, 1000.0)),
                           prefill_deadline_margin_ms=rng.choice((0.0, 50.0)))
        policy = KairosPlusPrefillPolicy(cfg)
        reqs = _reqs(rng, rng.choice((1, 20, 300)))
        waiting = WaitingQueue(chunk=cfg.chunked_prefill_size) if columns else []
        for r in reqs:
            waiting.add(r) if columns else waiting.append(r)
        now = reqs[-1].arrival + rng.choice((0.0, 0.5, 3.0, 40.0))  # 40 s: some starve
        policy._urgent = set(rng.sample(reqs, min(len(reqs), rng.choice((0, 1, 5)))))
        step_s = policy.model.request_s(cfg.max_prefill_tokens)
        group, key, _, _ = policy.classify(Queue(waiting), now, step_s)
        want_g, want_k = _groups_one_by_one(policy, reqs, now, step_s)
        assert group.tolist() == want_g, trial
        assert key.tolist() == want_k, trial  # the same float operations: equal, not close
        seen.update(want_g)
    assert seen == {RESCUING, STARVING, URGENT, ON_TIME, SALVAGEABLE, LOST}


def test_lazily_refined_order_reads_as_the_eager_one() -> None:
    """An ``Order`` whose groups from ``refine_from`` on are provisional until ``refine()``
    gives what the final groups give, whatever is read first, and refines only when it must."""
    rng = np.random.default_rng(11)
    refined_early = refined_never = 0
    for trial in range(400):
        n = int(rng.choice((1, 9, 80, 600)))
        key = rng.choice((0.0, 1.0, -2.0, np.nan), n) if trial % 4 == 0 else rng.random(n)
        group = rng.integers(0, 6, n).astype(np.uint8)
        want = np.lexsort((key, group))
        cut = 3
        lazy_g = np.where(group >= cut, cut, group).astype(np.uint8)
        lazy_k = np.where(group >= cut, -7.0, key)  # wrong keys until refined
        calls = []

        def refine() -> None:
            calls.append(1)  # noqa: B023 (refine runs within this trial: the Order is used at once)
            lazy_g[:] = group  # noqa: B023
            lazy_k[:] = key  # noqa: B023

        o = Order(lazy_k, lazy_g, refine, cut)
        k = int(rng.integers(1, n + 1))
        assert o.head(k).tolist() == want[:k].tolist(), trial
        below = int(np.count_nonzero(group < cut))
        if k <= below and 2 * k < n:
            assert not calls  # the head stayed in the final groups: no refinement
            refined_never += 1
        p = int(rng.integers(0, k + 1))
        mask = rng.random(n) < 0.5
        if trial % 3 == 0:
            assert o.after(p, mask).tolist() == want[p:][mask[want[p:]]].tolist(), trial
        elif trial % 3 == 1:
            idx, keys, groups = o.rest(p, mask.copy())
            assert sorted(idx.tolist()) == sorted(want[p:][mask[want[p:]]].tolist())
            assert np.array_equal(groups, group[idx]) and np.array_equal(keys, key[idx], equal_nan=True)
        else:
            assert o.full().tolist() == want.tolist(), trial
        assert len(calls) <= 1
        refined_early += bool(calls)
    assert refined_early and refined_never


def test_waiting_queue_counts_equal_and_unordered_arrival_neighbours() -> None:
    rng = random.Random(5)
    for trial in range(60):
        q = WaitingQueue(chunk=512)
        for step in range(200):
            op = rng.random()
            r = SimReq(f"{trial}-{step}", rng.choice((0.0, 1.0, 2.0, 3.0)) + rng.choice((0.0, 0.5)), 30, 4)
            if op < 0.4 or not q:
                q.add(r)
            elif op < 0.55:
                q.insert(rng.randrange(len(q) + 1), r)  # anywhere: may break the order
            elif op < 0.85:
                q.pop(rng.randrange(len(q)))
            elif op < 0.95:
                q.remove(q[rng.randrange(len(q))])
            else:
                q.clear()
            q.check()  # recounts the pairs and compares
            a = np.array([x.arrival for x in q])
            assert q.ordered == bool(np.all(a[1:] >= a[:-1]))
            assert q.distinct == bool(np.all(a[1:] > a[:-1]))
        sub = q.subset(list(range(0, len(q), 2)))
        sub.check()


@pytest.mark.parametrize(("module", "name", "value"), [
    (kairos_plus, "SHORT_PLAN", 0), (kairos_plus, "SHORT_PLAN", 1), (kairos_plus, "SHORT_PLAN", 8),
    (kairos_plus, "SHORT_PLAN", 10_000), (plan, "CUT_FIRST", 1), (plan, "CUT_FIRST", 3),
    (plan, "CUT_FIRST", 10_000)])
def test_room_cut_loop_and_array_paths_agree(module: object, name: str, value: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """kairos+'s plans, urgent set and its cut with the loop for none, some or all of the plan
    (SHORT_PLAN; 0 also takes the array path for the rescuing ones), and with the cut asked
    first after one, three or (never) the default number of the order's first requests
    (CUT_FIRST), equal those of the defaults (the walk asks the cut before and after its tail:
    the resumed second call is covered too)."""
    rng = random.Random(17)
    plans = []
    for mode in ("default", "patched"):
        if mode == "patched":
            monkeypatch.setattr(module, name, value)
        got = []
        for trial in range(40):
            cfg = PolicyConfig(chunked_prefill_size=rng.choice((64, 512)), max_prefill_tokens=rng.choice((512, 16_384)),
                               prefill_max_partial=rng.choice((1, 2)))
            reqs = _reqs(random.Random(trial), rng.choice((30, 300)))
            q = WaitingQueue(chunk=cfg.chunked_prefill_size)
            for r in reqs:
                q.add(r)
            policy = KairosPlusPrefillPolicy(dataclasses.replace(cfg, prefill_time_budget_ms=None))
            now = reqs[-1].arrival + rng.choice((0.0, 0.5, 2.0))
            for _ in range(3):
                budget = PrefillBudget(cfg.max_prefill_tokens, cfg.chunked_prefill_size, rng.choice((4, 256)),
                                       CountingKV(10**9))
                got.append(([(r.rid, n) for r, n in policy.schedule(q, now, budget)],
                            sorted(r.rid for r in policy._urgent)))
                now += 0.3
        plans.append(got)
        rng = random.Random(17)
    assert plans[0] == plans[1]
    assert any(urgent for _, urgent in plans[0]) and any(len(p) > 10 for p, _ in plans[0])
