"""Calibrating the simulator to one measured cluster run (issue 34 item 4).

A cost profile is measured on one engine alone on a core. A bench_cluster run puts three
engines (2 prefill + 1 decode), three frontends, the router and the load generator on the same
few cores: each engine's steps run slower than the profiler timed them, by how much depends on
which neighbours are busy, which no one-engine profile holds. So the cluster check calibrates on
a run of the same cluster (another window of the trace, another seed) and predicts the others:
never fit and test on the same run.

Two terms, both measured, neither read off the runs it predicts:

- per instance, a step-time factor: the seconds that instance's engine spent in steps
  (``sglang:engine_step_seconds``, every step's wall time, scraped by bench_cluster after the
  run) over the seconds the simulated instance spent on the same requests. Fixed point: the
  simulator's batches change with its step times, so the factor is re-read after each replay.
- one TTFT overhead: the median, over the calibration run's requests, of the engine's TTFT
  minus the (factor-corrected) simulator's: what no engine step holds (HTTP, the router's
  two legs, the bootstrap handshake, the KV transfer's real speed, the client).

Optionally (``cores``) the shared cores themselves: a step that starts while k instances of
the cluster are mid-step (itself included) on ``cores`` cores runs max(1, k / cores) times as
long (each engine is one thread; processor sharing, read once at the step's start). The
factors then hold only what sharing does not explain (frontends, router, client, caches).
``shared``: which instances share them: "all", or "prefill" (bench_cluster's pinned layout:
the prefill engines share the cores, each decode engine runs on a core of its own).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_pd.sim.cluster import Cluster
from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.sim.cluster_spec import SimResult
from sglang_pd.sim.instance import Instance
from sglang_pd.sim.step_cost import StepCost

# bench_cluster's process names -> the simulator's instance names (Instance.name)
INSTANCE_OF = {"prefill0": "p0", "prefill1": "p1", "decode": "d0"}


@dataclass
class Calibration:
    step_factor: dict[str, float] = field(default_factory=dict)  # Instance.name -> measured / simulated
    ttft_overhead_s: float = 0.0
    source: str = ""  # the run it was fitted on
    cores: float | None = None  # the cores the instances share (None: each has its own)
    shared: str = "all"  # who shares ``cores``: "all" instances or only the "prefill" ones

    def to_json(self) -> dict:
        return {"step_factor": self.step_factor, "ttft_overhead_s": self.ttft_overhead_s, "source": self.source,
                "cores": self.cores, "shared": self.shared}

    @classmethod
    def mean(cls, fits: list[Calibration], source: str = "") -> Calibration:
        """One calibration from several fits of one cluster (runs of the same window): each
        instance's factor and the TTFT overhead averaged, so no single run's luck is the fit."""
        names = {n for f in fits for n in f.step_factor}
        factor = {n: statistics.fmean(f.step_factor[n] for f in fits if n in f.step_factor) for n in sorted(names)}
        return cls(factor, statistics.fmean(f.ttft_overhead_s for f in fits), source, fits[0].cores, fits[0].shared)

    @classmethod
    def from_json(cls, d: dict) -> Calibration:
        return cls(dict(d["step_factor"]), float(d["ttft_overhead_s"]), str(d.get("source", "")), d.get("cores"),
                   str(d.get("shared", "all")))


class SharedCoreCost(StepCost):
    """``StepCost`` of one instance among ``peers`` sharing ``cores`` cores (module docstring)."""

    def __init__(self, base: StepCost, peers: list[Instance], cores: float) -> None:
        super().__init__(base.name, base.prefill, base.decode, base.kv_bytes_per_token, base.kv_capacity_tokens,
                         base.step_tokens2_s, base.noise, base.seed)
        self.peers, self.cores = peers, cores

    def step_s(self, step: ScheduledStep) -> float:
        busy = sum(1 for p in self.peers if p.step is not None)  # the caller's own step is set already
        return super().step_s(step) * max(1.0, busy / self.cores)


def scaled(cost: StepCost, factor: float) -> StepCost:
    """``cost`` with every step ``factor`` times as long (prefill and decode alike)."""
    pre, dec = cost.prefill.times(factor), cost.decode

    def decode(batch: int, ctx_total: int, ctx_max: int) -> float:
        return factor * dec(batch, ctx_total, ctx_max)

    return StepCost(f"{cost.name} x{factor:.2f}", pre, decode, cost.kv_bytes_per_token, cost.kv_capacity_tokens,
                    step_tokens2_s=cost.step_tokens2_s * factor, noise=cost.noise, seed=cost.seed)


def apply(cluster: Cluster, cal: Calibration) -> Cluster:
    """Each instance's steps scaled by its factor (before the run; 1 where none was fitted)."""
    peers = [*cluster.front, *cluster.decodes] if cal.shared == "all" else list(cluster.front)
    for inst in [*cluster.front, *cluster.decodes]:
        f = cal.step_factor.get(inst.name, 1.0)
        if f != 1.0:
            inst.cost = scaled(inst.cost, f)
        if cal.cores and inst in peers:
            inst.cost = SharedCoreCost(inst.cost, peers, cal.cores)
    return cluster


def measured_busy(steps: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """bench_cluster's SETUP_steps.json -> seconds in steps per simulator instance name."""
    return {INSTANCE_OF[name]: sum(m["seconds"] for m in modes.values())
            for name, modes in steps.items() if name in INSTANCE_OF}


def median_tpot_s(res: SimResult) -> float | None:
    tpots = [(t.finish - t.first_token) / (t.output_len - 1) for t in res.tracks
             if t.finish is not None and t.first_token is not None and t.output_len > 1]
    return statistics.median(tpots) if tpots else None


def fit_factors(replay: Callable[[Calibration], SimResult], busy: dict[str, float],
                rounds: int = 5, cores: float | None = None,
                tpot_s: float | None = None, shared: str = "all") -> tuple[Calibration, SimResult]:
    """Step factors such that each simulated instance is busy as long as its engine was; with
    ``tpot_s`` (the run's median TPOT) the decode instances' factor matches that instead: a
    decode engine's wall time per token also holds its loop's work between steps (sending
    outputs, taking transfers in) and its waits for a core there, which no step timer counts
    (measured here: TPOT p50 1.3-1.7x the mean decode step)."""
    cal = Calibration(dict.fromkeys(busy, 1.0), cores=cores, shared=shared)
    res = replay(cal)
    for _ in range(rounds):
        sim = {i.name: i.busy_s for i in res.instances}
        sim_tpot = median_tpot_s(res) if tpot_s else None
        cal = Calibration({n: f * (tpot_s / sim_tpot if tpot_s and sim_tpot and n.startswith("d")
                                   else busy[n] / sim[n] if sim.get(n) else 1.0)
                           for n, f in cal.step_factor.items()}, cores=cores, shared=shared)
        res = replay(cal)
    return cal, res


def ttft_overhead(real_ttft_s: list[float | None], sim_ttft_s: list[float | None]) -> float:
    """Median of the per-request gap (same requests, same order); 0 when none pairs up."""
    gaps = [r - s for r, s in zip(real_ttft_s, sim_ttft_s) if r is not None and s is not None and r > 0]
    return statistics.median(gaps) if gaps else 0.0
