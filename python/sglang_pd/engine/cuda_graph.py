"""The accelerator side of the model runner: one host-to-device copy per step, and CUDA graphs.

HostStaging packs a step's integer tensors (token ids, positions, KV slots, lengths, the slot
table) into one pinned host buffer and sends it with one non-blocking copy; the lengths also stay
on the host (``ForwardBatch.seq_lens``/``extend_lens``) so metadata never syncs the device.

CudaGraphRunner captures decode steps once per batch-size bucket (``decode_batch_buckets``) and
replays the smallest captured bucket that holds a step, padding the extra rows so that they read
and write only the zero dummy page 0 (the attention backend's store drops writes there).
Short-prefill (tokens x batch) graphs live beside it in ``prefill_graph.py``.

Nothing here runs on CPU except the bucket arithmetic and the padding fill, which the tests check.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.models.config import ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_BS = 160  # --cuda-graph-max-bs default
# graph_reserve_bytes: cuBLAS/Triton workspaces, allocator rounding and graph bookkeeping
GRAPH_RESERVE_FIXED_BYTES = 256 << 20
# ... and rows of split-KV decode scratch beyond one per request: decode_splits aims at two
# programs per SM, so splits x batch stays near 4 x SMs / kv_heads; 640 covers 160 SMs
GRAPH_RESERVE_SPLIT_ROWS = 640


def decode_batch_buckets(max_bs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 up to max_bs (max_bs itself included).
    Finer steps at small batches waste less padded work where each row costs the most."""
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs must be >= 1, got {max_bs}")
    sizes = {b for b in (1, 2, 4, 8) if b <= max_bs} | set(range(16, max_bs + 1, 8)) | {max_bs}
    return sorted(sizes)


def pick_bucket(buckets: list[int], batch_size: int) -> int | None:
    """Smallest captured size holding ``batch_size`` rows; None if none does."""
    for b in buckets:
        if b >= batch_size:
            return b
    return None


def graph_max_bs(device: str, disabled: bool, max_bs: int, backend: AttentionBackend) -> int:
    """Largest decode batch to capture; 0 means no graphs (and no graph memory reserved): off
    CUDA, with --disable-cuda-graph, or with a backend that cannot be captured."""
    if disabled or not str(device).startswith("cuda"):
        return 0
    if not backend.supports_cuda_graph:
        logger.warning("%s has no CUDA-graph support: decode runs without graphs "
                       "(--attention-backend triton or auto captures them)", type(backend).__name__)
        return 0
    return max_bs


