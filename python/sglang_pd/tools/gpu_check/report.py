"""Join the stage pieces into ``gpu_report.json`` and ``gpu_report.md`` and print the short table.

    python -m sglang_pd.tools.gpu_check.report --work DIR --out DIR [--dry-run]

A stage without a piece crashed before writing one; a piece still "running" was killed by its
time limit (check.sh's ``timeout``): both are reported with the exit code and the log's tail.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from sglang_pd.tools.gpu_check import STAGES

LOG_LINES = 50


def tail(path: Path, n: int = LOG_LINES) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []


def collect(work: Path) -> list[dict[str, Any]]:
    stages = []
    for name, (_, limit) in STAGES.items():
        path, rc_path = work / f"stage_{name}.json", work / f"rc_{name}"
        piece: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {
            "stage": name, "status": "not run", "summary": "no piece written", "data": {}}
        rc = int(rc_path.read_text().strip() or -1) if rc_path.exists() else None
        piece.update(limit_s=limit, exit_code=rc)
        if rc in (124, 137) or piece["status"] == "running":
            piece["status"] = "timeout"
            piece["summary"] = f"killed at its {limit} s limit; " + piece.get("summary", "")
        elif piece["status"] in ("running", "not run") and rc not in (None, 0):
            piece["status"] = "fail"
            piece["summary"] = f"crashed (exit {rc}) before writing its piece"
        piece["log_tail"] = tail(work / "logs" / f"{name}.log")
        stages.append(piece)
    return stages


def git_commit() -> str:
    # the device machine's copy of the tree may carry a stale .git: the caller can name the commit
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=False).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def short_table(stages: list[dict[str, Any]]) -> str:
    rows = ["| stage | status | s | summary |", "| --- | --- | --- | --- |"]
    for s in stages:
        summary = str(s.get("summary", "")).replace("|", "/").replace("\n", " ")[:160]
        rows.append(f"| {s['stage']} | {s['status']} | {s.get('seconds', '')} | {summary} |")
    return "\n".join(rows)


def decode_table(data: dict[str, Any]) -> list[str]:
    cells = [v for v in data.values() if isinstance(v, dict) and "batch" in v and "eager_ms" in v]
    if not cells:
        return []
    out = ["", "| batch | context | graph ms | graph MBU | graph+build ms | eager ms | eager MBU |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in cells:
        out.append(f"| {c['batch']} | {c['context']} | {c.get('graph_ms', '-')} | {c.get('graph_mbu', '-')} "
                   f"| {c.get('graph_with_build_ms', '-')} | {c['eager_ms']} | {c['eager_mbu']} |")
    return out


def prefill_table(data: dict[str, Any]) -> list[str]:
    rows = [v for v in data.values() if isinstance(v, dict) and "mfu" in v]
    if not rows:
        return []
    return ["", "| tokens | ms | TFLOP/s | MFU |", "| --- | --- | --- | --- |"] + [
        f"| {r['tokens']} | {r['ms']} | {r['tflops']} | {r['mfu']} |" for r in rows]


def markdown(meta: dict[str, Any], stages: list[dict[str, Any]]) -> str:
    lines = [f"# GPU check report ({'dry run, CPU' if meta['dry_run'] else meta.get('device', '?')})", "",
             f"commit {meta['commit']}, {meta['time']}, host {meta['host']}", "", short_table(stages)]
    for s in stages:
        lines += ["", f"## {s['stage']}: {s['status']}", "", str(s.get("summary", ""))]
        if s["stage"] == "decode":
            lines += decode_table(s["data"])
        if s["stage"] == "prefill":
            lines += prefill_table(s["data"])
        errors = [(k, v) for k, v in s["data"].items() if isinstance(v, dict) and "traceback" in v]
        if "traceback" in s:
            errors.insert(0, ("stage", s))
        for key, err in errors:
            lines += ["", f"{key}:", "```", err["traceback"].rstrip()[-4000:], "```"]
        if s["status"] not in ("ok", "skip") and s.get("log_tail"):
            lines += ["", "log tail:", "```", *s["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    args = ap.parse_args(argv)
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = collect(work)
    env = next((s for s in stages if s["stage"] == "env"), {})
    software = env.get("data", {}).get("software", {})
    meta = {"dry_run": args.dry_run, "commit": git_commit(), "host": platform.node(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "device": software.get("device_name", "cpu") if isinstance(software, dict) else "?"}
    (out / "gpu_report.json").write_text(json.dumps({"meta": meta, "stages": stages}, indent=1, default=str))
    (out / "gpu_report.md").write_text(markdown(meta, stages))
    if not args.quiet:
        print(f"\nreport: {out / 'gpu_report.md'}, {out / 'gpu_report.json'}\n")
        print(short_table(stages))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
