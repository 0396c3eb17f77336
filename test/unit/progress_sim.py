"""A virtual-time driver of the real torch-free ``Scheduler`` with ``SimReq`` and a
``CountingAllocator`` (as sim/instance.py drives it), checking the progress rule's invariants
(core/progress.py) after every step. Used by test_progress.py and test_progress_properties.py.

Roles: ``colocated`` (prefill then decode here); ``prefill`` (whole-prompt pages, the request
parked with its pages after its first token until its KV transfer ends); ``decode`` (pages
pre-allocated in FIFO order by ``pd_rules.decode_admits``, KV arriving after a transfer delay,
then decoding here; a retracted request re-prefills here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pd.core.page_allocator import CountingAllocator, PageAllocator
from sglang_pd.core.pd_rules import decode_admits, whole_prompt_pages
from sglang_pd.core.progress import MAX_PREFILL_PREEMPTIONS, pages_for
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.sim.request import SimReq

TRANSFER_S = 0.004  # a PD KV transfer, either side
REASONS = ("the pool holds only", "out of KV cache memory")  # the stated reasons to end a request


def step_s(mode: ForwardMode, tokens: int, batch: int) -> float:
    """Ground-truth step time (virtual): a launch cost plus a per-token cost."""
    if mode is ForwardMode.DECODE:
        return 0.004 + 0.0001 * batch
    return 0.003 + 0.00002 * tokens


@dataclass
class Outcome:
    finished: dict[str, float] = field(default_factory=dict)  # rid -> finish time
    aborted: dict[str, str] = field(default_factory=dict)  # rid -> reason
    steps: int = 0
    idle_polls: int = 0
    preempted: int = 0
    preempted_tokens: int = 0
    most_preemptions: int = 0  # most times one request's partial prefill was thrown away
    first_token: dict[str, float] = field(default_factory=dict)


def build(prefill: str, decode: str, role: str, num_pages: int, prefix_cache: bool = False,
          **cfg_fields: object) -> Scheduler:
    """``prefix_cache``: a radix cache over named pages (requests need ``token_ids``: TokenReq)."""
    cfg = PolicyConfig(role=role, **cfg_fields)  # type: ignore[arg-type]
    alloc = PageAllocator(num_pages + 1) if prefix_cache else CountingAllocator(num_pages + 1)
    return Scheduler(alloc, cfg, create_prefill_policy(prefill, cfg),
                     create_decode_policy(decode, cfg), whole_prompt_pages=whole_prompt_pages(role),
                     prefix_cache=prefix_cache)


@dataclass(eq=False)
class TokenReq(SimReq):
    """A SimReq with tokens, for the prefix cache: token p of conversation ``conv`` is the same
    in every request of it (prompt and output alike), so a later request of a conversation
    extends an earlier one's prompt + output and hits its cached KV."""

    conv: int = 0

    def token_ids(self, start: int, end: int) -> list[int]:
        return [self.conv * 100_000 + p for p in range(start, end)]


def step_bound(reqs: list[SimReq], chunk: int) -> int:
    """Steps within which every request must end (no livelock): each request's prefill chunks,
    counted once per allowed preemption plus one, and its decode steps, times 4 for
    retractions and one-chunk-per-step interleaving, plus a constant."""
    per = sum((MAX_PREFILL_PREEMPTIONS + 1) * pages_for(r.prompt_len + r.output_len, chunk) + r.output_len
              for r in reqs)
    return 4 * per * max(len(reqs), 1) + 1000


