"""Slack-guided decode policies (Kairos §3.2 Alg. 3 ``slack`` and our ``slack+``) on synthetic
step-time tables, and the real Scheduler driving them (skipping is never a retraction)."""

from __future__ import annotations

import random

import pytest

from decode_sim import kairos_model, running_req, simulate
from policy_helpers import FakeReq
from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.pacing import decode_context, next_deadline
from sglang_pd.scheduling.decode.slack import KairosSlackDecodePolicy
from sglang_pd.scheduling.decode.slack_plus import SlackPlusDecodePolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from sglang_pd.scheduling.registry import DECODE_POLICIES, create_decode_policy
from sglang_pd.sim.request import SimReq

SLACK = ("slack", "slack+")
LONG, SHORT = 131072, 8192


def policy(name: str, cfg: PolicyConfig | None = None):
    if name == "continuous":
        return create_decode_policy(name, cfg)
    return DECODE_POLICIES[name](cfg or PolicyConfig(), model=kairos_model())


def paper_case(tpot_s: float) -> list[FakeReq]:
    """Kairos §2.2 / Figure 2: one 128K request decoding beside three 8K ones."""
    return [running_req("long", LONG, tpot_s)] + [running_req(f"s{i}", SHORT, tpot_s) for i in range(3)]


def test_registry_names_and_cli_choices() -> None:
    assert isinstance(create_decode_policy("slack"), KairosSlackDecodePolicy)
    assert isinstance(create_decode_policy("slack+"), SlackPlusDecodePolicy)
    from sglang_pd.server_args import ServerArgs
    assert ServerArgs(model_path="x", decode_policy="slack+").decode_policy == "slack+"


def test_first_token_is_not_a_decode_token() -> None:
    """Alg. 3's n_gen counts decode-made tokens: with the prefill-made token counted in
    n_generated, the first decode token is due one T after t_first_token, not two."""
    r = running_req("a", 100, 0.05, t_first=1.0)
    assert next_deadline(r, 0.05, now=1.01) == pytest.approx(1.05)
    r.n_generated = 3  # first token + two decode tokens
    assert next_deadline(r, 0.05, now=1.2) == pytest.approx(1.15)
    assert decode_context(r) == 102  # prompt + 3 tokens, the newest has no KV yet


def test_first_token_counting_changes_the_slack_decision() -> None:
    """Alg. 3 as written: a short request 45 ms after its first token with a 50 ms SLO is due
    at t_first + T (5 ms away): s_min < 0 and every request decodes. Had the first token
    counted as a decode token (due at t_first + 2T) the short one would run alone."""
    T = 0.05
    reqs = [running_req("long", LONG, 10.0, t_first=0.0)] + [running_req("s", SHORT, T, t_first=0.0)]
    assert len(policy("slack").schedule(reqs, now=0.045)) == 2
    reqs[1].first_token_time = 0.05  # the same request given the extra T
    assert [r.rid for r in policy("slack").schedule(reqs, now=0.045)] == ["s"]


def test_slack_plus_pace_needs_the_first_token_excluded(monkeypatch: pytest.MonkeyPatch) -> None:
    """``slack+`` keeps the paper case on pace with deadlines t_first + T * n_generated; with
    the first token counted as a decode token (one T looser) tokens come behind the pace."""
    import sglang_pd.scheduling.decode.pacing as pacing  # slack+ reads the pace there (pace_view)
    T = 0.05
    assert max(_paper_runs("slack+").max_lateness(r, T) for r in ("long", "s0")) <= 1e-9
    monkeypatch.setattr(pacing, "next_deadline", lambda r, tpot, now: next_deadline(r, tpot, now) + tpot)
    assert max(_paper_runs("slack+").max_lateness(r, T) for r in ("long", "s0", "s1", "s2")) > 0.003


@pytest.mark.parametrize("name", SLACK)
def test_short_requests_are_packed_alone_when_slack_allows(name: str) -> None:
    reqs = paper_case(tpot_s=0.2)  # 200 ms: far more than the 46 ms decode-all step
    batch = policy(name).schedule(reqs, now=0.0)
    assert sorted(r.rid for r in batch) == ["s0", "s1", "s2"]


