"""sglang_pd/sim/calibration.py (issue 34 item 4): the simulator fitted to one measured cluster
run. Step factors scale every step of an instance, the fit recovers the factors that made the
"measured" busy times, and the TTFT overhead is the median per-request gap."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import sim_fidelity_cluster as sfc  # noqa: E402
from sglang_pd.sim.calibration import (  # noqa: E402
    Calibration,
    fit_factors,
    measured_busy,
    scaled,
    ttft_overhead,
)
from sglang_pd.sim.profiles import build_cost  # noqa: E402

CFG = {"edf_concurrency": 4, "chunk": 512, "short_threshold": 256, "slo_ttft_short_ms": 1000.0,
       "slo_ttft_long_ms": 5000.0, "slo_tpot_ms": 250.0, "seed": 1}
OPTS = argparse.Namespace(profile="llama-3-8b@h100", kv_capacity_tokens=65536, kv_bytes_per_token=1.0,
                          link_gb_s=2.0, link_latency_ms=1.0)
REC = {"start_times": [0.02 * i for i in range(12)], "input_lens": [64, 80, 2048, 100, 90, 3000, 50, 70, 3000,
                                                                    120, 60, 2500],
       "output_lens": [8] * 12, "ttfts": [0.5] * 12}


def test_a_scaled_cost_makes_every_step_longer_by_the_factor() -> None:
    cost = build_cost("llama-3-8b@h100")
    slow = scaled(cost, 2.5)
    for chunks in ([(512, 0)], [(128, 1024), (64, 0)]):
        assert slow.prefill_s(chunks) == pytest.approx(2.5 * cost.prefill_s(chunks))
    assert slow.decode(8, 4096, 1024) == pytest.approx(2.5 * cost.decode(8, 4096, 1024))


def test_the_fit_recovers_the_factors_that_made_the_measured_busy_times() -> None:
    """Requests one at a time (1 s apart), so no step batches more when steps slow down: busy
    time alone then fixes each factor (where batching absorbs a slowdown it cannot; the fit
    then matches the busy time, which is what queueing sees)."""
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    rec = dict(REC, start_times=[1.0 * i for i in range(12)])
    truth = Calibration({"p0": 3.0, "p1": 1.5, "d0": 2.0})
    res, _ = sfc.replay(argv, rec, truth)
    busy = {i.name: i.busy_s for i in res.instances}
    fitted, _ = fit_factors(lambda c: sfc.replay(argv, rec, c)[0], busy)
    for name, f in truth.step_factor.items():
        assert fitted.step_factor[name] == pytest.approx(f, rel=0.05), fitted.step_factor


def test_the_overhead_shifts_ttft_but_not_tpot() -> None:
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    base, _ = sfc.replay(argv, REC, Calibration({}))
    late, _ = sfc.replay(argv, REC, Calibration({}, ttft_overhead_s=0.25))
    for a, b in zip(base.tracks, late.tracks):
        assert a.first_token is not None and b.first_token is not None and a.finish and b.finish
        assert b.first_token - a.first_token == pytest.approx(0.25)
        assert b.finish - b.first_token == pytest.approx(a.finish - a.first_token)


def test_calibrate_reads_the_overhead_off_the_gap_to_the_engine() -> None:
    """With the engine's TTFT each the simulated one + 300 ms, the overhead is 300 ms."""
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    res, idx = sfc.replay(argv, REC, None)
    busy = {i.name: i.busy_s for i in res.instances}
    ttfts = [0.0] * len(idx)
    for t, k in zip(res.tracks, idx):
        assert t.first_token is not None
        ttfts[k] = t.first_token - t.arrival + 0.3
    rec = dict(REC, ttfts=ttfts)
    steps = {n: {"extend": {"steps": 1.0, "seconds": busy[i]}}
             for n, i in (("prefill0", "p0"), ("prefill1", "p1"), ("decode", "d0"))}
    cal = sfc.calibrate(argv, rec, steps)
    assert cal.ttft_overhead_s == pytest.approx(0.3, abs=0.02)
    assert all(f == pytest.approx(1.0, rel=0.02) for f in cal.step_factor.values())