def drive(sched: Scheduler, reqs: list[SimReq], role: str = "colocated", max_iters: int | None = None) -> Outcome:
    """Run ``reqs`` (their ``arrival`` in seconds) to the end, checking the invariants after every
    scheduling decision; raises AssertionError with what broke."""
    ps, out = sched.page_size, Outcome()
    pending = sorted(reqs, key=lambda r: r.arrival)
    transfers: list[tuple[float, SimReq]] = []  # (ready time, request): KV in flight
    prealloc: list[SimReq] = []  # decode: parked without pages, FIFO
    usable = sched.allocator.num_usable
    limit = max_iters if max_iters is not None else step_bound(reqs, sched.chunk_size)
    now = 0.0
    for _ in range(limit):
        while pending and pending[0].arrival <= now:
            r = pending.pop(0)
            if role == "decode":
                sched.park(r)
                prealloc.append(r)
            else:
                sched.add(r)
        if role == "decode":  # as DecodeSide._preallocate
            while prealloc:
                r = prealloc[0]
                need = pages_for(r.prompt_len, ps)
                if need > usable:
                    prealloc.pop(0)
                    sched.remove(r)
                    out.aborted[r.rid] = f"the pool holds only {usable * ps} tokens"
                    continue
                if not decode_admits(len(sched.running), len(transfers), sched.max_running, need, 0,
                                     sched.allocator.num_free):
                    break
                prealloc.pop(0)
                sched.park(r, num_pages=need)
                transfers.append((now + TRANSFER_S, r))
        for t, r in [x for x in transfers if x[0] <= now]:
            transfers.remove((t, r))
            if role == "prefill":
                sched.remove(r)  # KV sent: the prefill side is done with it
                out.finished[r.rid] = now
            else:
                sched.start_running(r, r.prompt_len)
                r.n_generated = 1
                _maybe_done(sched, r, now, out)
        busy_before = bool(sched.running)
        preempted = sched.num_preempted_prefills
        step = sched.schedule(now)
        if step is None:
            if sched.num_preempted_prefills > preempted:
                assert busy_before, "a partial prefill was thrown away while no decode ran"
            if not sched.has_work and not pending and not transfers and not prealloc and not sched.parked:
                break
            preempted = sched.num_preempted_prefills
            never = sched.unblock(now) if sched.has_work else []
            for r, why in never:
                assert any(s in why for s in REASONS), f"{r.rid} ended without a stated reason: {why}"
                if "pool holds only" in why:
                    assert pages_for(r.prefill_target, ps) > usable, why
                sched.remove(r)
                out.aborted[r.rid] = why
            if sched.num_preempted_prefills > preempted:
                assert sched.running, "unblock threw a partial prefill away while no decode ran"
            if not never and sched.num_preempted_prefills == preempted:
                out.idle_polls += 1
                events = [pending[0].arrival] if pending else []
                events += [t for t, _ in transfers]
                if sched.hold_deadline is not None:
                    events.append(sched.hold_deadline)
                now = max(now + 1e-4, min(events)) if events else now + 1e-3
        else:
            if sched.num_preempted_prefills > preempted:
                assert busy_before, "a partial prefill was thrown away while no decode ran"
            out.steps += 1
            now += step_s(step.mode, step.shape.num_tokens, len(step.plan))
            _apply(sched, step, now, role, transfers, out)
        _check(sched, out)
    else:
        left = [r.rid for r in reqs if r.rid not in out.finished and r.rid not in out.aborted]
        raise AssertionError(f"livelock: {len(left)} requests unfinished after {limit} iterations "
                             f"({out.preempted} partial prefills thrown away): {left[:5]}")
    left = [r.rid for r in reqs if r.rid not in out.finished and r.rid not in out.aborted]
    assert not left, f"requests neither finished nor ended with a reason: {left}"
    return out


def _apply(sched: Scheduler, step, now: float, role: str, transfers: list, out: Outcome) -> None:
    if step.mode is ForwardMode.DECODE:
        sched.after_decode(step.reqs)
        decoded = step.reqs
    else:
        first = sched.after_extend(step.prefill_plan)
        sched.after_decode(step.decode_reqs)
        decoded = step.decode_reqs
        for r in first:
            r.n_generated = 1
            r.first_token_time = now
            out.first_token[r.rid] = now
            if role == "prefill":
                sched.park(r)  # pages held until the KV transfer ends
                transfers.append((now + TRANSFER_S, r))
            else:
                _maybe_done(sched, r, now, out)
    for r in decoded:
        r.n_generated += 1
        _maybe_done(sched, r, now, out)


def _maybe_done(sched: Scheduler, r: SimReq, now: float, out: Outcome) -> None:
    if r.n_generated >= r.output_len and r.rid not in out.finished:
        sched.remove(r)
        out.finished[r.rid] = now


def _check(sched: Scheduler, out: Outcome) -> None:
    """The invariants after every decision: pages conserved and covering each request's KV,
    thrown-away prefill work bounded per request."""
    sched.check_integrity()
    ps = sched.page_size
    for r in sched.running:
        assert len(r.pages) * ps >= r.kv_len, f"{r.rid}: KV {r.kv_len} beyond its pages"
    for r in sched.waiting:
        if r.pages or sched.hits is None:
            assert len(r.pages) * ps >= r.kv_len, f"{r.rid}: KV {r.kv_len} beyond its pages"
        else:  # a prefix hit looked up, not locked yet (core/prefix_hits.py)
            assert r.kv_len == r.cached_len and r.kv_len % ps == 0 and r.kv_len < r.prefill_target
    if sched.hits is not None:  # no page in use is free or evicted
        cached, free = set(sched.hits.cache.pages()), set(sched.base_allocator._free)  # type: ignore[attr-defined]
        for r in sched.all_reqs():
            k = sched.hits.shared(r)
            assert set(r.pages[:k]) <= cached, f"{r.rid}: a locked prefix page left the cache"
            assert not set(r.pages) & free, f"{r.rid}: holds a free page"
    if sched.whole_prompt_pages:
        assert sched.num_preempted_prefills == 0, "a PD prefill threw away a partial holding all its pages"
    out.preempted = sched.num_preempted_prefills
    out.preempted_tokens = getattr(sched, "num_preempted_prefill_tokens", 0)
    counts = getattr(sched, "prefill_preemptions", {})
    if counts:
        out.most_preemptions = max(out.most_preemptions, *counts.values())
    assert out.most_preemptions <= MAX_PREFILL_PREEMPTIONS, out.most_preemptions
