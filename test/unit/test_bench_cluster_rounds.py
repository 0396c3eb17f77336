"""bench_cluster's rounds (issue 34: a claim at the knee rests on several rounds, each setup
early and late): the run order alternates, deltas compare runs of the same round, and the
summary counts the rounds that met the bars."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_cluster as bc  # noqa: E402
import bench_cluster_report as rep  # noqa: E402
from bench_cluster_setups import cluster_setups  # noqa: E402


@dataclass
class FakeRun:  # the fields of bench_cluster.Run the report reads
    setup: str
    round: int
    by_class: dict = field(default_factory=dict)
    overall: dict = field(default_factory=dict)
    ok: bool = True
    completed: int = 10
    num_requests: int = 10
    errors: dict = field(default_factory=dict)


def run(setup: str, k: int, short: float, long: float) -> FakeRun:
    cls = {"short": {"num_requests": 9, "completed": 9, "ttft_attainment": short},
           "long": {"num_requests": 1, "completed": 1, "ttft_attainment": long}}
    return FakeRun(setup, k, cls, {"num_requests": 10, "completed": 10, "slo_attainment": (9 * short + long) / 10,
                                   "goodput_rps": short})


def test_rounds_alternate_the_order() -> None:
    assert bc.round_plan(["a", "b"], 3) == [(1, "a"), (1, "b"), (2, "b"), (2, "a"), (3, "a"), (3, "b")]
    assert bc.round_plan(["a", "b", "c"], 1) == [(1, "a"), (1, "b"), (1, "c")]
    args = bc.build_parser().parse_args(["--rounds", "4", "--no-prime"])
    assert args.rounds == 4 and args.prime is False
    assert bc.build_parser().parse_args([]).prime is None  # main: on, off with --quick


def test_deltas_compare_within_a_round_and_the_summary_counts_the_bars() -> None:
    runs = [run("base", 1, 0.40, 1.0), run("ours", 1, 0.75, 1.0),
            run("ours", 2, 0.60, 0.9), run("base", 2, 0.50, 1.0)]
    md = rep.table(runs)
    rows = {line.split("|")[1].strip(): line for line in md.splitlines()[2:]}
    assert "+35.0 / +0.0" in rows["ours #1"] and "+10.0 / -10.0" in rows["ours #2"]
    summary = rep.rounds_summary(runs)
    ours = next(line for line in summary.splitlines() if line.startswith("| ours |"))
    cells = [c.strip() for c in ours.split("|")[1:-1]]
    assert cells[1] == "2" and cells[2] == "67.5 / 95.0"
    assert cells[5] == "+22.5 [+10.0, +35.0]" and cells[6] == "-5.0 [-10.0, +0.0]"
    assert cells[7] == "1 / 1 of 2"  # +35 met the short bar once; -10 missed the long bar once


def test_spread_is_each_runs_distance_from_the_setups_mean() -> None:
    runs = [run("base", 1, 0.4, 1.0), run("ours", 1, 0.7, 1.0), run("ours", 2, 0.6, 1.0)]
    for r, p90 in zip(runs, (900.0, 800.0, 1200.0)):
        r.by_class["short"]["p90_ttft_ms"] = p90
    spread = rep.rounds_spread(runs)
    ours = next(line for line in spread.splitlines() if line.startswith("| ours |"))
    cells = [c.strip() for c in ours.split("|")[1:-1]]
    assert cells[1] == "2" and cells[3] == "20.0%"  # 800 and 1200 lie 200 from their mean 1000
    assert cells[2] == "-" and cells[-1] == "20.0%"  # no p50 recorded: left out of the mean
    assert "| base |" not in spread  # one round: no spread


def test_a_cluster_that_never_came_up_is_started_once_more(monkeypatch) -> None:
    """run_measured: a run whose servers never answered /health measured nothing and is run
    again (once); a run that failed while measuring is kept as it failed."""
    calls: list[str] = []

    def fake(problems: list[str]):
        def run_setup(s, args, model, workload, log_dir):
            calls.append(s.name)
            problem = problems.pop(0)
            return bc.Run(s.name, ok=not problem, problem=problem)
        return run_setup

    setup = cluster_setups(4)["ours"]
    down = "decode not healthy in 120 s (rc=None)"
    for problems, want_calls, want_ok in (([down, ""], 2, True), ([down, down], 2, False),
                                          (["3 failed: {}", ""], 1, False), ([""], 1, True)):
        calls.clear()
        monkeypatch.setattr(bc, "run_setup", fake(list(problems)))
        r = bc.run_measured(setup, None, Path("m"), Path("w"), Path("l"))
        assert (len(calls), r.ok) == (want_calls, want_ok), problems


def test_pin_layouts_name_the_engines_on_the_first_core() -> None:
    assert bc.pinned_alone("shared") == bc.pinned_alone("priority") == ("prefill0", "prefill1")
    assert bc.pinned_alone("split") == ("prefill0",)
    assert bc.build_parser().parse_args([]).pin_layout == "shared"


def test_a_pin_layout_without_pinning_is_refused(capsys) -> None:
    import signal

    import pytest

    handler = signal.getsignal(signal.SIGTERM)  # main() installs its own
    try:
        with pytest.raises(SystemExit):
            bc.main(["--pin-layout", "priority", "--no-pin-cores", "--setups", "ours"])
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert "--pin-layout priority needs --pin-cores" in capsys.readouterr().err