@pytest.mark.parametrize("now", [0.0, 0.02])
def test_without_slack_every_request_decodes(now: float) -> None:
    reqs = paper_case(tpot_s=0.03)  # 30 ms < the long request's 40.3 ms solo step
    assert len(policy("slack").schedule(reqs, now=now)) == 4
    # slack+: 47 ms leaves 0.7 ms over the 46.3 ms decode-all step: no room for a partial step
    assert len(policy("slack+").schedule(paper_case(tpot_s=0.047), now=0.0)) == 4


def test_slack_plus_keeps_the_feasible_on_pace_when_one_request_cannot_be() -> None:
    """35 ms SLO: the 128K request cannot keep it even alone (40.3 ms). ``slack`` decodes all
    every step (everyone at 46 ms per token); ``slack+`` runs the short ones on their own and
    decodes all every other step, so the short ones meet their SLO and the long one still gets
    every other step."""
    T, n = 0.035, 200
    reqs = paper_case(T)
    run = simulate(policy("slack+"), kairos_model(), reqs, {r.rid: n for r in reqs})
    for s in ("s0", "s1", "s2"):
        assert run.tpot(s) <= T
    with_long = ["long" in b for b in run.batches]
    first_done = min(len(run.tokens[s]) for s in ("s0", "s1", "s2"))  # while all four run
    assert not any(not a and not b for a, b in zip(with_long, with_long[1:first_done]))
    assert with_long[:first_done].count(False) > 20  # the short ones do run on their own
    slack = _paper_runs("slack", T=T, n=n)
    assert all(slack.tpot(s) > T for s in ("s0", "s1", "s2"))


@pytest.mark.parametrize("name", SLACK)
def test_no_slo_means_continuous(name: str) -> None:
    reqs = paper_case(tpot_s=None)  # type: ignore[arg-type]
    assert len(policy(name).schedule(reqs, now=0.0)) == 4


def _paper_runs(name: str, T: float = 0.05, n: int = 300):
    reqs = paper_case(T)
    return simulate(policy(name), kairos_model(), reqs, {r.rid: n for r in reqs})


def test_paper_case_slack_as_written_shorts_faster_long_near_slo_but_behind_pace() -> None:
    T = 0.05
    cont, slack = _paper_runs("continuous"), _paper_runs("slack")
    for s in ("s0", "s1", "s2"):  # short requests decode faster than under continuous batching
        assert slack.tpot(s) < cont.tpot(s) * 0.97
    assert slack.tpot("long") <= T  # the long one near (here within) its mean-TPOT SLO ...
    assert slack.tpot("long") > cont.tpot("long")
    # ... but Alg. 3 reserves only its solo step: some of its tokens come behind the SLO pace
    assert slack.max_lateness("long", T) > 0.003


def test_paper_case_slack_plus_keeps_everyone_on_pace() -> None:
    T = 0.05
    cont, plus, slack = _paper_runs("continuous"), _paper_runs("slack+"), _paper_runs("slack")
    for rid in ("long", "s0", "s1", "s2"):
        assert plus.max_lateness(rid, T) <= 1e-9  # every token by t_first + (k-1) T
        assert plus.tpot(rid) <= T
    for s in ("s0", "s1", "s2"):
        assert plus.tpot(s) < cont.tpot(s) * 0.97  # and the short ones still gain
    assert max(slack.max_lateness(r, T) for r in slack.tokens) > 0.003  # where slack does not


