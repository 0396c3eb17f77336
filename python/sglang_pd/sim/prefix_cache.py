"""A prefill instance's prefix cache over Mooncake's ``hash_ids`` (one id per 512-token block;
a block id is a hash of the block and everything before it, so equal ids mean equal prefixes).

LRU over blocks, bounded in tokens. A request hits its longest run of leading blocks held
here; the hit sets ``cached_len`` (at most prompt - 1 tokens: the last token is always computed,
as in radix caches). Blocks are inserted when the request's prefill has finished.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 512  # Mooncake's block size


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if capacity_tokens < 0 or block_tokens < 1:
            raise ValueError(f"prefix cache capacity must be >= 0 and blocks >= 1 token, got "
                             f"{capacity_tokens}, {block_tokens}")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hash_ids: Sequence[int], prompt_len: int) -> int:
        """Cached tokens of this prompt (leading blocks held), touching them as recently used."""
        n = 0
        blocks = self._blocks
        for h in hash_ids:
            if h not in blocks:
                break
            blocks.move_to_end(h)
            n += 1
        hit = min(n * self.block_tokens, max(prompt_len - 1, 0))
        self.hit_tokens += hit
        self.lookup_tokens += prompt_len
        return hit

    def insert(self, hash_ids: Sequence[int]) -> None:
        if not self.capacity_blocks:
            return
        blocks = self._blocks
        for h in hash_ids:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0
