"""Short-prefill CUDA graphs on the AWD bucket grid (PLA-Serve section 3.1).

A short-queue step of B' <= B new prompts of at most L tokens each runs as the captured (L, B)
bucket of ``--short-prefill-buckets`` (core/step.py BucketGrid, the one definition): B
rows of exactly L token slots. Real tokens go to row b, column position (no cached prefix, so
a token's position is its index in its row); every other slot is padding that reads token 0 at
position 0 and writes KV slot 0, inside dummy page 0, where the capturable backends' store drops
writes. So the whole bucket's shapes and attention lengths are constants (every row attends
over L keys, causally): the Triton backend's ordinary extend metadata, built once per bucket on
these statics, is the graph's metadata, and a replay only refreshes the statics' contents.

Why padded queries are harmless: causal attention lets a real token at column i see columns
<= i only, all real; padded columns (and padded rows) see real keys or the zero page, their
outputs are discarded, and the logits are taken at each real row's last token
(``ForwardBatch.row_last``).

Steps a bucket cannot express run eagerly: a request with a cached prefix or a later chunk of a
partial prompt (seq_len > extend_len), mixed steps, shapes beyond the grid.

On CPU nothing is captured: ``replay`` runs the model eagerly through the same statics and
metadata a graph would read, which is how the tests check the padding semantics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang_pd.core.step import BucketGrid, ForwardMode
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.cuda_graph import warm_on_side_stream
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.models.config import ModelConfig

if TYPE_CHECKING:
    from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)


def prefill_graph_reserve_bytes(grid: BucketGrid, cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Device memory to keep out of the KV pool for these graphs: the largest bucket's
    transients (every tensor of one layer counted live at once, as for decode graphs), its
    statics, and float32 logits for max_batch rows. Conservative: the smaller buckets reuse
    the largest one's graph pool."""
    size = torch.empty((), dtype=dtype).element_size()
    h, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    qkv = cfg.q_size + 2 * cfg.kv_size
    tokens = grid.max_tokens * grid.max_batch
    per_token = size * (8 * h + 3 * qkv + 3 * inter) + 4 * 4 * h + 4 * 8
    return tokens * per_token + grid.max_batch * vocab * (size + 8)


@dataclass
class _PrefillStatics:
    """Inputs every prefill graph reads, sized for the grid's largest L x B."""

    input_ids: torch.Tensor  # [L_max * B_max]
    positions: torch.Tensor  # [L_max * B_max]
    out_cache_loc: torch.Tensor  # [L_max * B_max]; viewed [B, L] it is also the slot table
    row_last: torch.Tensor  # [B_max]: index of each row's last real token
    arange: torch.Tensor  # [B_max]: 0..B_max-1, to build indices without host data

    @classmethod
    def allocate(cls, grid: BucketGrid, device: torch.device) -> _PrefillStatics:
        n = grid.max_tokens * grid.max_batch

        def z(k: int) -> torch.Tensor:
            return torch.zeros(k, dtype=torch.long, device=device)

        return cls(z(n), z(n), z(n), z(grid.max_batch),
                   torch.arange(grid.max_batch, dtype=torch.long, device=device))

    def batch(self, tokens: int, rows: int, kv_pool: KVPool, backend: AttentionBackend) -> ForwardBatch:
        """The bucket's ForwardBatch: views of the statics, every row L tokens long."""
        n, device = tokens * rows, self.input_ids.device
        lens = torch.full((rows,), tokens, dtype=torch.long)
        # With no cached prefix, token (row b, column i) sits in slot out_cache_loc[b * L + i]:
        # the slot table is the same buffer; padding columns point at dummy slot 0.
        return ForwardBatch(
            mode=ForwardMode.EXTEND, input_ids=self.input_ids[:n], positions=self.positions[:n],
            out_cache_loc=self.out_cache_loc[:n], seq_lens=lens, extend_lens=lens.clone(),
            token_slots=self.out_cache_loc[:n].view(rows, tokens), kv_pool=kv_pool,
            attn_backend=backend, device_lens=torch.stack([lens, lens]).to(device),
            row_last=self.row_last[:rows])

    def fill(self, batch: ForwardBatch, tokens: int, rows: int) -> None:
        """Scatter the real step into the (tokens, rows) layout on the device (no host sync):
        token j of request b goes to b * L + position; everything else is padding (token 0,
        position 0, slot 0)."""
        n, bs = tokens * rows, batch.batch_size
        device = self.input_ids.device
        ext = batch.device_lens[1] if batch.device_lens is not None else batch.extend_lens.to(device)
        row = torch.repeat_interleave(self.arange[:bs], ext, output_size=batch.num_tokens)
        dest = row * tokens + batch.positions
        for static, real in ((self.input_ids, batch.input_ids), (self.positions, batch.positions),
                             (self.out_cache_loc, batch.out_cache_loc)):
            view = static[:n]
            view.zero_()
            view.index_copy_(0, dest, real)
        self.row_last[:bs] = self.arange[:bs] * tokens + ext - 1
        self.row_last[bs:rows] = self.arange[bs:rows] * tokens + tokens - 1