@pytest.mark.parametrize("name", SLACK)
@pytest.mark.parametrize("T", [0.02, 0.05, 0.1])
def test_no_request_is_skipped_forever(name: str, T: float) -> None:
    """Thousands of steps of arrivals (10% long, most short; T = 20 ms is infeasible for the
    long ones, 100 ms leaves much slack): every request finishes, and a request that is due
    (or behind its pace) waits at most two steps; only a request ahead of its pace is skipped."""
    rng = random.Random(7)
    reqs, out_len, arrivals = [], {}, {}
    for i in range(300):
        long = rng.random() < 0.1
        r = running_req(f"r{i}", rng.choice([32768, LONG]) if long else rng.choice([384, 2048, SHORT]), T)
        reqs.append(r)
        out_len[r.rid] = rng.randint(10, 100)
        arrivals[r.rid] = i * 0.25
    pol = policy(name)
    run = simulate(pol, kairos_model(), reqs, out_len, arrivals)
    assert len(run.batches) > 3000 and pol.num_partial_steps > (1000 if T > 0.02 else 10)
    assert all(len(run.tokens[r.rid]) == out_len[r.rid] for r in reqs)
    assert max_due_waits(run, out_len, T) <= 2


def max_due_waits(run, out_len: dict[str, int], T: float) -> int:
    """The most steps in a row that left out a running request which was due: the step started
    at or after max(its previous token, its next token's pace deadline). Counted in steps, as
    docs/decode_scheduling.md states the rule ("waits at most two steps")."""
    seen: dict[str, int] = {}
    made: dict[str, int] = {}  # rid -> tokens so far (the first, from prefill, included)
    waits: dict[str, int] = {}
    joined = sorted(run.tokens, key=lambda rid: run.tokens[rid][0])
    worst, j = 0, 0
    for batch, step in zip(run.batches, run.step_s):
        for rid in batch:
            seen[rid] = seen.get(rid, 0) + 1
        start = run.tokens[batch[0]][seen[batch[0]]] - step
        while j < len(joined) and run.tokens[joined[j]][0] <= start + 1e-12:
            made[joined[j]], waits[joined[j]] = 1, 0
            j += 1
        in_batch = set(batch)
        for rid in list(made):
            ts, k = run.tokens[rid], made[rid]
            if rid in in_batch:
                made[rid], waits[rid] = k + 1, 0
                if k + 1 == out_len[rid]:
                    del made[rid]
            elif start >= max(ts[k - 1], ts[0] + k * T) - 1e-12:
                waits[rid] += 1
                worst = max(worst, waits[rid])
    return worst


def test_requests_without_slo_are_paced_by_the_default() -> None:
    cfg = PolicyConfig(decode_no_slo_tpot_ms=300.0)
    reqs = [running_req("long", LONG, None), running_req("s", 384, 0.05)]  # type: ignore[arg-type]
    run = simulate(policy("slack+", cfg), kairos_model(), reqs, {"long": 40, "s": 400})
    assert run.max_lateness("long", 0.3) <= 1e-9
    assert run.max_lateness("s", 0.05) <= 1e-9
    assert run.tpot("s") < 0.02  # the short one runs alone most of the time


@pytest.mark.parametrize("name", SLACK)
def test_skipping_never_retracts(name: str) -> None:
    """The real Scheduler: skipped requests keep their pages and KV; num_retractions stays 0."""
    cfg = PolicyConfig(slo_tpot_ms=60.0, page_size=16, chunked_prefill_size=1 << 20,
                       max_prefill_tokens=1 << 20)
    pol = policy(name, cfg)
    sched = Scheduler(CountingAllocator(20_000), cfg, FcfsPrefillPolicy(cfg), pol)
    table = kairos_model()
    reqs = [SimReq("long", 0.0, LONG, output_len=60, slo_tpot_s=0.06)]
    reqs += [SimReq(f"s{i}", 0.0, SHORT, output_len=120, slo_tpot_s=0.06) for i in range(3)]
    for r in reqs:
        sched.add(r)
    now, skipped_steps = 0.0, 0
    while sched.has_work:
        step = sched.schedule(now)
        assert step is not None
        if step.mode is ForwardMode.EXTEND:
            now += 0.001
            for r in sched.after_extend(step.plan):
                r.n_generated, r.first_token_time = 1, now
            continue
        batch = step.decode_reqs
        others = [r for r in sched.running if r not in batch]
        before = {r.rid: (r.kv_len, list(r.pages)) for r in others}
        now += table.batch_s([decode_context(r) for r in batch])
        sched.after_decode(batch)
        skipped_steps += bool(others)
        assert {r.rid: (r.kv_len, list(r.pages)) for r in others} == before
        for r in batch:
            r.n_generated += 1
            if r.done:
                sched.remove(r)
        sched.check_integrity()
    assert skipped_steps > 10 and pol.num_partial_steps == skipped_steps
    assert sched.num_retractions == 0 and all(r.num_retractions == 0 for r in reqs)


