"""The requests a simulation replays: a trace (bench/traces.py), or synthetic arrivals
(bench/datasets.py's Poisson/Gamma process, or a fixed concurrency), with length mixes.

Length sources by name (``--mix NAME:WEIGHT,...``): any trace short name or path (records drawn
uniformly, with their Mooncake ``hash_ids``), ``medha-swe`` (Medha's SWE long requests:
log-normal prefill p50 393K / p90 839K, decode p50 518 / p90 808), ``pla-chat`` (PLA-Serve's
stated shape: new tokens of first turns < 256 for ~63%, of later turns for ~81%, long ones rare;
later turns carry their history as cached tokens) and ``fixed:IN:OUT``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from collections.abc import Sequence

from sglang_pd.bench.datasets import arrival_times
from sglang_pd.bench.traces import TraceRecord, load_trace

_Z90 = 1.2815515655446004  # standard normal 90th percentile


@dataclass(frozen=True)
class Arrival:
    arrival_s: float
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()
    cached_len: int = 0  # preset prefix hit (synthetic histories); the prefix cache may add
    source: str = ""  # which length source it came from ("" = the only one)
    slo_ttft_s: float | None = None  # this request's own TTFT SLO (None: --slo-ttft-ms)


@dataclass
class Workload:
    arrivals: list[Arrival]
    concurrency: int | None = None  # closed loop: keep this many in flight, times ignored
    # prefix blocks of the trace's requests before this window: a server that has been serving
    # the trace holds them (its prefix cache is warm, not empty, when the window starts)
    warm_hash_ids: list[tuple[int, ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrivals)


def _lognormal(rng: random.Random, p50: float, p90: float, lo: int, hi: int) -> int:
    sigma = math.log(p90 / p50) / _Z90
    return int(min(max(round(rng.lognormvariate(math.log(p50), sigma)), lo), hi))


def _pla_chat(rng: random.Random) -> tuple[int, int, int]:
    """(new tokens, output tokens, cached history) of one PLA-like chat turn."""
    first = rng.random() < 0.4  # assumption: sessions average 2.5 turns
    p_short = 0.63 if first else 0.81
    new = (_lognormal(rng, 60, 200, 4, 255) if rng.random() < p_short
           else _lognormal(rng, 700, 2500, 256, 16000))
    out = _lognormal(rng, 180, 500, 1, 2048)  # assumption: LMSYS-like replies
    history = 0 if first else _lognormal(rng, 600, 2500, 16, 16000)
    return new + history, out, history


class LengthSource:
    def __init__(self, name: str, rng: random.Random) -> None:
        self.name, self.rng = name, rng
        self.records: list[TraceRecord] | None = None
        if name.startswith("fixed:"):
            parts = name.split(":")
            if len(parts) != 3:
                raise ValueError(f"length source {name!r}: expected fixed:IN:OUT")
            self.fixed = (int(parts[1]), int(parts[2]))
        elif name not in ("medha-swe", "pla-chat"):
            self.records = load_trace(name)
            if not self.records:
                raise ValueError(f"length source {name!r} holds no records")

    def draw(self, t: float) -> Arrival:
        rng = self.rng
        if self.records is not None:
            r = self.records[rng.randrange(len(self.records))]
            return Arrival(t, max(r.input_len, 1), max(r.output_len, 1), r.hash_ids, source=self.name)
        if self.name == "medha-swe":
            return Arrival(t, _lognormal(rng, 393_000, 839_000, 1024, 2_000_000),
                           _lognormal(rng, 518, 808, 1, 8192), source=self.name)
        if self.name == "pla-chat":
            prompt, out, hist = _pla_chat(rng)
            return Arrival(t, prompt, out, cached_len=hist, source=self.name)
        return Arrival(t, *self.fixed, source=self.name)


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """``"sharegpt-lengths:0.95,medha-swe:0.05"`` -> [(name, weight)]; the weight is the text
    after the last colon (``fixed:IN:OUT:W``)."""
    out = []
    for part in spec.split(","):
        name, sep, w = part.strip().rpartition(":")
        try:
            weight = float(w)
        except ValueError:
            weight = -1.0
        if not sep or not name or not weight > 0:
            raise ValueError(f"--mix entry {part!r}: expected NAME:WEIGHT with a weight > 0")
        out.append((name, weight))
    return out


def scale_to_qps(arrivals: list[Arrival], qps: float) -> list[Arrival]:
    """Rescale a trace's times (from 0) so its mean arrival rate is ``qps``."""
    if not arrivals or len(arrivals) < 2:
        return arrivals
    t0, t1 = arrivals[0].arrival_s, arrivals[-1].arrival_s
    span = t1 - t0
    if span <= 0:
        raise ValueError("the trace's arrivals all share one time; --qps cannot rescale it")
    k = (len(arrivals) - 1) / qps / span
    return [replace(a, arrival_s=(a.arrival_s - t0) * k) for a in arrivals]


def from_trace(name: str, limit: int | None = None, window: int | None = None, window_index: int = 0,
               qps: float | None = None, seed: int = 1) -> Workload:
    """A timed trace (or a length-only one, timed by a Poisson process at ``qps``)."""
    recs = load_trace(name)
    warm: list[tuple[int, ...]] = []
    if window:
        warm = [r.hash_ids for r in recs[: window * window_index] if r.hash_ids]
        recs = recs[window * window_index: window * (window_index + 1)]
        if not recs:
            raise ValueError(f"trace {name!r} has no window {window_index} of {window} requests")
    if limit is not None:
        recs = recs[:limit]
    if recs and recs[0].arrival_s is None:
        if qps is None:
            raise ValueError(f"trace {name!r} has no arrival times: give --qps")
        times = arrival_times(len(recs), qps, seed=seed)
    else:
        times = [r.arrival_s or 0.0 for r in recs]
    arrivals = [Arrival(t, max(r.input_len, 1), max(r.output_len, 1), r.hash_ids) for t, r in zip(times, recs)]
    arrivals.sort(key=lambda a: a.arrival_s)
    if qps is not None and recs and recs[0].arrival_s is not None:
        arrivals = scale_to_qps(arrivals, qps)
    return Workload(arrivals, warm_hash_ids=warm)


def synthetic(mix: Sequence[tuple[str, float]], num_requests: int, qps: float | None = None,
              burstiness: float = 1.0, concurrency: int | None = None, seed: int = 1) -> Workload:
    """Lengths drawn from the mix; times from the arrival process (or a closed loop)."""
    if (qps is None) == (concurrency is None):
        raise ValueError("synthetic arrivals need exactly one of --qps and --concurrency")
    if num_requests < 1:
        raise ValueError(f"--num-requests must be >= 1, got {num_requests}")
    rng = random.Random(seed)
    sources = [LengthSource(name, random.Random(rng.random())) for name, _ in mix]
    weights = [w for _, w in mix]
    times = arrival_times(num_requests, qps, burstiness, seed) if qps is not None else [0.0] * num_requests
    picks = rng.choices(range(len(sources)), weights, k=num_requests)
    many = len(sources) > 1
    arrivals = []
    for t, i in zip(times, picks):
        a = sources[i].draw(t)
        arrivals.append(a if many else replace(a, source=""))
    return Workload(arrivals, concurrency)