def test_measured_busy_sums_the_modes_and_names_the_instances() -> None:
    steps = {"prefill0": {"extend": {"steps": 3, "seconds": 1.5}},
             "decode": {"decode": {"steps": 10, "seconds": 2.0}, "mixed": {"steps": 1, "seconds": 0.5}},
             "router": {}}
    assert measured_busy(steps) == {"p0": 1.5, "d0": 2.5}
    assert ttft_overhead([1.0, None, 2.0, 3.0], [0.5, 0.1, 1.0, None]) == pytest.approx(0.75)
    assert ttft_overhead([], []) == 0.0


def test_shared_cores_stretch_a_step_by_the_instances_mid_step() -> None:
    """Alone on half a core a step takes twice as long; on one core shared by the cluster a
    step never runs faster than on its own, and slower while others step too."""
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    spaced = dict(REC, start_times=[1.0 * i for i in range(12)])  # never two steps at once
    base = {i.name: i.busy_s for i in sfc.replay(argv, spaced, Calibration({}))[0].instances}
    half = {i.name: i.busy_s for i in sfc.replay(argv, spaced, Calibration({}, cores=0.5))[0].instances}
    assert all(half[n] == pytest.approx(2 * base[n]) for n in base)
    dense_base = sfc.replay(argv, REC, Calibration({}))[0]
    dense_one = sfc.replay(argv, REC, Calibration({}, cores=1.0))[0]
    assert sum(i.busy_s for i in dense_one.instances) > 1.05 * sum(i.busy_s for i in dense_base.instances)


def test_shared_prefill_core_leaves_decode_its_own() -> None:
    """bench_cluster's pinned layout: the prefill instances share the core, decode does not:
    on half a core the prefills' steps take twice as long, decode's as long as unshared."""
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    spaced = dict(REC, start_times=[1.0 * i for i in range(12)])
    half = {i.name: i.busy_s for i in sfc.replay(argv, spaced, Calibration({}, cores=0.5, shared="prefill"))[0]
            .instances}
    base = {i.name: i.busy_s for i in sfc.replay(argv, spaced, Calibration({}))[0].instances}
    assert half["d0"] == pytest.approx(base["d0"])
    assert half["p0"] == pytest.approx(2 * base["p0"]) and half["p1"] == pytest.approx(2 * base["p1"])
    shared = Calibration({"p0": 1.0}, cores=1.0, shared="prefill")
    assert Calibration.from_json(shared.to_json()) == shared


def test_drift_reads_one_on_a_machine_as_fast_as_at_calibration() -> None:
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    cal = Calibration({"p0": 2.0, "p1": 2.0, "d0": 2.0})
    res, _ = sfc.replay(argv, REC, cal)
    busy = {i.name: i.busy_s for i in res.instances}
    steps = {"prefill0": {"extend": {"steps": 1.0, "seconds": busy["p0"]}},
             "prefill1": {"extend": {"steps": 1.0, "seconds": 1.5 * busy["p1"]}}}
    assert sfc.drift(res, dict(REC, e2e_latencies=[]), steps).endswith("p0 x1.00, p1 x1.50")


def test_fits_of_several_rounds_average_per_instance() -> None:
    """bench_cluster_fidelity --rounds: seed 0's rounds are each fitted, then averaged; an
    instance one fit lacks is averaged over the fits that have it."""
    fits = [Calibration({"p0": 1.2, "p1": 1.6, "d0": 1.0}, 0.030, cores=1.0, shared="prefill"),
            Calibration({"p0": 1.4, "p1": 1.2}, 0.050, cores=1.0, shared="prefill")]
    mean = Calibration.mean(fits, "seed0, 2 rounds")
    assert mean.step_factor == pytest.approx({"p0": 1.3, "p1": 1.4, "d0": 1.0})
    assert mean.ttft_overhead_s == pytest.approx(0.040)
    assert (mean.source, mean.cores, mean.shared) == ("seed0, 2 rounds", 1.0, "prefill")
