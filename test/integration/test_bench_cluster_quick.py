"""scripts/bench_cluster.py --quick (issue 34 item 2's CI smoke): a whole PD cluster (two
prefill servers of roles short and long, a decode, our router) on the tiny model replays the
scaled trace; every request completes, both classes are measured, and the table, JSON and
log scan come out. One setup only, so that it stays well under a minute on a quiet machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pd_utils import require_nixl

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)


def test_bench_cluster_quick_runs_our_stack_and_reports_both_classes(tiny_model_dir, tmp_path):
    require_nixl()
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'python'}:{REPO / 'router'}:{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_cluster.py"), "--quick", "--setups", "ours",
         "--model-dir", str(tiny_model_dir), "--log-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=220, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "| ours | yes | 14/14 |" in proc.stdout
    data = json.loads((tmp_path / "bench_cluster.json").read_text())
    (run,) = data["runs"]
    assert run["ok"] and not run["tracebacks"] and run["errors"] == {}
    # pinned by default: the prefill engines on one core, decode and the rest on the others
    if len(os.sched_getaffinity(0)) >= 2:
        assert run["pinned"].startswith("2 engine(s) on core"), run["pinned"]
        assert "the rest with 1 engine(s) on" in run["pinned"], run["pinned"]
    lens = [json.loads(line)["input_length"] for line in (tmp_path / "workload.jsonl").open()]
    n_long = sum(n > 256 for n in lens)  # the short-prefill threshold
    assert len(lens) == 14 and 1 <= n_long <= 4
    assert run["by_class"]["long"]["num_requests"] == n_long
    assert run["by_class"]["short"]["num_requests"] == 14 - n_long
    for cls in ("short", "long"):
        assert run["by_class"][cls]["ttft_attainment"] is not None
        assert run["by_class"][cls]["median_ttft_ms"] > 0
    assert "| TTFT att short / long (%) |" in (tmp_path / "bench_cluster.md").read_text()
