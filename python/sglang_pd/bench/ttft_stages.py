"""A PD request's server-side TTFT split into stages, from the engines' per-request lines
(engine/request_log.py) or from the simulator's tracks, by one definition of each stage, so that
``scripts/request_timeline_report.py`` and ``scripts/sim_fidelity_cluster.py`` compare like with
like. Stages (ms):

- ``prefill_queue``: the prefill frontend's arrival to the first step that ran it (the wait for
  the decode's registration, then the queue);
- ``prefill_forward``: from there to its first token (every chunk, and any steps between);
- ``kv_to_decode``: the prefill's first token to the decode engine holding KV and token (the
  transfer, and the decode's admission and polling);
- ``ttft_server``: the earlier of the two arrivals to the decode's first token (what the
  client sees, less the router and the HTTP hops);
- ``decode_skew``: the decode's arrival after the prefill's (the router's fan-out; 0 in the
  simulator, whose router sends both at once).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_pd.bench.metrics import percentile

if TYPE_CHECKING:
    from sglang_pd.sim.instance import Track

_LINE = re.compile(
    r"request rid=(?P<rid>\S+) room=(?P<room>\S+) mode=(?P<mode>\S+) class=(?P<cls>\S+) "
    r"prompt=(?P<prompt>\d+) cached=(?P<cached>\d+) out=(?P<out>\d+) arrival=(?P<arrival>[\d.]+) "
    r"queue_ms=(?P<queue>\S+) first_ms=(?P<first>\S+) end_ms=(?P<end>[\d.]+) status=(?P<status>\S+)")
STAGES = ("prefill_queue", "prefill_forward", "kv_to_decode", "ttft_server", "decode_skew")


@dataclass(frozen=True)
class TimelineLine:
    rid: str
    room: int | None
    mode: str
    cls: str
    prompt: int
    cached: int
    out: int
    arrival: float  # wall seconds
    queue_ms: float | None
    first_ms: float | None
    end_ms: float
    status: str


def _ms(text: str) -> float | None:
    return None if text == "-" else float(text)


def parse_line(text: str) -> TimelineLine | None:
    m = _LINE.search(text)
    if m is None:
        return None
    return TimelineLine(rid=m["rid"], room=None if m["room"] == "-" else int(m["room"]), mode=m["mode"],
                        cls=m["cls"], prompt=int(m["prompt"]), cached=int(m["cached"]), out=int(m["out"]),
                        arrival=float(m["arrival"]), queue_ms=_ms(m["queue"]), first_ms=_ms(m["first"]),
                        end_ms=float(m["end"]), status=m["status"])


def read_lines(paths: Iterable[Path]) -> list[TimelineLine]:
    lines: list[TimelineLine] = []
    for path in paths:
        with path.open(errors="replace") as f:
            lines += [ln for ln in map(parse_line, f) if ln is not None]
    return lines


@dataclass(frozen=True)
class PDTimeline:
    room: int
    cls: str
    prompt: int
    stages_ms: dict[str, float]


def join(lines: list[TimelineLine], short_threshold: int) -> list[PDTimeline]:
    """One timeline per room that both a prefill and a decode line name, both finished ok."""
    prefill = {ln.room: ln for ln in lines if ln.mode == "prefill" and ln.room is not None}
    out: list[PDTimeline] = []
    for d in lines:
        p = prefill.get(d.room) if d.mode == "decode" and d.room is not None else None
        if p is None or p.status != "ok" or d.status != "ok" or None in (p.queue_ms, p.first_ms, d.first_ms):
            continue
        assert p.queue_ms is not None and p.first_ms is not None and d.first_ms is not None
        p_first = p.arrival + p.first_ms / 1e3
        d_first = d.arrival + d.first_ms / 1e3
        cls = p.cls if p.cls != "-" else ("short" if p.prompt - p.cached <= short_threshold else "long")
        out.append(PDTimeline(room=p.room or 0, cls=cls, prompt=p.prompt, stages_ms={
            "prefill_queue": p.queue_ms,
            "prefill_forward": p.first_ms - p.queue_ms,
            "kv_to_decode": 1e3 * (d_first - p_first),
            "ttft_server": 1e3 * (d_first - min(p.arrival, d.arrival)),
            "decode_skew": 1e3 * (d.arrival - p.arrival),
        }))
    return out


def summarise(timelines: list[PDTimeline]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per class, each stage's (p50, p90) in ms, to 0.1 ms."""
    by_cls: dict[str, list[PDTimeline]] = {}
    for t in timelines:
        by_cls.setdefault(t.cls, []).append(t)
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for cls, ts in sorted(by_cls.items()):
        out[cls] = {}
        for stage in STAGES:
            values = [t.stages_ms[stage] for t in ts]
            out[cls][stage] = (round(percentile(values, 50), 1), round(percentile(values, 90), 1))
    return out


def table(summary: dict[str, dict[str, tuple[float, float]]], counts: dict[str, int]) -> str:
    rows = ["| class | n | " + " | ".join(f"{s} p50 / p90" for s in STAGES) + " |",
            "|---|---|" + "---|" * len(STAGES)]
    for cls, stages in summary.items():
        cells = " | ".join(f"{p50:.0f} / {p90:.0f}" for p50, p90 in stages.values())
        rows.append(f"| {cls} | {counts[cls]} | {cells} |")
    return "\n".join(rows)


def from_tracks(tracks: Sequence[Track], shift_s: float = 0.0) -> list[PDTimeline]:
    """The simulator's PD requests (``Track``s with both sides run) split the same way.
    ``shift_s``: what the caller already added to each ``first_token`` (a calibrated TTFT
    overhead paid before the engines, sim_fidelity_cluster.replay), taken off again."""
    out: list[PDTimeline] = []
    for t in tracks:
        if t.error or t.d_inst < 0 or t.prefill_started is None or t.prefill_done is None or t.first_token is None:
            continue
        first = t.first_token - shift_s
        out.append(PDTimeline(room=t.index, cls=t.request_class, prompt=t.prompt_len, stages_ms={
            "prefill_queue": 1e3 * (t.prefill_started - t.arrival),
            "prefill_forward": 1e3 * (t.prefill_done - t.prefill_started),
            "kv_to_decode": 1e3 * (first - t.prefill_done),
            "ttft_server": 1e3 * (first - t.arrival),
            "decode_skew": 0.0,
        }))
    return out


def compare_table(engine: list[PDTimeline], sim: list[PDTimeline]) -> str:
    """Per class and stage, the engine's p50 / p90 beside the simulator's (ms, markdown): which
    stage a TTFT error comes from (scripts/sim_fidelity_cluster.py)."""
    real, pred = summarise(engine), summarise(sim)
    rows = ["| class | stage | engine p50 / p90 | simulator p50 / p90 |", "|---|---|---|---|"]
    for cls in sorted(set(real) & set(pred)):
        for stage in STAGES:
            (a50, a90), (b50, b90) = real[cls][stage], pred[cls][stage]
            rows.append(f"| {cls} | {stage} | {a50:.0f} / {a90:.0f} | {b50:.0f} / {b90:.0f} |")
    return "\n".join(rows)
