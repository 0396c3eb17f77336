"""Hand-built ForwardBatches over a KVPool, for model and attention tests.

``PagedRequests`` plays the model runner's role in miniature: it hands out pages from a
shuffled free list one page at a time as requests grow, so a request's pages are
non-contiguous and interleaved with other requests' pages.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.base import AttentionBackend
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.kv_pool import KVPool


@dataclass
class _Seq:
    pages: list[int] = field(default_factory=list)
    length: int = 0


class PagedRequests:
    def __init__(self, pool: KVPool, backend: AttentionBackend, seed: int = 0) -> None:
        self.pool = pool
        self.backend = backend
        free = list(range(1, pool.num_pages))  # page 0 is the dummy page
        random.Random(seed).shuffle(free)
        self.free = free
        self.seqs: dict[int, _Seq] = {}

    def reserve(self, rid: int, n: int) -> list[int]:
        """Reserve KV slots for n more tokens of request rid; returns their slot ids."""
        seq = self.seqs.setdefault(rid, _Seq())
        ps = self.pool.page_size
        slots = []
        for i in range(seq.length, seq.length + n):
            if i // ps == len(seq.pages):
                seq.pages.append(self.free.pop())
            slots.append(seq.pages[i // ps] * ps + i % ps)
        seq.length += n
        return slots

    def slots_of(self, rid: int) -> list[int]:
        seq, ps = self.seqs[rid], self.pool.page_size
        return [seq.pages[i // ps] * ps + i % ps for i in range(seq.length)]

    def batch(self, mode: ForwardMode, new_tokens: dict[int, list[int]]) -> ForwardBatch:
        """A step in which each request rid (in dict order) gets ``new_tokens[rid]`` appended."""
        ids: list[int] = []
        pos: list[int] = []
        loc: list[int] = []
        for rid, toks in new_tokens.items():
            start = self.seqs[rid].length if rid in self.seqs else 0
            if mode == ForwardMode.DECODE and len(toks) != 1:
                raise ValueError("decode steps take exactly one token per request")
            ids += toks
            pos += range(start, start + len(toks))
            loc += self.reserve(rid, len(toks))
        rids = list(new_tokens)
        seq_lens = [self.seqs[r].length for r in rids]
        table = torch.zeros(len(rids), max(seq_lens), dtype=torch.int64)
        for b, r in enumerate(rids):
            table[b, : seq_lens[b]] = torch.tensor(self.slots_of(r))
        device = self.pool.kv_buffer.device  # lengths stay on the host, as the runner keeps them
        return ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=torch.tensor(pos, dtype=torch.int64, device=device),
            out_cache_loc=torch.tensor(loc, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            extend_lens=torch.tensor([len(new_tokens[r]) for r in rids], dtype=torch.int64),
            token_slots=table.to(device),
            kv_pool=self.pool,
            attn_backend=self.backend,
        )


def make_pool(
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    num_pages: int = 256,
    page_size: int = 4,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> KVPool:
    return KVPool(num_layers, num_pages, page_size, kv_heads, head_dim, dtype, device)


TINY_ARCHS: tuple[str, ...] = ("llama", "qwen2", "qwen3")


def build_tiny_models(root: Path) -> dict[str, Path]:
    """All tiny archs under root/<arch>, training the (shared) tokenizer once."""
    from sglang_pd.tools.make_tiny_model import TinySpec, make_tiny_model, train_tokenizer

    tokenizer_json = train_tokenizer(TinySpec().vocab_size)
    return {a: make_tiny_model(root / a, a, tokenizer_json=tokenizer_json) for a in TINY_ARCHS}
