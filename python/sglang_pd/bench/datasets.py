"""Request generation: lengths from a dataset or trace, and arrival times.

A run is a list of :class:`WorkItem` (input/output token counts plus, for timed traces, the
trace's own arrival time). Arrival times for everything else come from :func:`arrival_times`
(Poisson, or Gamma with a burstiness factor), exactly as the request rate flags describe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sglang_pd.bench.traces import KNOWN_TRACES, load_trace

# Dataset names the CLI accepts. "sharegpt" is an alias of the ShareGPT length CSV: we ship the
# length statistics only, not the conversations, so prompts are synthetic either way.
DATASET_NAMES = (
    "random",
    "mix",
    "sharegpt-lengths",
    "sharegpt",
    "trace",
    *[n for n in KNOWN_TRACES if n != "sharegpt-lengths"],
)


@dataclass(frozen=True)
class WorkItem:
    """What one request must look like, before a prompt is built for it."""

    input_len: int  # prompt tokens wanted
    output_len: int  # tokens to generate (sent as max_new_tokens / max_tokens)
    arrival_s: float | None = None  # trace arrival time in seconds; None: use the arrival process
    # Mooncake prefix-block ids (512 tokens each): native prompts are built from them, one
    # deterministic block per id, so requests sharing ids share prefixes (real cache hits)
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class DatasetSpec:
    """The dataset-related flags, gathered so generation can be tested without argparse."""

    name: str = "random"
    path: str | None = None
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 1024
    random_range_ratio: float = 0.0
    length_mix: str | None = None  # "IN:OUT:WEIGHT,IN:OUT:WEIGHT"
    max_input_len: int | None = None
    max_output_len: int | None = None
    ignore_trace_times: bool = False
    seed: int = 1


def parse_length_mix(spec: str) -> list[tuple[int, int, float]]:
    """Parse ``"64:16:0.8,2048:64:0.2"`` into (input_len, output_len, weight) triples."""
    mix: list[tuple[int, int, float]] = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        if len(fields) not in (2, 3):
            raise ValueError(
                f"bad --length-mix entry {part!r}: expected INPUT:OUTPUT[:WEIGHT], e.g. 64:16:0.8"
            )
        inp, out = int(fields[0]), int(fields[1])
        weight = float(fields[2]) if len(fields) == 3 else 1.0
        if inp < 1 or out < 1 or weight <= 0:
            raise ValueError(f"bad --length-mix entry {part!r}: lengths must be >= 1, weight > 0")
        mix.append((inp, out, weight))
    if not mix:
        raise ValueError("--length-mix is empty")
    return mix


def _random_lengths(spec: DatasetSpec, rng: np.random.Generator) -> list[WorkItem]:
    # Same convention as SGLang's random dataset: lengths uniform in [L * ratio, L], at least 1.
    def draw(length: int) -> np.ndarray:
        low = max(int(length * spec.random_range_ratio), 1)
        return rng.integers(low, max(length, low) + 1, size=spec.num_prompts)

    ins, outs = draw(spec.random_input_len), draw(spec.random_output_len)
    return [WorkItem(int(i), int(o)) for i, o in zip(ins, outs)]


def _mix_lengths(spec: DatasetSpec, rng: np.random.Generator) -> list[WorkItem]:
    if not spec.length_mix:
        raise ValueError("--dataset-name mix needs --length-mix IN:OUT:WEIGHT,...")
    mix = parse_length_mix(spec.length_mix)
    weights = np.array([w for _, _, w in mix], dtype=float)
    picks = rng.choice(len(mix), size=spec.num_prompts, p=weights / weights.sum())
    return [WorkItem(mix[k][0], mix[k][1]) for k in picks]


def _trace_items(spec: DatasetSpec, rng: np.random.Generator) -> list[WorkItem]:
    source = spec.path or (spec.name if spec.name in KNOWN_TRACES else None)
    if spec.name == "sharegpt" and not spec.path:
        source = "sharegpt-lengths"
    if source is None:
        raise ValueError(
            "--dataset-name trace needs --dataset-path FILE (or --trace FILE); shipped traces: "
            + ", ".join(sorted(KNOWN_TRACES))
        )
    timed_probe = load_trace(source, limit=1)
    if timed_probe and timed_probe[0].arrival_s is not None:
        # Timed trace: keep the file order (the arrival order), take the first N.
        recs = load_trace(source, limit=spec.num_prompts)
        keep_times = not spec.ignore_trace_times
        return [
            WorkItem(r.input_len, r.output_len, r.arrival_s if keep_times else None, r.hash_ids)
            for r in recs
        ]
    # Length-only set: sample N rows with the seed (without replacement when there are enough).
    recs = load_trace(source)
    idx = rng.choice(len(recs), size=spec.num_prompts, replace=spec.num_prompts > len(recs))
    return [WorkItem(recs[i].input_len, recs[i].output_len, None, recs[i].hash_ids) for i in idx]


def build_items(spec: DatasetSpec) -> list[WorkItem]:
    """Lengths (and trace arrivals) for ``spec.num_prompts`` requests, clamped to the limits."""
    if spec.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    rng = np.random.default_rng(spec.seed)
    if spec.name == "random":
        items = _random_lengths(spec, rng)
    elif spec.name == "mix":
        items = _mix_lengths(spec, rng)
    elif spec.name in ("trace", "sharegpt", *KNOWN_TRACES):
        items = _trace_items(spec, rng)
    else:
        raise ValueError(
            f"unknown --dataset-name {spec.name!r}; allowed: {', '.join(DATASET_NAMES)}"
        )
    return [clamp(it, spec.max_input_len, spec.max_output_len) for it in items]


def clamp(item: WorkItem, max_in: int | None, max_out: int | None) -> WorkItem:
    """Clamp lengths so long traces fit a small model's context (and stay >= 1 token)."""
    inp = item.input_len if max_in is None else min(item.input_len, max_in)
    out = item.output_len if max_out is None else min(item.output_len, max_out)
    return WorkItem(max(inp, 1), max(out, 1), item.arrival_s, item.hash_ids)


