"""CPU tuning for the engine process: the allocator, and how many threads the forward uses.

glibc serves every allocation above M_MMAP_THRESHOLD (128 KiB at first) with a fresh mmap
and returns it with munmap on free, so each step's large tensors (logits alone are
batch x vocab x 4 bytes, 50 MB at 256 x 49152) are page-faulted in and zeroed by the kernel
again every step. Raising the mmap and trim thresholds keeps freed blocks in the heap for
reuse. Measured on SmolLM2-135M shapes, 256 running requests, 2 cores: decode-step time
outside the model forward 8.7 ms -> 4-5 ms, and the forward itself faster too (fewer page
faults in the matmuls' outputs). Setting the threshold also stops glibc's dynamic threshold
adjustment, which otherwise keeps flipping mid-sized step tensors between heap and mmap.
Set SGLANG_PD_KEEP_MALLOC=1 to leave the allocator alone (e.g. under jemalloc/tcmalloc).

Threads: torch starts one OpenMP worker per core, and every operator ends at a barrier that
waits for all of them. The engine never has the cores to itself: its frontend process (HTTP,
streaming), the router and the clients run beside it. When any of them takes a core from one
worker, every operator of the step waits for that worker, so a step costs a scheduler slice
per operator instead of its arithmetic, and the cost stops following the tokens computed.
Measured (issue 30, 2 cores, scripts/profile_prefix_extend.py, SmolLM2-135M shape, a
232-token prompt vs the same with its first 72 tokens cached vs a fresh 160-token one, one at
a time): 2 threads 2.00 / 2.01 / 2.23 s per step (a prefix hit saved nothing); 1 thread
0.83 / 0.59 / 0.59 s (the hit saves what its tokens cost, and every step is 2.4x faster). So
the engine leaves one core to the rest (vLLM's CPU backend reserves one the same way):
``cores - 1`` threads, at least 1. SGLANG_PD_CPU_THREADS=N sets the count; an explicit
OMP_NUM_THREADS is respected as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Mapping

import torch

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest allowed value on 64-bit hosts
_TRIM_THRESHOLD_BYTES = 1 << 31
RESERVED_CORES = 1  # for the frontend process, the router and clients on the same host


def tune_allocator() -> bool:
    """Returns True when the thresholds were raised (glibc found and accepted them)."""
    if os.environ.get("SGLANG_PD_KEEP_MALLOC") == "1":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1 and ok
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    logger.debug("malloc thresholds raised: %s", ok)
    return ok


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def engine_threads(env: Mapping[str, str] | None = None, cores: int | None = None) -> int | None:
    """Threads for the engine's forward on CPU; None: leave torch's count (OMP_NUM_THREADS set)."""
    if env is None:
        env = os.environ
    if env.get("SGLANG_PD_CPU_THREADS"):
        n = int(env["SGLANG_PD_CPU_THREADS"])
        if n < 1:
            raise ValueError(f"SGLANG_PD_CPU_THREADS must be >= 1, got {n}")
        return n
    if env.get("OMP_NUM_THREADS"):
        return None
    return max((available_cores() if cores is None else cores) - RESERVED_CORES, 1)


def tune_threads() -> int:
    """Set the engine's intra-op threads (one engine on the host, no tensor parallelism: TP
    ranks share the cores themselves, engine/tp/group.py); returns the count in use."""
    n = engine_threads()
    if n is not None:
        torch.set_num_threads(n)
    logger.info("engine CPU threads: %d", torch.get_num_threads())
    return torch.get_num_threads()
