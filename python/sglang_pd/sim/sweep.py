"""QPS x policy grids (``sim sweep``) and the planner's search (``sim plan``).

Every point is one full simulation with fresh instances (policies learn from scratch), on the
same workload drawn with the same seed, so the policies see identical requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Sequence

from sglang_pd.bench.metrics import BenchMetrics, SloSpec
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec
from sglang_pd.sim.profiles import StepCost
from sglang_pd.sim.report import metrics
from sglang_pd.sim.workload import Workload


@dataclass
class Point:
    qps: float
    label: str
    spec: ClusterSpec
    metrics: BenchMetrics
    wall_s: float


CostFactory = Callable[[], StepCost]
DecodeCostFactory = Callable[[], StepCost | None]  # None: decode shares prefill's step costs


def simulate(spec: ClusterSpec, cost_factory: CostFactory, workload: Workload, slo: SloSpec,
             long_threshold: int, decode_cost_factory: DecodeCostFactory | None = None) -> tuple[BenchMetrics, float]:
    """``decode_cost_factory``: the decode side's own step costs (``--decode-tp``), else shared."""
    res = Cluster(spec, cost_factory(), decode_cost_factory() if decode_cost_factory else None).run(workload)
    _, m = metrics(res, slo, long_threshold)
    return m, res.wall_s


def sweep(qps_list: Sequence[float], specs: dict[str, ClusterSpec], cost_factory: Callable[[], StepCost],
          workload_at: Callable[[float], Workload], slo: SloSpec, long_threshold: int = 8192,
          log: Callable[[str], None] = print, decode_cost_factory: DecodeCostFactory | None = None) -> list[Point]:
    points = []
    for qps in qps_list:
        wl = workload_at(qps)
        for label, spec in specs.items():
            m, wall = simulate(spec, cost_factory, wl, slo, long_threshold, decode_cost_factory)
            o = m.overall
            log(f"qps {qps:7.3f}  {label:<28} E2E {100 * (o.slo_attainment or 0):6.1f}%  TTFT "
                f"{100 * (o.ttft_attainment or 0):6.1f}%  TPOT {100 * (o.tpot_attainment or 0):6.1f}%  "
                f"TTFT p50/p90 {o.ttft.median:9.0f}/{o.ttft.p90:9.0f} ms  TPOT p50 {o.tpot.median:6.1f} ms  "
                f"goodput {o.goodput_rps or 0:7.3f}/s  ({wall:.1f} s wall)")
            points.append(Point(qps, label, spec, m, wall))
    return points


@dataclass
class PlanCandidate:
    label: str
    gpus: int
    spec: ClusterSpec
    cost_factory: CostFactory | None = None  # its own step costs (e.g. its TP size)
    decode_cost_factory: DecodeCostFactory | None = None  # its decode side's, where another TP size


def plan(candidates: Sequence[PlanCandidate], cost_factory: Callable[[], StepCost], workload: Workload,
         slo: SloSpec, target: float, long_threshold: int = 8192,
         log: Callable[[str], None] = print) -> tuple[PlanCandidate, BenchMetrics] | None:
    """The cheapest candidate (fewest GPUs, then best attainment) whose E2E attainment (both
    SLOs, or the one given) reaches ``target``. Candidates are tried cheapest first; once one
    meets the target, dearer ones are skipped."""
    best: tuple[PlanCandidate, BenchMetrics] | None = None
    for cand in sorted(candidates, key=lambda c: c.gpus):
        if best is not None and cand.gpus > best[0].gpus:
            break
        m, wall = simulate(cand.spec, cand.cost_factory or cost_factory, workload, slo, long_threshold,
                           cand.decode_cost_factory)
        att = m.overall.slo_attainment or 0.0
        ok = att >= target
        log(f"{cand.gpus:4d} GPUs  {cand.label:<44} E2E attainment {100 * att:6.1f}%  "
            f"{'meets' if ok else 'misses'} ({wall:.1f} s wall)")
        if ok and (best is None or att > (best[1].overall.slo_attainment or 0.0)):
            best = (cand, m)
    return best
