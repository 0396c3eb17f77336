"""Tensor parallelism for the models: the rank's group, how a checkpoint splits over ranks, and
the parallel layers (Megatron-style: column-parallel in, row-parallel out, one all-reduce per
attention block and one per MLP).

``TPGroup.single()`` (world size 1) is the default everywhere: every parallel layer then is the
plain layer it replaces (same parameter names and shapes, same forward), so single-process
behaviour and speed do not change. With N ranks:
- q heads split evenly; KV heads split evenly when N divides them, and when there are fewer KV
  heads than ranks each rank holds the one KV head its q heads read (replicated N / kv times);
- gate/up (column) and down (row) split the intermediate dimension; o_proj splits its input;
- the embedding and the LM head split the vocabulary into N equal blocks (the last padded).
The group wraps a torch.distributed ProcessGroup made by the engine (engine/tp/): models never
create processes, they only reduce and gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sglang_pd.models.config import ModelConfig


@dataclass(frozen=True)
class TPGroup:
    rank: int
    size: int
    pg: Any = None  # a torch.distributed ProcessGroup (gloo on CPU, NCCL on CUDA); None when size 1

    @staticmethod
    def single() -> TPGroup:
        return TPGroup(0, 1, None)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        if self.size > 1:
            self.pg.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along the last dimension (rank order)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.pg.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)


# ---------------------------------------------------------------------------- shard arithmetic
def check_tp_size(cfg: ModelConfig, tp_size: int) -> None:
    """Raises ValueError naming the model dimension that ``tp_size`` ranks cannot split."""
    if tp_size < 1:
        raise ValueError(f"--tp-size must be >= 1, got {tp_size}")
    problems = []
    if cfg.num_heads % tp_size:
        problems.append(f"its {cfg.num_heads} attention heads")
    kv = cfg.num_kv_heads
    if kv % tp_size and tp_size % kv:
        problems.append(f"its {kv} KV heads (N must divide them, or be a multiple of them)")
    if cfg.intermediate_size % tp_size:
        problems.append(f"its intermediate size {cfg.intermediate_size}")
    if problems:
        sizes = [n for n in range(1, cfg.num_heads + 1) if _fits(cfg, n)]
        raise ValueError(f"--tp-size {tp_size} cannot split this {cfg.architecture} model: "
                         f"{tp_size} does not divide {', '.join(problems)}; sizes that fit: {sizes}")


def _fits(cfg: ModelConfig, n: int) -> bool:
    kv = cfg.num_kv_heads
    return (cfg.num_heads % n == 0 and (kv % n == 0 or n % kv == 0)
            and cfg.intermediate_size % n == 0)


def local_heads(cfg: ModelConfig, tp: TPGroup) -> int:
    return cfg.num_heads // tp.size


def local_kv_heads(cfg: ModelConfig, tp: TPGroup) -> int:
    """KV heads this rank holds (1 when they are replicated over ranks)."""
    return max(cfg.num_kv_heads // tp.size, 1)


def kv_head_start(cfg: ModelConfig, tp: TPGroup) -> int:
    """The first KV head of this rank: with fewer KV heads than ranks, the one that rank's q
    heads [rank * Hq/N, (rank + 1) * Hq/N) belong to (q head h reads KV head h // (Hq/kv))."""
    if cfg.num_kv_heads >= tp.size:
        return tp.rank * local_kv_heads(cfg, tp)
    return tp.rank * cfg.num_kv_heads // tp.size


def vocab_block(vocab: int, tp: TPGroup) -> tuple[int, int, int]:
    """(first row, real rows, padded rows) of this rank's vocabulary block."""
    padded = -(-vocab // tp.size)
    start = min(tp.rank * padded, vocab)
    return start, min(padded, vocab - start), padded


# ---------------------------------------------------------------------------- layers
class ColumnParallelLinear(nn.Linear):
    """y_local = x W_local^T: this rank's block of output features. No communication: the
    output stays split (heads, intermediate features) until a row-parallel layer sums it."""


class RowParallelLinear(nn.Linear):
    """y = sum over ranks of x_local W_local^T (+ bias once, after the sum). ``in_features``
    is this rank's block of the input (the column-parallel layer's output block)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype | None,
                 tp: TPGroup) -> None:
        super().__init__(in_features, out_features, bias=bias, dtype=dtype)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x)
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y.add_(self.bias)


class VocabParallelEmbedding(nn.Module):
    """Token embedding over this rank's vocabulary block (no nn.Embedding random init: the
    loader fills the weight). Ids outside the block look up zeros; the all-reduce sums the one
    rank that holds each id."""

    def __init__(self, vocab_size: int, hidden: int, dtype: torch.dtype, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.start, self.rows, padded = vocab_block(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(padded, hidden, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)


def vocab_parallel_logits(h: torch.Tensor, weight: torch.Tensor, vocab_size: int,
                          tp: TPGroup) -> torch.Tensor:
    """float32 logits [B, vocab]: each rank's vocabulary block, gathered on every rank (only
    rank 0 samples; the gather keeps one code path on gloo and NCCL)."""
    if tp.size == 1:
        return F.linear(h, weight).float()
    full = tp.all_gather_last(F.linear(h, weight).float())
    return full if full.shape[-1] == vocab_size else full[..., :vocab_size]
