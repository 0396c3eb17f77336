"""What every stage shares: the run context, timing with CUDA events, the piece a stage writes."""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import torch


class Skip(Exception):
    """A stage (or a part) that cannot run here, with the reason."""


@dataclass
class Ctx:
    dry_run: bool
    work: Path  # per-run scratch: stage pieces, logs, models
    tiny_model: Path
    device: str = field(init=False)
    dtype: torch.dtype = field(init=False)

    def __post_init__(self) -> None:
        self.device = "cpu" if self.dry_run else "cuda"
        self.dtype = torch.float32 if self.dry_run else torch.bfloat16

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def piece(self, stage: str) -> dict[str, Any] | None:
        """An earlier stage's result (the env stage's ceilings, say), if it wrote one."""
        path = self.work / f"stage_{stage}.json"
        return json.loads(path.read_text()) if path.exists() else None


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], Any], device: str, iters: int = 10, warmup: int = 3) -> dict[str, float]:
    """Median (and min/max) of ``iters`` timed calls after ``warmup``: CUDA events on a GPU
    (one pair per call, so the median drops outliers), perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    if device.startswith("cuda"):
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(iters)]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in pairs]
    else:
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "iters": iters}


def ceilings(ctx: Ctx) -> dict[str, float]:
    """The copy bandwidth (GB/s) and matmul rate (TFLOP/s) measured by the env stage; measured
    here again (smaller) if that stage failed."""
    env = ctx.piece("env")
    data = (env or {}).get("data", {})
    if "copy_gbps" in data and "matmul_tflops" in data:
        return {"copy_gbps": data["copy_gbps"], "matmul_tflops": data["matmul_tflops"]}
    from sglang_pd.tools.gpu_check.env_stage import measure_ceilings

    return measure_ceilings(ctx, small=True)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def attempt(rec: Any, key: str, fn: Callable[[], Any]) -> Any:
    """Run one part of a stage: its result (or its error with traceback, or its skip reason)
    lands in ``rec.data[key]`` and is saved at once; a failed part marks the stage "partial"
    and the stage goes on with its other parts."""
    import traceback

    try:
        result = fn()
    except Skip as exc:
        result = {"skipped": str(exc)}
    except Exception as exc:  # noqa: BLE001 - recorded, the next part still runs
        result = {"error": f"{type(exc).__name__}: {exc}"[:500], "traceback": traceback.format_exc()}
        print(result["traceback"], flush=True)
        rec.piece["status"] = "partial"
    rec.data[key] = result
    rec.save()
    return result


def failed(result: Any) -> bool:
    return isinstance(result, dict) and "error" in result


def sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant figures (a CPU's 0.02 TFLOP/s must not print as 0.0)."""
    return float(f"{x:.{digits}g}")