def arrival_times(
    n: int, request_rate: float, burstiness: float = 1.0, seed: int = 1
) -> list[float]:
    """Send times in seconds for ``n`` requests.

    Gaps are Gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate, and burstiness 1
    is a Poisson process (exponential gaps); < 1 is burstier, > 1 more regular. The first request
    goes at t=0. ``inf`` rate sends everything at once.
    """
    if math.isinf(request_rate):
        return [0.0] * n
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be > 0 (rate may be inf)")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=max(n - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


def rate_offering(prompt_tokens_per_s: float, prompt_lens: list[int], intervals: int) -> float:
    """The request rate at which a window of prompts of ``prompt_lens`` offers
    ``prompt_tokens_per_s`` prompt tokens a second, counted as ``intervals`` requests over the
    window's span (the caller's own rate convention: n, or n - 1 gaps). Windows of longer
    prompts get fewer requests a second, so windows alike in token rate load a prefill alike."""
    return prompt_tokens_per_s * intervals / sum(prompt_lens)


def schedule(
    items: list[WorkItem],
    request_rate: float,
    burstiness: float = 1.0,
    time_scale: float = 1.0,
    seed: int = 1,
) -> list[float]:
    """Arrival time (s) of each item: the trace's own times scaled, else the arrival process.

    ``time_scale`` < 1 compresses a trace (replays it faster), > 1 stretches it.
    """
    if time_scale <= 0:
        raise ValueError("--time-scale must be > 0")
    if items and all(it.arrival_s is not None for it in items):
        return [float(it.arrival_s) * time_scale for it in items]  # type: ignore[arg-type]
    return arrival_times(len(items), request_rate, burstiness, seed)
