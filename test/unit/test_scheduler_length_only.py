"""The engine's Scheduler runs the simulator's way: 10,000 length-only requests (no token
lists), fcfs + continuous, a counting KV allocator, and torch never imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ten_thousand_length_only_requests_without_torch(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts/bench_scheduler.py"), "--requests", "10000",
                           "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    res = json.loads(out.read_text())
    assert res["torch_imported"] is False
    assert res["finished"] == 10_000 and res["aborted"] == 0
    assert res["free_pages"] == res["usable_pages"]  # every page back
