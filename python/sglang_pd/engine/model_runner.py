"""Model runner: turns a scheduled step into one ForwardBatch, runs the model, returns logits.

Batch tensors are built once per step with one loop per request (never per token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from sglang_pd.core.step import BucketGrid, ForwardMode
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.cuda_graph import CudaGraphRunner, HostStaging
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.prefill_graph import PrefillGraphRunner
from sglang_pd.engine.request import Req
from sglang_pd.engine.tp.messages import StepPlan


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_pool: KVPool, attn_backend: AttentionBackend,
                 cuda_graph_max_bs: int = 0, max_positions: int | None = None,
                 graph_reserved_bytes: int | None = None,
                 prefill_graph_grid: BucketGrid | None = None) -> None:
        self.model = model
        # Positions are checked here, on the host, when a batch is built (the model's RoPE
        # table ends at max_positions): a check inside the forward would sync the device every
        # step and cannot be captured in a CUDA graph. None: unchecked (hand-built tests).
        self.max_positions = max_positions
        self.kv_pool = kv_pool
        self.attn_backend = attn_backend
        self.page_size = kv_pool.page_size
        self._page_offsets = torch.arange(self.page_size, dtype=torch.long)
        # The model's device is the pool's. Batches are built on the host; on an accelerator
        # they travel in one pinned, non-blocking copy per step (engine/cuda_graph.py).
        self.device = kv_pool.kv_buffer.device
        self._staging = HostStaging(self.device) if self.device.type == "cuda" else None
        self.graph_runner: CudaGraphRunner | None = None
        if cuda_graph_max_bs > 0 and self.device.type == "cuda" and attn_backend.supports_cuda_graph:
            self.graph_runner = CudaGraphRunner(model, kv_pool, attn_backend, cuda_graph_max_bs)
            self.graph_runner.capture(graph_reserved_bytes)
        # short-prefill graphs (engine/prefill_graph.py): the grid is given only where a short
        # queue feeds this runner (prefill servers, colocated dual queues)
        # tensor parallelism: rank 0's launcher sets this to send each step's plan to the other
        # ranks before the forward (engine/tp/); None with one rank
        self.step_sink: Callable[[StepPlan], None] | None = None
        self.prefill_graphs: PrefillGraphRunner | None = None
        if (prefill_graph_grid is not None and self.device.type == "cuda"
                and attn_backend.supports_prefill_graph):
            self.prefill_graphs = PrefillGraphRunner(model, kv_pool, attn_backend, prefill_graph_grid)
            self.prefill_graphs.capture()

    def _token_slots(self, pages: Sequence[Sequence[int]], seq_lens: list[int]) -> torch.Tensor:
        """[B, max(seq_lens)] KV slot of every token; padding points into dummy page 0."""
        max_pages = max(len(p) for p in pages)
        # one tensor from one flat list: a torch.tensor call per request costs more than the list
        flat: list[int] = []
        for p in pages:
            flat.extend(p)
            flat.extend([0] * (max_pages - len(p)))
        table = torch.tensor(flat, dtype=torch.long).view(len(pages), max_pages)
        slots = (table[:, :, None] * self.page_size + self._page_offsets).view(len(pages), -1)
        return slots[:, : max(seq_lens)]

    def _slot(self, req: Req, pos: int) -> int:
        return req.pages[pos // self.page_size] * self.page_size + pos % self.page_size

    def build_extend(self, plan: Sequence[tuple[Req, int]]) -> ForwardBatch:
        reqs = [r for r, _ in plan]
        ids: list[int] = []
        positions: list[int] = []
        out_loc: list[int] = []
        seq_lens: list[int] = []
        extend_lens: list[int] = []
        S = self.page_size
        for r, n in plan:
            start, end = r.kv_len, r.kv_len + n
            ids.extend(r.token_ids(start, end))
            positions.extend(range(start, end))
            # slots of positions [start, end): page-wise ranges, not per-token arithmetic
            for page_idx in range(start // S, (end - 1) // S + 1):
                lo, hi = max(start, page_idx * S), min(end, (page_idx + 1) * S)
                base = r.pages[page_idx] * S - page_idx * S
                out_loc.extend(range(base + lo, base + hi))
            seq_lens.append(end)
            extend_lens.append(n)
        return self._batch(ForwardMode.EXTEND, [r.pages for r in reqs], ids, positions, out_loc, seq_lens, extend_lens)

    def build_decode(self, reqs: Sequence[Req]) -> ForwardBatch:
        ids = [r.output_ids[-1] for r in reqs]
        positions = [r.kv_len for r in reqs]
        out_loc = [self._slot(r, r.kv_len) for r in reqs]
        seq_lens = [r.kv_len + 1 for r in reqs]
        return self._batch(ForwardMode.DECODE, [r.pages for r in reqs], ids, positions, out_loc, seq_lens, [1] * len(reqs))

    def build_plan(self, plan: StepPlan) -> ForwardBatch:
        """Rank > 0 of tensor parallelism: rank 0's step, on this rank's pool and weights."""
        return self._batch(ForwardMode(plan.mode), plan.pages, plan.input_ids, plan.positions,
                           plan.out_loc, plan.seq_lens, plan.extend_lens)

    def _batch(self, mode: ForwardMode, pages: list[list[int]], ids: list[int],
               positions: list[int], out_loc: list[int], seq_lens: list[int],
               extend_lens: list[int]) -> ForwardBatch:
        """``pages``: each request's KV pages."""
        check_positions(seq_lens, self.max_positions)
        if self.step_sink is not None:
            self.step_sink(StepPlan(mode.value, ids, positions, out_loc, seq_lens, extend_lens,
                                    pages))
        if self._staging is not None:  # lengths stay on the host too (seq_lens, extend_lens)
            batch = self._staging.to_device(mode, ids, positions, out_loc, seq_lens, extend_lens,
                                            self._token_slots(pages, seq_lens), self.kv_pool,
                                            self.attn_backend)
            self.attn_backend.init_forward_metadata(batch)
            return batch
        batch = ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            out_cache_loc=torch.tensor(out_loc, dtype=torch.long),
            seq_lens=torch.tensor(seq_lens, dtype=torch.long),
            extend_lens=torch.tensor(extend_lens, dtype=torch.long),
            token_slots=self._token_slots(pages, seq_lens),
            kv_pool=self.kv_pool,
            attn_backend=self.attn_backend,
        )
        self.attn_backend.init_forward_metadata(batch)
        return batch

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [B, vocab] of each request's last new token."""
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        if self.prefill_graphs is not None:  # short-prefill graphs
            bucket = self.prefill_graphs.bucket_for(batch)
            if bucket is not None:
                return self.prefill_graphs.replay(batch, bucket)
        return self.model.forward(batch).float()


def check_positions(seq_lens: Sequence[int], max_positions: int | None) -> None:
    """Every new token's position (at most seq_len - 1) must be below ``max_positions``."""
    longest = max(seq_lens, default=0)
    if max_positions is not None and longest > max_positions:
        raise ValueError(f"position {longest - 1} exceeds max_position_embeddings {max_positions}")
