"""PD with tensor parallelism, the rank-0 gather/scatter design (docs/disaggregation.md s. 11).

Rank 0 of a PD server with --tp-size N > 1 keeps a staging copy of the KV pool with ALL the
model's KV heads ([layers, 2, pages, page_size, H, head_dim], the same page ids as the pool),
and that staging buffer, not its own pool, is what its one NIXL agent registers. So between
the two servers pages always travel whole (all H heads), whatever P and D are, and SGLang's
routers and our bootstrap see nothing new:

- prefill: before a chunk's pages are written to decode, ``gather`` collects every rank's KV
  heads of those pages into the staging pages (one gather collective; the lowest rank that
  holds a head supplies it: ``tp_mapping.gather_pieces``);
- decode: when a room's KV has all arrived in the staging pages, ``scatter`` hands each rank
  its heads of them (``tp_mapping.rank_heads``; one scatter collective), before the request
  decodes.

The other ranks join these collectives when rank 0's KVGather / KVScatter message reaches
them through the ordered plan channel, so they stay in step with the forwards. Cost: rank 0
holds H / (H/N) = N times its pool again (sized in build.py), and each chunk's KV crosses the
TP group once more than the rank-to-rank design would move it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch

from sglang_pd.disaggregation.tp_mapping import gather_pieces, rank_heads
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.tp.messages import KVGather, KVScatter
from sglang_pd.models.parallel import TPGroup

ROOT = 0


@dataclass
class MoveStats:
    gathers: int = 0
    scatters: int = 0
    pages: int = 0
    seconds: float = 0.0


class TPKVMover:
    """Rank 0's side. ``runner.step_sink`` (set when the ranks attach) carries the messages."""

    def __init__(self, runner: Any, pool: KVPool, group: TPGroup, num_kv_heads: int) -> None:
        self.runner, self.pool, self.group, self.num_kv_heads = runner, pool, group, num_kv_heads
        shape = list(pool.kv_buffer.shape)
        shape[4] = num_kv_heads
        self.staging = torch.zeros(shape, dtype=pool.kv_buffer.dtype, device=pool.kv_buffer.device)
        self.stats = MoveStats()
        # a collective failed here: the ranks may be inside one rank 0 left, so the group is out
        # of step for good (PD's poll swallows the error; TPRanks.failure reads this and the
        # engine exits). The launcher finds the mover on the runner.
        self.broken = False
        runner.tp_kv_mover = self

    def _announce(self, msg: KVGather | KVScatter) -> None:
        sink = cast(Callable[[Any], None] | None, self.runner.step_sink)
        if sink is None:
            raise RuntimeError("tensor-parallel ranks are not attached; cannot move KV")
        sink(msg)

    def gather(self, pages: list[int]) -> None:
        """Fill the staging copy of ``pages`` with every rank's KV heads of them."""
        try:
            self._gather(pages)
        except BaseException:
            self.broken = True
            raise

    def scatter(self, pages: list[int]) -> None:
        """Hand every rank (this one included) its KV heads of the staging copy of ``pages``."""
        try:
            self._scatter(pages)
        except BaseException:
            self.broken = True
            raise

    def _gather(self, pages: list[int]) -> None:
        t0 = time.perf_counter()
        self._announce(KVGather(list(pages)))
        idx = torch.tensor(pages, dtype=torch.long, device=self.staging.device)
        parts = gather_kv(self.pool, self.group, idx, root=True)
        for piece in gather_pieces(self.num_kv_heads, self.group.size):
            src = parts[piece.rank][:, :, :, :, piece.local_lo:piece.local_lo + piece.width]
            self.staging[:, :, idx, :, piece.head_lo:piece.head_lo + piece.width] = src
        if self.staging.is_cuda:  # NIXL reads the staging pages right after this returns
            torch.cuda.synchronize(self.staging.device)
        self._count(len(pages), t0, gathered=True)

    def _scatter(self, pages: list[int]) -> None:
        t0 = time.perf_counter()
        self._announce(KVScatter(list(pages)))
        idx = torch.tensor(pages, dtype=torch.long, device=self.staging.device)
        parts = [self.staging[:, :, idx, :, rank_heads(self.num_kv_heads, self.group.size, r).start:
                              rank_heads(self.num_kv_heads, self.group.size, r).stop].contiguous()
                 for r in range(self.group.size)]
        scatter_kv(self.pool, self.group, idx, parts)
        self._count(len(pages), t0, gathered=False)

    def _count(self, pages: int, t0: float, gathered: bool) -> None:
        if gathered:
            self.stats.gathers += 1
        else:
            self.stats.scatters += 1
        self.stats.pages += pages
        self.stats.seconds += time.perf_counter() - t0


# ------------------------------------------------------------------ both sides of a collective
def gather_kv(pool: KVPool, group: TPGroup, idx: torch.Tensor, root: bool) -> list[torch.Tensor]:
    """Every rank sends its KV heads of pages ``idx``; rank 0 gets them all (rank order)."""
    local = pool.kv_buffer[:, :, idx].contiguous()
    outs = [torch.empty_like(local) for _ in range(group.size)] if root else []
    group.pg.gather(outs, local, ROOT).wait()
    return outs


def scatter_kv(pool: KVPool, group: TPGroup, idx: torch.Tensor,
               parts: list[torch.Tensor] | None = None) -> None:
    """Rank 0 passes each rank's part; every rank writes its part into its pool's ``idx``."""
    shape = list(pool.kv_buffer.shape)
    shape[2] = int(idx.numel())
    out = torch.empty(shape, dtype=pool.kv_buffer.dtype, device=pool.kv_buffer.device)
    group.pg.scatter(out, parts or [], ROOT).wait()
    pool.kv_buffer[:, :, idx] = out


def serve_kv_move(msg: KVGather | KVScatter, pool: KVPool, group: TPGroup) -> None:
    """A rank > 0's part of rank 0's gather or scatter."""
    idx = torch.tensor(msg.pages, dtype=torch.long, device=pool.kv_buffer.device)
    if isinstance(msg, KVGather):
        gather_kv(pool, group, idx, root=False)
    else:
        scatter_kv(pool, group, idx)
