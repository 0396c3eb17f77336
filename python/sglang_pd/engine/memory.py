"""How many KV pages the pool gets.

--max-total-tokens wins. Otherwise --mem-fraction-static of the device's memory, minus the
weights, goes to the pool. On CPU hosts the pool is lazily committed RAM shared with the OS,
so the default fraction is small and the pool is capped at 1M tokens (configurable by flag).
"""

from __future__ import annotations

import os

import torch

CPU_DEFAULT_FRACTION = 0.10
GPU_DEFAULT_FRACTION = 0.85
CPU_MAX_DEFAULT_TOKENS = 1 << 20


def available_memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def pool_pages(*, max_total_tokens: int | None, mem_fraction_static: float | None, device: str,
               page_size: int, bytes_per_token: int, reserved_bytes: int = 0) -> int:
    """Number of pages including the dummy page 0. ``reserved_bytes`` (CUDA graphs' memory,
    engine/cuda_graph.py: graph_reserve_bytes) comes off the device's free memory first."""
    if max_total_tokens is not None:
        tokens = max_total_tokens
    else:
        on_gpu = device.startswith("cuda")
        fraction = mem_fraction_static or (GPU_DEFAULT_FRACTION if on_gpu else CPU_DEFAULT_FRACTION)
        free = max(0, available_memory_bytes(device) - reserved_bytes)
        tokens = int(free * fraction) // bytes_per_token
        if not on_gpu:
            tokens = min(tokens, CPU_MAX_DEFAULT_TOKENS)
    if tokens < page_size:
        raise ValueError(f"KV pool of {tokens} tokens is smaller than one page ({page_size} tokens)")
    return tokens // page_size + 1
