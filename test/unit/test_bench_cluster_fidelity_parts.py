"""The pieces of the cluster fidelity command (issue 34 item 4) that need no server:
bench_cluster's /metrics reading and trace windows, and the per-seed runs' arguments."""

from __future__ import annotations

import argparse
import json
import sys

from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_cluster as bc  # noqa: E402
import bench_cluster_fidelity as bcf  # noqa: E402

METRICS = """# HELP sglang:engine_step_seconds Wall time of one engine step
sglang:engine_step_seconds_bucket{le="0.01",mode="extend",model_name="m"} 2.0
sglang:engine_step_seconds_count{mode="extend",model_name="m"} 4.0
sglang:engine_step_seconds_sum{mode="extend",model_name="m"} 1.25
sglang:engine_step_seconds_count{mode="decode",model_name="m"} 10.0
sglang:engine_step_seconds_sum{mode="decode",model_name="m"} 0.5
sglang:engine_step_batch_size_sum{mode="decode",model_name="m"} 33.0
"""


def test_step_metrics_give_steps_and_seconds_per_mode() -> None:
    assert bc.parse_step_metrics(METRICS) == {"extend": {"steps": 4.0, "seconds": 1.25},
                                              "decode": {"steps": 10.0, "seconds": 0.5}}
    assert bc.parse_step_metrics("") == {}


def test_a_skipped_window_is_other_requests_starting_at_zero(tmp_path: Path) -> None:
    args = bc.build_parser().parse_args(["--num-prompts", "10", "--rate", "2"])
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    bc.write_workload(args, first)
    args.trace_skip = 10
    bc.write_workload(args, second)
    a = [json.loads(x) for x in first.read_text().splitlines()]
    b = [json.loads(x) for x in second.read_text().splitlines()]
    assert len(a) == len(b) == 10 and a[0]["timestamp"] == b[0]["timestamp"] == 0.0
    assert [r["input_length"] for r in a] != [r["input_length"] for r in b]
    # the window is rescaled to --rate on its own: its mean gap is 1 / rate
    assert b[-1]["timestamp"] / 1e3 == pytest.approx(len(b) / 2.0)


def test_each_seed_runs_its_own_window() -> None:
    a = argparse.Namespace(quick=False, num_prompts=60, rate=1.5, setups="ours", trace="azure-conv",
                           out=Path("/x"), rounds=1, prefills=1)
    for seed in (0, 2):
        argv = bcf.bench_argv(a, seed, Path(f"/x/seed{seed}"))
        assert argv[argv.index("--seed") + 1] == str(seed)
        assert argv[argv.index("--trace-skip") + 1] == str(60 * seed)
        assert argv[argv.index("--log-dir") + 1] == f"/x/seed{seed}"
        assert "--rounds" not in argv
        assert argv[argv.index("--prefills") + 1] == "1"  # the cluster the simulator then follows
    repeated = bcf.bench_argv(argparse.Namespace(**{**vars(a), "rounds": 3}), 1, Path("/r"))
    assert repeated[repeated.index("--rounds") + 1] == "3" and "--no-prime" in repeated
    quick = bcf.bench_argv(argparse.Namespace(**{**vars(a), "quick": True}), 1, Path("/q"))
    assert "--quick" in quick and quick[quick.index("--trace-skip") + 1] == str(bcf.QUICK_PROMPTS)


def test_a_token_rate_loads_windows_of_different_lengths_alike(tmp_path: Path) -> None:
    """--prompt-tokens-per-s: each window's request rate is set so it offers the same prompt
    tokens a second; a window of longer prompts gets fewer requests a second."""
    offered = {}
    for skip in (0, 80):
        args = bc.build_parser().parse_args(["--num-prompts", "80", "--trace-skip", str(skip),
                                             "--prompt-tokens-per-s", "222"])
        path = tmp_path / f"w{skip}.jsonl"
        wl = bc.write_workload(args, path)
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        tokens, span = sum(r["input_length"] for r in recs), recs[-1]["timestamp"] / 1e3
        assert tokens / span == pytest.approx(222.0) == wl["prompt_tokens_per_s"]
        assert wl["rate"] == args.rate == pytest.approx(80 / span)
        offered[skip] = (tokens, args.rate)
    (short_tokens, short_rate), (long_tokens, long_rate) = offered[0], offered[80]
    assert long_tokens > short_tokens and long_rate < short_rate
