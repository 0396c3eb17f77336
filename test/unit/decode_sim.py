"""A tiny decode-only simulator for policy tests: step times come from a fixed table."""

from __future__ import annotations

from dataclasses import dataclass, field

from policy_helpers import FakeReq
from sglang_pd.scheduling.decode.pacing import decode_context
from sglang_pd.scheduling.decode_cost_model import DEFAULT_DECODE_PRIOR, DecodeCostModel
from sglang_pd.scheduling.profile import DecodeGrid
from sglang_pd.scheduling.types import DecodePolicy

KAIROS_BATCHES = [1, 2, 4, 8, 16, 32, 64]
KAIROS_CONTEXTS = [0, 8192, 131072, 262144, 1048576]


def kairos_grid() -> DecodeGrid:
    """Kairos §2.2's batch-1 points (8K: 11.0 ms, 128K: 40.3 ms) on a linear table."""
    p = DEFAULT_DECODE_PRIOR
    return DecodeGrid(batch_sizes=KAIROS_BATCHES, context_tokens=KAIROS_CONTEXTS,
                      seconds=[[p.step_s(b, c) for c in KAIROS_CONTEXTS] for b in KAIROS_BATCHES])


def kairos_model() -> DecodeCostModel:
    return DecodeCostModel.fixed(kairos_grid())


def running_req(rid: str, prompt_len: int, tpot_s: float | None, t_first: float = 0.0) -> FakeReq:
    """A request right after its first token (made by prefill) at ``t_first``."""
    return FakeReq(rid, 0.0, prompt_len, prefilled_len=prompt_len, n_generated=1,
                   first_token_time=t_first, slo_tpot_s=tpot_s)


@dataclass
class DecodeRun:
    tokens: dict[str, list[float]] = field(default_factory=dict)  # rid -> token times (1st = t_first)
    batches: list[list[str]] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    now: float = 0.0

    def tpot(self, rid: str) -> float:
        ts = self.tokens[rid]
        return (ts[-1] - ts[0]) / (len(ts) - 1)

    def max_lateness(self, rid: str, tpot_s: float) -> float:
        """Largest (token time - its pace deadline t_first + (k-1) T) over the request's tokens."""
        ts = self.tokens[rid]
        return max(t - (ts[0] + k * tpot_s) for k, t in enumerate(ts))

    def max_overdue(self, rid: str, tpot_s: float) -> float:
        """Largest wait for a token past max(its pace deadline, the previous token): how long a
        request that is due (or behind) can be left out; bounded = no starvation. A request ahead
        of its pace may be skipped while it is ahead (that wait is not counted)."""
        ts = self.tokens[rid]
        return max((b - max(a, ts[0] + k * tpot_s) for k, (a, b) in enumerate(zip(ts, ts[1:]), 1)),
                   default=0.0)

    def max_gap(self, rid: str) -> float:
        ts = self.tokens[rid]
        return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)


def simulate(policy: DecodePolicy, table: DecodeCostModel, reqs: list[FakeReq], out_len: dict[str, int],
             arrivals: dict[str, float] | None = None, max_steps: int = 100_000,
             overrun: dict[int, float] | None = None) -> DecodeRun:
    """Decode until every request has ``out_len`` tokens; ``arrivals`` (rid -> time) join later
    (their first token at arrival). Each step takes the table's time of the chosen batch, plus
    ``overrun[k]`` seconds for step k (a step slower than the table: a hiccup)."""
    overrun = overrun or {}
    arrivals = arrivals or {}
    pending = sorted((r for r in reqs if r.rid in arrivals), key=lambda r: arrivals[r.rid])
    running = [r for r in reqs if r.rid not in arrivals]
    run = DecodeRun({r.rid: [r.first_token_time or 0.0] for r in running})
    for _ in range(max_steps):
        while pending and arrivals[pending[0].rid] <= run.now:
            r = pending.pop(0)
            r.first_token_time = arrivals[r.rid]
            run.tokens[r.rid] = [r.first_token_time]
            running.append(r)
        if not running:
            if not pending:
                return run
            run.now = arrivals[pending[0].rid]
            continue
        batch = policy.schedule(running, run.now)
        assert batch, "a decode policy returned an empty batch with requests running"
        assert len({id(r) for r in batch}) == len(batch) and all(r in running for r in batch)
        run.step_s.append(table.batch_s([decode_context(r) for r in batch])
                          + overrun.get(len(run.batches), 0.0))
        run.now += run.step_s[-1]
        run.batches.append([r.rid for r in batch])
        for r in batch:
            r.n_generated += 1
            run.tokens[r.rid].append(run.now)
        running = [r for r in running if r.n_generated < out_len[r.rid]]
    raise AssertionError(f"not finished after {max_steps} steps")
