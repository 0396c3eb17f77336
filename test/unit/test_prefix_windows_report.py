"""scripts/prefix_windows_report.py: per window, the TTFT ratios pool each side's runs, the
stepping cut and the off server's load come from the runs' step seconds, and the window is
named by its requests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import prefix_windows_report as pwr  # noqa: E402


def _run(cache: bool, ttft: list[float], step: float, load: float, hit: float) -> dict:
    return {"cache": cache, "ttft_s": ttft, "step_s": step, "load": load, "hit_rate": hit}


def test_a_window_pools_each_side_and_cuts_stepping(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps({
        "args": {"warm_requests": "1500", "num_requests": "150", "qps": "3.14", "warm_shared_only": "True",
                 "warm_bounded": "False"},
        "ceiling": 0.467, "sim_hit_rate": 0.46,
        "runs": [_run(True, [1.0, 2.0], 30.0, 0.6, 0.45), _run(False, [4.0, 6.0], 50.0, 0.9, 0.0),
                 _run(False, [2.0, 8.0], 50.0, 1.0, 0.0), _run(True, [3.0, 1.0], 30.0, 0.6, 0.47)]}))
    w = pwr.read_window(path)
    assert (w.first, w.size, w.qps) == (1501, 150, 3.14)
    assert w.hit_rate == pytest.approx(0.46) and w.off_load == pytest.approx(0.95)
    assert w.step_cut == pytest.approx(0.4)
    assert w.p50_ratio == pytest.approx(5.0 / 1.5)  # off [2, 4, 6, 8] over on [1, 1, 2, 3]
    row = pwr.table([w]).splitlines()[-1]
    assert row.startswith("| 1501-1650 | shared | 46.7% | 46.0% / +0.0 |") and "3.33x" in row
    path.write_text(json.dumps({"args": {"warm_requests": "0", "num_requests": "2", "qps": "1"}, "ceiling": 0,
                                "sim_hit_rate": 0, "runs": [_run(True, [1.0], 1.0, 1.0, 0.0)]}))
    with pytest.raises(SystemExit):
        pwr.read_window(path)  # one side only
