"""Start-up warm-up on a GPU: one eager forward per kernel variant, so that no request pays a
JIT compile (Triton compiles each constexpr combination on first use: seconds, in the middle
of someone's TTFT).

Variants of the Triton backend's kernels (sgl_pd_kernel/triton_attention.py) beyond the fixed
model shape and dtype: the extend kernel's query block (16, 32 or 64 rows: the longest new-token
run rounded up to a power of two, floor 16), and the decode kernel's split count (a power of two
up to 64, chosen from batch size and context; at batch 1, contexts of 64 x 2^i tokens reach every
count the device would use). CUDA graphs compile the page-table decode variants when captured.

Dummy batches read and write only slot 0: every token's slot table points at dummy page 0, and
page 0 is zeroed afterwards, since not every backend's store drops writes there (torch's does not).
"""

from __future__ import annotations

import logging
import time

import torch

from sglang_pd.core.step import ForwardMode

from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)

EXTEND_LENS = (16, 32, 64)  # one per extend query block size
DECODE_BLOCK = 64  # keys per decode split block (the kernel's default block_n)
MAX_DECODE_SPLITS = 64


def warmup_shapes(max_len: int) -> list[tuple[ForwardMode, int]]:
    """(mode, tokens) of the single-request dummy steps: extends of EXTEND_LENS new tokens, then
    decodes at contexts of DECODE_BLOCK x 1, 2, 4, ... 64 tokens; none past ``max_len``."""
    shapes = [(ForwardMode.EXTEND, n) for n in EXTEND_LENS if n <= max_len]
    blocks = 1
    while blocks <= MAX_DECODE_SPLITS and DECODE_BLOCK * blocks <= max_len:
        shapes.append((ForwardMode.DECODE, DECODE_BLOCK * blocks))
        blocks *= 2
    return shapes


def _dummy_batch(runner: ModelRunner, mode: ForwardMode, tokens: int) -> ForwardBatch:
    device = runner.device
    new = 1 if mode == ForwardMode.DECODE else tokens
    return ForwardBatch(
        mode=mode, input_ids=torch.zeros(new, dtype=torch.long, device=device),
        positions=torch.arange(tokens - new, tokens, device=device),
        out_cache_loc=torch.zeros(new, dtype=torch.long, device=device),
        seq_lens=torch.tensor([tokens]), extend_lens=torch.tensor([new]),
        token_slots=torch.zeros(1, tokens, dtype=torch.long, device=device),
        kv_pool=runner.kv_pool, attn_backend=runner.attn_backend)


@torch.inference_mode()
def warm_up(runner: ModelRunner, max_len: int) -> int:
    """Run every shape of warmup_shapes(max_len) once, eagerly; returns how many ran."""
    start = time.perf_counter()
    shapes = warmup_shapes(max_len)
    for mode, tokens in shapes:
        batch = _dummy_batch(runner, mode, tokens)
        runner.attn_backend.init_forward_metadata(batch)
        runner.model.forward(batch)
    runner.kv_pool.kv_buffer[:, :, 0].zero_()  # the dummy page stays zero
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    logger.info("warm-up: %d kernel shapes in %.1f s", len(shapes), time.perf_counter() - start)
    return len(shapes)