class PrefillGraphRunner:
    """Short-prefill graphs, one per (L, B) bucket. UNVERIFIED on a GPU (written without one)."""

    def __init__(self, model: torch.nn.Module, kv_pool: KVPool, backend: AttentionBackend,
                 grid: BucketGrid) -> None:
        self.model, self.kv_pool, self.backend, self.grid = model, kv_pool, backend, grid
        self.device = kv_pool.kv_buffer.device
        self.on_cuda = self.device.type == "cuda"
        if self.on_cuda and not backend.supports_prefill_graph:
            raise ValueError(f"{type(backend).__name__} cannot capture short-prefill graphs")
        self.statics = _PrefillStatics.allocate(grid, self.device)
        self._batches: dict[tuple[int, int], ForwardBatch] = {}
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._logits: torch.Tensor | None = None  # float32 [B_max, vocab], shared by every graph
        self.replays = 0  # steps served here (tests and logs)
        self.captured_bytes = 0

    def buckets(self) -> list[tuple[int, int]]:
        """Largest first, so smaller graphs reuse its memory pool."""
        return sorted(((t, b) for t in self.grid.tokens for b in self.grid.batch),
                      key=lambda tb: (tb[0] * tb[1], tb), reverse=True)

    def bucket_for(self, batch: ForwardBatch) -> tuple[int, int] | None:
        """The (L, B) bucket this step runs as, or None to run it eagerly. Host tensors only."""
        if batch.mode != ForwardMode.EXTEND or batch.batch_size == 0:
            return None
        if not torch.equal(batch.seq_lens, batch.extend_lens):
            return None  # a cached prefix or a later chunk: its rows would not start at 0
        bucket = self.grid.bucket(int(batch.extend_lens.max()), batch.batch_size)
        if bucket is None or bucket not in self._batches:
            return None
        return bucket

    def _static_batch(self, tokens: int, rows: int) -> ForwardBatch:
        batch = self.statics.batch(tokens, rows, self.kv_pool, self.backend)
        self.backend.init_forward_metadata(batch)  # constant lengths: fixed-shape metadata
        self._batches[(tokens, rows)] = batch
        return batch

    @torch.inference_mode()
    def capture(self) -> None:
        """On CUDA, one graph per bucket; on CPU only the buckets' static batches (replays
        then run eagerly through them)."""
        if not self.on_cuda:
            for tokens, rows in self.buckets():
                self._static_batch(tokens, rows)
            return
        free_at_start, pool = torch.cuda.mem_get_info()[0], None
        start = time.perf_counter()
        for tokens, rows in self.buckets():
            batch = self._static_batch(tokens, rows)
            warm = warm_on_side_stream(self.model, batch)
            if self._logits is None:
                self._logits = torch.empty(self.grid.max_batch, warm.shape[1], dtype=torch.float32,
                                           device=warm.device)
            del warm
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._logits[:rows].copy_(self.model.forward(batch))
            pool = graph.pool()
            self._graphs[(tokens, rows)] = graph
        self.captured_bytes = free_at_start - torch.cuda.mem_get_info()[0]
        logger.info("short-prefill graphs: %d buckets (%s) in %.1f s, %.0f MiB", len(self._graphs),
                    self.grid, time.perf_counter() - start, self.captured_bytes / 2**20)

    def replay(self, batch: ForwardBatch, bucket: tuple[int, int]) -> torch.Tensor:
        """float32 logits [B', vocab] of each real row's last token; on CUDA a view of the shared
        buffer, valid until the next replay."""
        tokens, rows = bucket
        static = self._batches[bucket]
        self.statics.fill(batch, tokens, rows)
        self.replays += 1
        if not self.on_cuda:
            if not self.backend.supports_prefill_graph:
                # (the dry run's torch backend reads slot contents into its metadata on the
                # host, and stores padding into page 0: plumbing only, never a graph)
                self.backend.init_forward_metadata(static)
            return self.model.forward(static).float()[: batch.batch_size]
        assert self._logits is not None
        self._graphs[bucket].replay()
        return self._logits[: batch.batch_size]


def short_prefill_graph_grid(args: ServerArgs, graphs: bool) -> BucketGrid | None:
    """The grid to capture, or None: only with graphs on (a capturable backend on CUDA) and
    where a short queue forms bucketed steps: a prefill server, or dual prefill queues."""
    if not graphs or not (args.disaggregation_mode == "prefill" or args.prefill_queues == "dual"):
        return None
    return args.bucket_grid