def _lateness_at(run, rid: str, T: float, t: float) -> float:
    """Lateness of ``rid``'s last token at or before time ``t``."""
    ts = run.tokens[rid]
    k = max(i for i, x in enumerate(ts) if x <= t)
    return ts[k] - (ts[0] + k * T)


@pytest.mark.parametrize("step", [5, 10, 11, 30, 50, 51, 52])
def test_slack_plus_one_slow_step_bounded_and_back_on_pace(step: int) -> None:
    """One step 12 ms over the table (a hiccup) in the feasible paper case (46.3 ms decode-all
    step, 50 ms SLO). Bound: no token more than the overrun e late, and on pace again within
    ceil(e / (T - t_all)) = 4 steps (here: by 0.5 s after the hiccup). Before the fix the long
    request became "behind" and was served every other step: 69/159/342 ms late at 0.5/1/2 s."""
    T, e = 0.05, 0.012
    reqs = paper_case(T)
    run = simulate(policy("slack+"), kairos_model(), reqs, {r.rid: 300 for r in reqs}, overrun={step: e})
    hiccup = sum(run.step_s[:step + 1])
    for rid in run.tokens:
        assert run.max_lateness(rid, T) <= e + 1e-9
        ts = run.tokens[rid]
        assert all(t - (ts[0] + k * T) <= 1e-9 for k, t in enumerate(ts) if t > hiccup + 0.5)
    for dt in (0.5, 1.0, 2.0):
        assert _lateness_at(run, "long", T, hiccup + dt) <= 1e-9


def test_slack_plus_packing_keeps_the_chosen_requests_deadlines() -> None:
    """The long request is due in 45 ms (mandatory: under the 46.3 ms decode-all step, over its
    40.3 ms solo step); the short ones are due in 100 ms. Packing all three shorts would end the
    step at 46.3 ms, past the long request's deadline; packing two ends at 44.3 ms and the third
    short still has its slack. Every deadline that can be met is met."""
    T = 0.05
    reqs = [running_req("long", LONG, T, t_first=-0.005)]
    reqs += [running_req(f"s{i}", SHORT, T, t_first=0.05) for i in range(3)]
    pol = policy("slack+")
    batch = pol.schedule(reqs, now=0.0)
    t = pol.model.batch_s([decode_context(r) for r in batch])
    assert "long" in {r.rid for r in batch}
    assert all(t <= next_deadline(r, T, 0.0) for r in batch)
    assert all(t + pol.model.batch_s([decode_context(r) for r in reqs]) <= next_deadline(r, T, 0.0)
               for r in reqs if r not in batch)


def test_slack_plus_far_behind_requests_do_not_fix_the_step() -> None:
    """Four 32K requests behind their pace (their next token, alone, 30 ms late: over half a
    token period, not a hiccup's) beside six 2K ones ahead of it; decode-all 43.7 ms under the
    50 ms SLO. Recovering all four in every step would fix each step's membership; instead they
    are best effort (never left out two steps in a row) and the short ones run on their own,
    on pace. (Before the rule's lateness limit the first ten steps all held the four.)"""
    T = 0.05
    far = [running_req(f"l{i}", 32768, T, t_first=-0.063) for i in range(4)]
    reqs = far + [running_req(f"s{i}", 2048, T, t_first=0.02) for i in range(6)]
    run = simulate(policy("slack+"), kairos_model(), reqs, {r.rid: 100 for r in reqs})
    for i in range(6):
        assert run.max_lateness(f"s{i}", T) <= 1e-9
    with_far = [{r.rid for r in far} <= set(b) for b in run.batches[:200]]
    assert not any(not a and not b for a, b in zip(with_far, with_far[1:]))
    assert not all(with_far[:10])  # the short ones ran without them in the first steps
