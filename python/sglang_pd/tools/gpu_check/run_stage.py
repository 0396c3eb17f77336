"""Run one stage in this process and write its piece ``WORK/stage_NAME.json``.

    python -m sglang_pd.tools.gpu_check.run_stage NAME --work DIR --tiny-model DIR [--dry-run]

A stage's ``run(ctx, rec)`` fills ``rec.data`` and calls ``rec.save()`` after each measured
part, so a stage killed by its time limit still leaves what it measured (status "running",
which the report turns into "timeout"). An exception is caught here: status "fail" with the
traceback; ``Skip`` gives status "skip" with its reason.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
import traceback
from pathlib import Path
from typing import Any

from sglang_pd.tools.gpu_check import STAGES
from sglang_pd.tools.gpu_check.common import Ctx, Skip


class Recorder:
    def __init__(self, stage: str, work: Path) -> None:
        self.path = work / f"stage_{stage}.json"
        self.piece: dict[str, Any] = {"stage": stage, "status": "running", "summary": "", "data": {}}
        self.start = time.monotonic()

    @property
    def data(self) -> dict[str, Any]:
        return self.piece["data"]

    def save(self, **fields: Any) -> None:
        self.piece.update(fields)
        self.piece["seconds"] = round(time.monotonic() - self.start, 2)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.piece, indent=1, default=str))
        tmp.replace(self.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=sorted(STAGES))
    ap.add_argument("--work", required=True)
    ap.add_argument("--tiny-model", required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    ctx = Ctx(dry_run=args.dry_run, work=Path(args.work), tiny_model=Path(args.tiny_model))
    rec = Recorder(args.stage, ctx.work)
    rec.save()
    try:
        module = importlib.import_module(f"sglang_pd.tools.gpu_check.{STAGES[args.stage][0]}")
        summary = module.run(ctx, rec)
        status = rec.piece["status"] if rec.piece["status"] in ("fail", "partial") else "ok"
        rec.save(status=status, summary=summary or rec.piece["summary"])
    except Skip as exc:
        rec.save(status="skip", summary=str(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure must land in the report
        rec.save(status="fail", summary=f"{type(exc).__name__}: {exc}"[:300],
                 traceback=traceback.format_exc())
        print(traceback.format_exc(), flush=True)
        return 1
    print(f"[{args.stage}] {rec.piece['status']}: {rec.piece['summary']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