def graph_reserve_bytes(max_bs: int, cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Memory to keep out of the KV pool for graphs (memory.pool_pages' reserved_bytes), sized
    before the pool exists; CudaGraphRunner.capture measures what capture really took, logs both
    and warns when the measure is larger. Conservative by construction:
    - the float32 logits buffer [max_bs, vocab] all graphs write into (one, shared);
    - the graph pool's transients for max_bs rows, counting every tensor of one layer (and the
      bf16 logits and their float32 copy) as live at once, although the allocator reuses freed
      blocks inside the pool and the smaller graphs reuse the largest one's pool;
    - split-KV decode scratch (float32 partial outputs and LSEs per query head);
    - a fixed GRAPH_RESERVE_FIXED_BYTES.
    Llama-3-8B at max_bs 160: about 0.5 GB (the per-bucket float32 outputs kept live before,
    one per graph, were 0.87 GB on their own)."""
    size = torch.empty((), dtype=dtype).element_size()
    h, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    qkv = cfg.q_size + 2 * cfg.kv_size
    per_row = size * (8 * h + 3 * qkv + 3 * inter) + 4 * 4 * h + vocab * (size + 4)
    split_scratch = (max_bs + GRAPH_RESERVE_SPLIT_ROWS) * cfg.num_heads * (cfg.head_dim + 1) * 4
    return max_bs * (per_row + 4 * vocab) + split_scratch + GRAPH_RESERVE_FIXED_BYTES


class HostStaging:
    """A grow-only pinned int64 buffer. A copy must finish before the buffer is refilled, so the
    next fill waits on the event recorded after the previous copy (normally long done)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._host: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    def _buffer(self, numel: int) -> torch.Tensor:
        if self._copied is not None:
            self._copied.synchronize()
        if self._host is None or self._host.numel() < numel:
            self._host = torch.empty(max(numel, 4096), dtype=torch.long, pin_memory=True)
        return self._host[:numel]

    def to_device(self, mode: ForwardMode, ids: list[int], positions: list[int], out_loc: list[int],
                  seq_lens: list[int], extend_lens: list[int], token_slots: torch.Tensor,
                  kv_pool: KVPool, attn_backend: AttentionBackend) -> ForwardBatch:
        host = self._buffer(packed_size(len(ids), len(seq_lens), token_slots.numel()))
        pack_step(host, ids, positions, out_loc, seq_lens, extend_lens, token_slots)
        dev = host.to(self.device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return unpack_step(dev, mode, seq_lens, extend_lens, tuple(token_slots.shape), kv_pool,
                           attn_backend)


# Each segment of a packed step starts on a 16-byte boundary (an even int64 index). Triton
# specialises a kernel on whether each pointer argument is 16-byte aligned, so segments at
# offsets that follow the step's token and request counts gave each parity of those counts its
# own compile: on a cold H200 a colocated server compiled 8 extend-attention and 1 RoPE variant
# under its first load, which the start-up warm-up (its own aligned tensors) never saw, and the
# first requests' TTFT was 1.8-2.1 s instead of 9 ms (docs/gpu.md section 5).
SEGMENT_ALIGN = 2


def _up(n: int) -> int:
    return -(-n // SEGMENT_ALIGN) * SEGMENT_ALIGN


def step_layout(num_tokens: int, bsz: int) -> tuple[int, int, int, int, int]:
    """Start offsets of positions, out_loc, the lengths block ([2, bsz] with row stride
    ``_up(bsz)``) and the token slots in a packed step; ids start at 0."""
    pos = _up(num_tokens)
    loc = pos + _up(num_tokens)
    lens = loc + _up(num_tokens)
    slots = lens + 2 * _up(bsz)
    return pos, loc, lens, _up(bsz), slots


def packed_size(num_tokens: int, bsz: int, slots_numel: int) -> int:
    return step_layout(num_tokens, bsz)[4] + slots_numel


def pack_step(out: torch.Tensor, ids: list[int], positions: list[int], out_loc: list[int],
              seq_lens: list[int], extend_lens: list[int], token_slots: torch.Tensor) -> None:
    """Lay a step's integers out in ``out`` (int64, ``packed_size`` long): ids, positions,
    out_loc, seq_lens, extend_lens, then token_slots row by row, each from an aligned offset
    (the gaps hold zeros)."""
    n, bsz = len(ids), len(seq_lens)
    pos, loc, lens, row, slots = step_layout(n, bsz)
    head = [0] * slots
    head[0:n], head[pos : pos + n], head[loc : loc + n] = ids, positions, out_loc
    head[lens : lens + bsz], head[lens + row : lens + row + bsz] = seq_lens, extend_lens
    out[:slots] = torch.tensor(head, dtype=torch.long)
    out[slots:] = token_slots.reshape(-1)


def unpack_step(packed: torch.Tensor, mode: ForwardMode, seq_lens: list[int], extend_lens: list[int],
                slots_shape: tuple[int, ...], kv_pool: KVPool,
                attn_backend: AttentionBackend) -> ForwardBatch:
    """The ForwardBatch viewing a ``pack_step`` layout (on any device); lengths also on the host."""
    n, bsz = sum(extend_lens), len(seq_lens)
    pos, loc, lens, row, slots = step_layout(n, bsz)
    return ForwardBatch(
        mode=mode, input_ids=packed[:n], positions=packed[pos : pos + n],
        out_cache_loc=packed[loc : loc + n],
        seq_lens=torch.tensor(seq_lens, dtype=torch.long),  # host copies: metadata reads these
        extend_lens=torch.tensor(extend_lens, dtype=torch.long),
        token_slots=packed[slots : slots + math.prod(slots_shape)].view(slots_shape), kv_pool=kv_pool,
        attn_backend=attn_backend, device_lens=packed[lens : lens + 2 * row].view(2, row)[:, :bsz])


def warm_on_side_stream(model: torch.nn.Module, batch: ForwardBatch, runs: int = 2) -> torch.Tensor:
    """Run ``model.forward(batch)`` a few times on a side stream before capture (Triton compiles,
    the caching allocator settles), then join the current stream; the last output is returned
    so the caller can size its output buffer."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(runs):
            out = model.forward(batch)
    torch.cuda.current_stream().wait_stream(stream)
    return out


@dataclass
class _Statics:
    """Inputs every captured graph reads, sized for the largest bucket."""

    input_ids: torch.Tensor  # [max_bs]
    positions: torch.Tensor  # [max_bs]
    out_cache_loc: torch.Tensor  # [max_bs]
    lens: torch.Tensor  # [2, max_bs]: seq_lens, extend_lens

    @classmethod
    def allocate(cls, max_bs: int, device: torch.device) -> _Statics:
        def z() -> torch.Tensor:
            return torch.zeros(max_bs, dtype=torch.long, device=device)

        return cls(z(), z(), z(), torch.ones(2, max_bs, dtype=torch.long, device=device))

    def fill(self, batch: ForwardBatch, padded_bs: int) -> None:
        """Real rows first; padding rows read token 0 at position 0 and write slot 0 (dummy
        page 0, where the backends' store drops writes), with length 1."""
        bs = batch.batch_size
        for static, real in ((self.input_ids, batch.input_ids), (self.positions, batch.positions),
                             (self.out_cache_loc, batch.out_cache_loc)):
            static[:bs] = real
            static[bs:padded_bs] = 0
        lens = batch.device_lens
        if lens is None:
            lens = torch.stack([batch.seq_lens, batch.extend_lens])
        self.lens[:, :bs] = lens
        self.lens[:, bs:padded_bs] = 1

    def batch(self, bs: int, kv_pool: KVPool, backend: AttentionBackend) -> ForwardBatch:
        """The ForwardBatch a graph of ``bs`` rows is captured on (views of the statics)."""
        return ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=self.input_ids[:bs], positions=self.positions[:bs],
            out_cache_loc=self.out_cache_loc[:bs], seq_lens=torch.ones(bs, dtype=torch.long),
            extend_lens=torch.ones(bs, dtype=torch.long),
            token_slots=torch.zeros(bs, 1, dtype=torch.long, device=self.input_ids.device),
            kv_pool=kv_pool, attn_backend=backend, device_lens=self.lens[:, :bs])


class CudaGraphRunner:
    """Decode graphs per batch-size bucket. UNVERIFIED on a GPU (written without one)."""

    def __init__(self, model: torch.nn.Module, kv_pool: KVPool, backend: AttentionBackend,
                 max_bs: int = DEFAULT_MAX_BS, max_context_len: int | None = None) -> None:
        if not backend.supports_cuda_graph:
            raise ValueError(f"{type(backend).__name__} does not support CUDA graphs")
        self.model, self.kv_pool, self.backend = model, kv_pool, backend
        self.buckets = decode_batch_buckets(max_bs)
        self.max_context_len = max_context_len or (kv_pool.num_pages - 1) * kv_pool.page_size
        device = kv_pool.kv_buffer.device
        self.statics = _Statics.allocate(self.buckets[-1], device)
        backend.init_cuda_graph_state(self.buckets[-1], self.max_context_len, kv_pool)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, ForwardBatch]] = {}
        self._pool_handle: Any = None  # the graphs' shared memory pool, after the first capture
        # float32 [max_bs, vocab]: every graph writes its logits here, so one buffer stays live
        # instead of one output per graph (0.87 GB for Llama-3-8B's 22 buckets)
        self._logits: torch.Tensor | None = None
        self.captured_bytes = 0  # device memory capture took, measured (logged against the reserve)

    def can_run(self, batch: ForwardBatch) -> bool:
        return (batch.mode == ForwardMode.DECODE and batch.batch_size <= self.buckets[-1]
                and int(batch.token_slots.shape[1]) <= self.max_context_len)

    @torch.inference_mode()
    def capture(self, reserved_bytes: int | None = None) -> None:
        """Largest bucket first, so the smaller graphs reuse its memory pool and the logits
        buffer is sized by it. ``reserved_bytes``: what the engine kept out of the KV pool."""
        free_at_start = torch.cuda.mem_get_info()[0]
        for bs in reversed(self.buckets):
            start, free_before = time.perf_counter(), torch.cuda.mem_get_info()[0]
            batch = self.statics.batch(bs, self.kv_pool, self.backend)
            self.backend.init_forward_metadata_capture(batch)
            warm = warm_on_side_stream(self.model, batch)
            if self._logits is None:
                self._logits = torch.empty(warm.shape, dtype=torch.float32, device=warm.device)
            del warm
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool_handle):
                self._logits[:bs].copy_(self.model.forward(batch))
            self._pool_handle = graph.pool()
            self._graphs[bs] = (graph, batch)
            used = free_before - torch.cuda.mem_get_info()[0]
            logger.info("captured decode graph bs=%d in %.2f s, %.1f MiB", bs,
                        time.perf_counter() - start, used / 2**20)
        self.captured_bytes = free_at_start - torch.cuda.mem_get_info()[0]
        logger.info("CUDA graphs: %d buckets took %.0f MiB (reserved %s)", len(self.buckets),
                    self.captured_bytes / 2**20,
                    "nothing" if reserved_bytes is None else f"{reserved_bytes / 2**20:.0f} MiB")
        if reserved_bytes is not None and self.captured_bytes > reserved_bytes:
            logger.warning("CUDA graphs took %.0f MiB, more than the %.0f MiB reserved for them: "
                           "lower --mem-fraction-static or --cuda-graph-max-bs if memory runs out",
                           self.captured_bytes / 2**20, reserved_bytes / 2**20)

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of the real rows: a view of the shared buffer, valid until the next replay."""
        padded = pick_bucket(self.buckets, batch.batch_size)
        if padded is None or padded not in self._graphs or self._logits is None:
            raise RuntimeError(f"no captured graph holds a decode batch of {batch.batch_size}")
        graph, _static_batch = self._graphs[padded]
        self.statics.fill(batch, padded)
        self.backend.init_forward_metadata_replay(batch, padded)
        graph.replay()
        return self._logits[: batch.batch_size]
