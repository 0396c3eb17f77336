"""scripts/sim_fidelity_cluster.py (issue 34 item 4): a bench_cluster setup becomes the same
cluster in the simulator (roles, policies, queues, routing, SLOs), setups it cannot express
are skipped, and a replay gives both classes' figures in bench_serving's terms."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import sim_fidelity_cluster as sfc  # noqa: E402
from sglang_pd.bench.metrics import SloSpec  # noqa: E402

CFG = {"edf_concurrency": 4, "chunk": 512, "short_threshold": 256, "slo_ttft_short_ms": 1000.0,
       "slo_ttft_long_ms": 5000.0, "slo_tpot_ms": 250.0, "seed": 1}
OPTS = argparse.Namespace(profile="llama-3-8b@h100", kv_capacity_tokens=65536, kv_bytes_per_token=1.0,
                          link_gb_s=2.0, link_latency_ms=1.0)


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_our_setups_map_to_the_same_cluster_and_the_rest_are_skipped() -> None:
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    assert _value(argv, "--prefill-role") == "short,long"
    assert _value(argv, "--prefill-policy") == "kairos+" and _value(argv, "--prefill-queues") == "dual"
    assert _value(argv, "--decode-policy") == "slack+"
    assert _value(argv, "--router-prefill") == "length_aware" and _value(argv, "--pool-controller") == "off"
    assert _value(argv, "--slo-ttft-ms-long") == "5000.0"
    no_slack = sfc.sim_argv("ours-no-slack", CFG, OPTS)
    assert no_slack is not None and _value(no_slack, "--decode-policy") == "continuous"
    reserve = sfc.sim_argv("ours+reserve", CFG, OPTS)  # slack+ with its overrun reserve, as the servers
    assert reserve is not None and _value(reserve, "--decode-policy") == "slack+"
    assert _value(reserve, "--decode-reserve-quantile") == "0.9" and "--decode-reserve-quantile" not in argv
    assert _value(sfc.sim_argv("ours-no-pools", CFG, OPTS) or [], "--prefill-role") == "both,both"
    for name in ("sglang-pd", "dynamo-edf", "ours+cond"):  # not ours, or not in the simulator
        assert sfc.sim_argv(name, CFG, OPTS) is None


def test_one_prefill_setups_map_to_one_instance_of_role_both() -> None:
    cfg = dict(CFG, prefills=1)
    argv = sfc.sim_argv("ours", cfg, OPTS)
    assert argv is not None and _value(argv, "--prefill") == "1" and _value(argv, "--prefill-role") == "both"
    assert _value(argv, "--prefill-queues") == "dual"  # the dual queues stay on the one instance
    budget = sfc.sim_argv("ours+budget", dict(cfg, time_budget_ms=300.0), OPTS)
    assert budget is not None and _value(budget, "--prefill-time-budget-ms") == "300"
    assert "--prefill-time-budget-ms" not in argv
    with pytest.raises(KeyError):  # no pools to move work between with one prefill
        sfc.sim_argv("ours+spill", cfg, OPTS)


def test_a_replay_reports_both_classes() -> None:
    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    rec = {"start_times": [0.1 * i for i in range(8)], "input_lens": [64, 80, 2048, 100, 90, 3000, 50, 70],
           "output_lens": [8] * 8}
    by_class = sfc.simulate(argv, rec, SloSpec(1000.0, 250.0, 5000.0, 257))
    assert by_class["short"]["num_requests"] == 6 and by_class["long"]["num_requests"] == 2
    assert by_class["long"]["median_ttft_ms"] > by_class["short"]["median_ttft_ms"] > 0
    lines, errors = sfc.compare(by_class, by_class)
    assert errors and max(map(abs, errors.values())) == 0.0 and any("attainment" in line for line in lines)


def test_compare_signs_the_error_per_class_and_metric() -> None:
    real = {"short": {"median_ttft_ms": 200.0, "p90_ttft_ms": 400.0}, "long": {"median_ttft_ms": 1000.0}}
    sim = {"short": {"median_ttft_ms": 210.0, "p90_ttft_ms": 380.0}, "long": {"median_ttft_ms": 900.0}}
    _, errors = sfc.compare(real, sim)
    assert errors == {("short", "TTFT p50"): 5.0, ("short", "TTFT p90"): -5.0, ("long", "TTFT p50"): -10.0}


def test_fidelity_table_applies_the_bar_per_class() -> None:
    """Mean |error| over a class's metrics and runs <= 5%, none above 10%: a class passes only
    with both; a missing figure in one run is skipped, not counted as 0."""
    runs = [{("short", "TTFT p50"): 4.0, ("short", "TPOT p50"): -2.0, ("long", "TTFT p50"): 3.0},
            {("short", "TTFT p50"): -6.0, ("short", "TPOT p50"): 0.0, ("long", "TTFT p50"): -11.0},
            {("short", "TTFT p50"): 1.0, ("long", "TTFT p50"): 1.0}]
    md, met = sfc.fidelity_table(runs)
    assert met == {"short": True, "long": False}  # short: mean 2.6, max 6; long: mean 5.0 but 11 > 10
    assert "| short | TTFT p50 | +4.0% | -6.0% | +1.0% | 3.7% |" in md
    assert "| short | TPOT p50 | -2.0% | +0.0% | - | 1.0% |" in md
    assert "mean abs 2.6%, max 6.0%" in md and "mean abs 5.0%, max 11.0%" in md
    _, met = sfc.fidelity_table([{("short", "TTFT p50"): 5.5, ("short", "TTFT p90"): 5.5}])
    assert met == {"short": False}  # every figure under 10% but the mean above 5%


def test_calibrating_and_testing_on_one_run_is_refused(tmp_path: Path) -> None:
    import pytest

    with pytest.raises(SystemExit, match="never fit and test"):
        sfc.main(["--bench-dir", str(tmp_path), "--calibrate-from", str(tmp_path), "--profile", "x.json"])


def test_rounds_are_found_in_order_and_a_plain_dir_is_one_run(tmp_path: Path) -> None:
    assert sfc.run_dirs(tmp_path) == [tmp_path]
    for k in (10, 2, 1):
        (tmp_path / f"round{k}").mkdir()
    assert [d.name for d in sfc.run_dirs(tmp_path)] == ["round1", "round2", "round10"]


def test_mean_by_class_averages_each_figure_over_the_runs_that_have_it() -> None:
    runs = [{"short": {"median_ttft_ms": 100.0, "p90_ttft_ms": 300.0, "ttft_attainment": 0.5}},
            {"short": {"median_ttft_ms": 200.0, "p90_ttft_ms": None, "ttft_attainment": 1.0},
             "long": {"median_ttft_ms": 900.0}}]
    assert sfc.mean_by_class(runs) == {"short": {"median_ttft_ms": 150.0, "p90_ttft_ms": 300.0,
                                                 "ttft_attainment": 0.75},
                                       "long": {"median_ttft_ms": 900.0}}


def test_a_bench_dir_with_rounds_is_compared_by_its_mean(tmp_path: Path, capsys) -> None:
    """Two rounds of one window: the engine figure printed is the rounds' mean, and the
    simulator's (deterministic: the same requests) is compared with it."""
    import json

    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    rec = {"start_times": [0.1 * i for i in range(8)], "input_lens": [64, 80, 2048, 100, 90, 3000, 50, 70],
           "output_lens": [8] * 8}
    sim = sfc.simulate(argv, rec, SloSpec(1000.0, 250.0, 5000.0, 257))
    p50 = sim["short"]["median_ttft_ms"]
    (tmp_path / "bench_cluster.json").write_text(json.dumps({"config": CFG}))
    for k, factor in ((1, 0.5), (2, 1.5)):  # the engine's runs straddle the simulator's figure
        d = tmp_path / f"round{k}"
        d.mkdir()
        by_class = {c: {**v, "median_ttft_ms": v["median_ttft_ms"] * factor} for c, v in sim.items()}
        (d / "ours.jsonl").write_text(json.dumps({**rec, "by_class": by_class}) + "\n")
    assert sfc.main(["--bench-dir", str(tmp_path), "--profile", OPTS.profile,
                     "--kv-capacity-tokens", "65536", "--kv-bytes-per-token", "1"]) == 0
    out = capsys.readouterr().out
    assert "mean of 2 rounds" in out
    assert f"| short | TTFT p50 (ms) | {p50:.0f} | {p50:.0f} | +0.0% |" in out


