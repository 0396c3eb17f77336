"""Make this rank's TPGroup: a torch.distributed process group built straight from a TCPStore
(no default group, no module state), gloo on CPU and NCCL on CUDA."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from sglang_pd.models.parallel import TPGroup

# A collective that waits this long has a peer that hangs (a dead peer fails at once: its
# socket closes); the engine then fails the step and exits.
COLLECTIVE_TIMEOUT_S = 120.0
JOIN_TIMEOUT_S = 120.0  # a rank's process start (imports) up to joining the group


def make_store(rank: int, size: int, port: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0 listens (port 0: any free port; read ``store.port``), the others connect."""
    return dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def make_group(store: dist.Store, rank: int, size: int, device: str) -> TPGroup:
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    pg: dist.ProcessGroupNCCL | dist.ProcessGroupGloo
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)  # rank r drives GPU r
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, size, opts)
    else:
        pg = dist.ProcessGroupGloo(store, rank, size, timeout)
    return TPGroup(rank, size, pg)


def share_cpu_threads(tp_size: int) -> int:
    """On CPU, give each rank its share of the cores (N ranks each running all-core matmuls
    oversubscribe them, and a collective waits for the slowest). Returns the previous count."""
    previous = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(cores // tp_size, 1))
    return previous
