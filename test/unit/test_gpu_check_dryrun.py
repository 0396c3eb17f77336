"""scripts/gpu/check.sh --dry-run: the device run's every stage, on CPU at tiny sizes, must
produce the report (JSON + Markdown) with each stage's status; none may fail or time out, so
a stage broken by a change shows here before it wastes a device call."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_pd.tools.gpu_check import STAGES

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str]:
    out = tmp_path_factory.mktemp("gpucheck")
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("OUT", None)
    proc = subprocess.run(["bash", str(REPO / "scripts/gpu/check.sh"), "--dry-run", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_report.json").read_text()), (out / "gpu_report.md").read_text(), proc.stdout


def test_every_stage_reported_and_none_failed(report: tuple[dict, str, str]) -> None:
    data, _, stdout = report
    assert data["meta"]["dry_run"] is True
    by_name = {s["stage"]: s for s in data["stages"]}
    assert list(by_name) == list(STAGES)
    bad = {n: (s["status"], s["summary"], s.get("traceback", "")[-800:]) for n, s in by_name.items()
           if s["status"] not in ("ok", "skip")}
    assert not bad, bad
    pd = by_name["pd"]
    if importlib.util.find_spec("nixl") is None:  # no NIXL here: the stage says why it skipped
        assert pd["status"] == "skip" and "NIXL" in pd["summary"]
    else:  # NIXL over UCX on the CPU: the PD pair answers the colocated server's tokens
        assert pd["status"] == "ok", pd
        assert pd["data"]["pd_nixl"]["identical"] == pd["data"]["pd_nixl"]["prompts"] == 8
        assert all(pd["data"]["pd_nixl"]["pages_back"].values())
    # the stages that can run on a CPU did, with figures
    assert by_name["env"]["data"]["copy_gbps"] > 0 and by_name["env"]["data"]["matmul_tflops"] > 0
    assert by_name["parity"]["data"]["torch_eager_float32"]["sampled_served"] == 6
    decode = [v for v in by_name["decode"]["data"].values() if isinstance(v, dict) and "eager_mbu" in v]
    assert len(decode) == 4 and all(c["eager_mbu"] > 0 for c in decode)
    prefill = [v for v in by_name["prefill"]["data"].values() if isinstance(v, dict) and "mfu" in v]
    assert len(prefill) == 2 and all(r["mfu"] > 0 for r in prefill)
    assert by_name["serving"]["data"]["bench_serving"]["completed"] == 4
    assert by_name["serving"]["data"]["sampled_request"]["status"] == 200
    # the plan and the wheel list are printed, the short table last
    assert "stage decode: limit" in stdout and "msgspec==" in stdout
    assert stdout.rstrip().splitlines()[-1].startswith("[check")
    assert "| stage | status |" in stdout


def test_markdown_has_the_table_and_a_section_per_stage(report: tuple[dict, str, str]) -> None:
    _, md, _ = report
    assert "| stage | status | s | summary |" in md
    for name in STAGES:
        assert f"## {name}: " in md
    assert "| batch | context |" in md and "| tokens | ms |" in md


def test_a_crashing_stage_is_recorded_and_the_next_runs(tmp_path: Path) -> None:
    """report.collect: a stage killed by its limit (piece left "running", exit 124) is reported
    as timeout with its log tail, one that died without a piece as fail."""
    from sglang_pd.tools.gpu_check.report import collect

    (tmp_path / "logs").mkdir()
    (tmp_path / "stage_env.json").write_text(json.dumps({"stage": "env", "status": "running",
                                                         "summary": "", "data": {"x": 1}}))
    (tmp_path / "rc_env").write_text("124\n")
    (tmp_path / "rc_kernels").write_text("1\n")
    (tmp_path / "logs" / "kernels.log").write_text("\n".join(f"line {i}" for i in range(80)))
    stages = {s["stage"]: s for s in collect(tmp_path)}
    assert stages["env"]["status"] == "timeout" and stages["env"]["data"] == {"x": 1}
    assert stages["kernels"]["status"] == "fail" and stages["kernels"]["log_tail"][-1] == "line 79"
    assert len(stages["kernels"]["log_tail"]) == 50
    assert stages["parity"]["status"] == "not run"
