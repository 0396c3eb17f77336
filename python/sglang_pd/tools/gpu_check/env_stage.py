"""Stage env: the card, the software, and the two ceilings every other figure is divided by:
a device-to-device copy (bytes read + written per second) and a large bf16 matmul."""

from __future__ import annotations

import platform
import subprocess
from typing import Any

import torch

from sglang_pd.tools.gpu_check.common import Ctx, attempt, sig, time_ms


def nvidia_smi() -> dict[str, Any]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=15, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"available": False, "why": str(exc)[:200]}
    name, mem, driver, clock = (x.strip() for x in out.strip().splitlines()[0].split(","))
    return {"available": True, "name": name, "memory": mem, "driver": driver, "max_sm_clock": clock}


def software() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    for name in ("triton", "flashinfer", "nixl", "msgspec", "zmq", "fastapi", "uvicorn", "transformers"):
        try:
            info[name] = getattr(__import__(name), "__version__", "present")
        except Exception as exc:  # noqa: BLE001 - absent or broken: say which
            info[name] = f"absent ({type(exc).__name__})"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device_name=p.name, sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1),
                    capability=f"{p.major}.{p.minor}")
    return info


def measure_ceilings(ctx: Ctx, small: bool = False) -> dict[str, Any]:
    """Copy: 2 GiB (64 MiB on CPU) random bytes, counted once read and once written. Matmul:
    8192^3 bf16 (512^3 float32 on CPU) on random normal data."""
    dev = ctx.device
    nbytes = (64 << 20) if ctx.dry_run else ((512 << 20) if small else (2 << 30))
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy = time_ms(lambda: dst.copy_(src), dev, iters=5 if ctx.dry_run else 30)
    n = 512 if ctx.dry_run else (4096 if small else 8192)
    a = torch.randn(n, n, dtype=ctx.dtype, device=dev)
    b = torch.randn(n, n, dtype=ctx.dtype, device=dev)
    mm = time_ms(lambda: a @ b, dev, iters=5 if ctx.dry_run else 30)
    return {"copy_gbps": sig(2 * nbytes / mm_s(copy) / 1e9),
            "matmul_tflops": sig(2 * n**3 / mm_s(mm) / 1e12),
            "copy_bytes": nbytes, "copy_ms": copy, "matmul_n": n, "matmul_ms": mm,
            "dtype": ctx.dtype_name}


def mm_s(t: dict[str, float]) -> float:
    return t["median_ms"] / 1e3


def run(ctx: Ctx, rec: Any) -> str:
    attempt(rec, "nvidia_smi", nvidia_smi)
    attempt(rec, "software", software)
    c = attempt(rec, "ceilings", lambda: measure_ceilings(ctx))
    if "copy_gbps" in c:
        rec.data["copy_gbps"], rec.data["matmul_tflops"] = c["copy_gbps"], c["matmul_tflops"]
    name = rec.data["software"].get("device_name", "cpu") if isinstance(rec.data["software"], dict) else "?"
    return (f"{name}: copy {rec.data.get('copy_gbps', '?')} GB/s, "
            f"matmul {rec.data.get('matmul_tflops', '?')} TFLOP/s ({ctx.dtype_name})")
