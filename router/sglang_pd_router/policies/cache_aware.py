"""``cache_aware``: route a prompt where its prefix is probably cached, unless that worker's
queue costs more than the recomputation saved. Pure: no I/O, no clock.

Each prefill worker has an approximate radix index of the prompts routed to it: the chained
hashes of their leading blocks (block i's entry stands for blocks 0..i, i.e. one path of a
radix tree), at most ``MAX_BLOCKS_PER_WORKER`` per worker, least recently used dropped first
(the server evicts too; an approximate index, as SGLang's router keeps, not the server's cache).
The expected hit on a worker is the share of the prompt's leading blocks found there.

The choice is one cost, ``length_aware``'s with the hit taken out: inside the request's length
pool (PLA-Serve's short/long split, the same fallback) the worker with the least predicted time
to prefill this prompt, ``(queued tokens + prompt tokens not expected cached) / throughput``.
An idle worker holding the history wins; a loaded one loses once its queue outweighs the
recomputation it would save. Ties: fewer in flight, a dedicated pool member, lower index.
The pick's expected hit is left in ``last_pick_hit``: the router charges the worker's queue
only the prompt tokens not expected cached, as the cost above assumed.

Blocks: the router passes token ids in blocks of ``ID_BLOCK`` ids, or text in blocks of
``TEXT_BLOCK`` characters (``prefix_blocks``); the simulator passes Mooncake ``hash_ids`` (one
block each).

On a decode list (``--decode-policy cache_aware``) the same index, one per decode worker, steers
a follow-up to the decode that already holds its history: with decode-side reuse
(``--disaggregation-decode-enable-radix-cache``, disaggregation/decode_reuse.py) that decode
takes only the new pages over the wire. Reuse saves transfer, not decode compute, while load
costs every request there time per output token, so load bounds it: among the decodes holding
at most ``RoutingConfig.decode_reuse_slack`` requests more than the least loaded one, the one
with the longest expected reuse, ties (no history anywhere included) by ``length_aware``'s decode
key. Without decode-side reuse on the servers this buys nothing: keep ``length_aware`` there.
"""

from __future__ import annotations

from typing import Any

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from .base import (
    RouteRequest,
    RoutingConfig,
    WorkerView,
    decode_held,
    load_key,
    predicted_queue_s,
    request_class_of,
)
from .length_aware import LengthAwarePolicy

ID_BLOCK = 16  # token ids per block (a few KV pages)
TEXT_BLOCK = 64  # characters per block (about 16 tokens)
MAX_BLOCKS_PER_WORKER = 200_000  # index entries kept per worker (~ a few million tokens)


def prefix_blocks(prompt: Sequence[int] | str) -> list[Hashable]:
    """A prompt as whole blocks (the trailing partial block is never a hit on a server either)."""
    size = TEXT_BLOCK if isinstance(prompt, str) else ID_BLOCK
    if isinstance(prompt, str):
        return [prompt[i: i + size] for i in range(0, len(prompt) - size + 1, size)]
    return [tuple(prompt[i: i + size]) for i in range(0, len(prompt) - size + 1, size)]


def request_prefix_blocks(body: dict[str, Any]) -> list[Hashable]:
    """Blocks of a /generate body's single prompt (``input_ids`` or ``text``); [] for batches,
    chat messages or anything else (the policy then routes as ``length_aware``)."""
    ids, text = body.get("input_ids"), body.get("text")
    if isinstance(ids, list) and ids and all(type(t) is int for t in ids):
        return prefix_blocks(ids)
    if isinstance(text, str):
        return prefix_blocks(text)
    return []


def chain(blocks: Sequence[Hashable]) -> list[int]:
    """Hash of each leading run of blocks: entry i names the path blocks[0..i]."""
    out, h = [], 0
    for b in blocks:
        h = hash((h, b))
        out.append(h)
    return out


class PrefixIndex:
    """One worker's approximate radix index: chained block hashes, LRU-bounded."""

    def __init__(self, capacity: int = MAX_BLOCKS_PER_WORKER) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, None] = OrderedDict()

    def match(self, hashes: Sequence[int]) -> int:
        """Leading blocks present (a path stops at its first missing block)."""
        n = 0
        for h in hashes:
            if h not in self._entries:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._entries[h] = None
            self._entries.move_to_end(h)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class CacheAwarePolicy(LengthAwarePolicy):
    reads_prefix_blocks = True  # RoutingPolicy: the router hashes the prompt for it
    name = "cache_aware"

    def __init__(self, cfg: RoutingConfig | None = None, seed: int | None = None) -> None:
        super().__init__(cfg, seed)
        self.indexes: dict[str, PrefixIndex] = {}  # by worker url

    def expected_hit(self, req: RouteRequest, worker: WorkerView, hashes: Sequence[int] | None = None) -> int:
        """Prompt tokens expected cached on ``worker`` (the share of leading blocks found)."""
        hashes = chain(req.prefix_blocks) if hashes is None else hashes
        index = self.indexes.get(worker.url)
        if not hashes or index is None:
            return 0
        return req.prompt_len * index.match(hashes) // len(hashes)

    def select(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> int | None:
        self.last_pick_hit = 0
        decode = [i for i, w in enumerate(workers) if w.healthy and w.kind == "decode"]
        if decode and req.prefix_blocks:
            return self._select_decode(req, workers, decode)
        prefill = [i for i, w in enumerate(workers) if w.healthy and w.kind == "prefill"]
        if not prefill or not req.prefix_blocks:
            return super().select(req, workers, now)
        cls = request_class_of(req, self.cfg)
        pool = [i for i in prefill if workers[i].prefill_role in (cls, "both")] or prefill
        hashes = chain(req.prefix_blocks)
        base_new = max(req.prompt_len - req.cached_len, 0)

        def key(i: int) -> tuple[float, int, int, int]:
            w = workers[i]
            hit = self.expected_hit(req, w, hashes)
            return (predicted_queue_s(w, self.cfg, max(base_new - hit, 0)), w.in_flight,
                    0 if w.prefill_role == cls else 1, i)

        best = min(pool, key=key)
        self.last_pick_hit = min(self.expected_hit(req, workers[best], hashes), base_new)
        self.indexes.setdefault(workers[best].url, PrefixIndex()).insert(hashes)
        return best

    def _select_decode(self, req: RouteRequest, workers: Sequence[WorkerView], decode: list[int]) -> int:
        """The decode expected to reuse the most of the prompt, within the load slack."""
        hashes = chain(req.prefix_blocks)
        least = min(decode_held(workers[i]) for i in decode)
        near = [i for i in decode if decode_held(workers[i]) <= least + self.cfg.decode_reuse_slack]
        best = min(near, key=lambda i: (-self.expected_hit(req, workers[i], hashes),
                                        load_key(workers[i], self.cfg), i))
        self.indexes.setdefault(workers[best].url, PrefixIndex()).insert(hashes)
        return best