def _bench_dir(path: Path, rec: dict, factor: float) -> None:
    """A bench_cluster log dir of one ``ours`` run whose engines were ``factor`` times slower
    than the simulator (steps) and whose figures are the simulator's at that speed."""
    import json

    argv = sfc.sim_argv("ours", CFG, OPTS)
    assert argv is not None
    res, _ = sfc.replay(argv, rec, sfc.Calibration({"p0": factor, "p1": factor, "d0": factor}))
    busy = {i.name: i.busy_s for i in res.instances}
    path.mkdir()
    (path / "bench_cluster.json").write_text(json.dumps({"config": CFG}))
    ttfts = [None] * len(rec["start_times"])
    for t, k in zip(res.tracks, sfc.replay(argv, rec)[1]):
        ttfts[k] = t.first_token - t.arrival
    summary = sfc.by_class(res, SloSpec(1000.0, 250.0, 5000.0, 257))
    (path / "ours.jsonl").write_text(json.dumps({**rec, "ttfts": ttfts, "by_class": summary}) + "\n")
    steps = {"prefill0": {"extend": {"steps": 1, "seconds": busy["p0"]}},
             "prefill1": {"extend": {"steps": 1, "seconds": busy["p1"]}},
             "decode": {"decode": {"steps": 1, "seconds": busy["d0"]}}}
    (path / "ours_steps.json").write_text(json.dumps(steps))


def test_leave_one_out_predicts_each_run_from_the_others_fits(tmp_path: Path, capsys) -> None:
    """Runs whose engines were 2x and 3x the profile: each is predicted with the other's
    factor (3x and 2x), never its own, so neither is predicted exactly; refused with one run."""
    rec = {"start_times": [0.1 * i for i in range(8)], "input_lens": [64, 80, 2048, 100, 90, 3000, 50, 70],
           "output_lens": [8] * 8}
    _bench_dir(tmp_path / "a", rec, 2.0)
    _bench_dir(tmp_path / "b", rec, 3.0)
    opts = ["--profile", OPTS.profile, "--kv-capacity-tokens", "65536", "--kv-bytes-per-token", "1"]
    assert sfc.main(["--leave-one-out", "--bench-dir", str(tmp_path / "a"), str(tmp_path / "b"), *opts]) == 0
    out = capsys.readouterr().out
    assert "p0 x2.00" in out and "p0 x3.00" in out  # each run's own fit, printed
    assert "2 predicted run(s), calibrated on the 1 other run(s) (leave one out)" in out
    errs = [line for line in out.splitlines() if line.startswith("| short | TTFT p50 |")]
    assert len(errs) == 1 and "+0.0%" not in errs[0]  # a run predicted by its own fit would be exact
    import pytest

    with pytest.raises(SystemExit, match="leave-one-out needs"):
        sfc.main(["--leave-one-out", "--bench-dir", str(tmp_path / "a"), *opts])
