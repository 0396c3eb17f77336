"""TorchAttnBackend vs a naive float64 per-request reference (GQA, random page placement)."""

from __future__ import annotations

import pytest
import torch

from model_helpers import PagedRequests, make_pool
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention import create_attention_backend
from sglang_pd.engine.attention.torch_backend import TorchAttnBackend

HQ, HKV, D, LAYERS = 8, 2, 16, 2
SCALE = D**-0.5


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q [E, HQ, D] are the last E positions of a sequence with keys/values [S, HKV, D]."""
    e, s = q.shape[0], keys.shape[0]
    group = HQ // HKV
    k = keys.double().repeat_interleave(group, dim=1)  # query head h uses KV head h // group
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("ehd,shd->hes", q.double(), k) * SCALE
    allowed = torch.arange(s)[None, :] <= torch.arange(s - e, s)[:, None]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hes,shd->ehd", probs, v).reshape(e, HQ * D)


class _World:
    """A pool where every request's full K/V history is also kept unpaged, for the reference."""

    def __init__(self, strategy: str, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.pool = make_pool(LAYERS, HKV, D, num_pages=128, page_size=4)
        self.backend = TorchAttnBackend(strategy)
        self.reqs = PagedRequests(self.pool, self.backend, seed=seed)
        self.history: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def cache_prefix(self, rid: int, n: int) -> None:
        """Pretend an earlier step stored n tokens of K/V for request rid."""
        slots = torch.tensor(self.reqs.reserve(rid, n))
        for layer in range(LAYERS):
            k, v = self.rand(n, HKV, D), self.rand(n, HKV, D)
            self.pool.k_cache(layer)[slots] = k
            self.pool.v_cache(layer)[slots] = v
            self.history[(rid, layer)] = (k, v)

    def step(self, mode: ForwardMode, new: dict[int, int], layer: int) -> None:
        batch = self.reqs.batch(mode, {rid: [0] * n for rid, n in new.items()})
        self.backend.init_forward_metadata(batch)
        t = batch.num_tokens
        q, k, v = self.rand(t, HQ, D), self.rand(t, HKV, D), self.rand(t, HKV, D)
        out = self.backend.forward(q, k, v, layer, batch, SCALE)
        assert out.shape == (t, HQ * D) and torch.isfinite(out).all()
        # the new K/V landed in their slots, in the right layer only
        torch.testing.assert_close(self.pool.k_cache(layer)[batch.out_cache_loc], k)
        torch.testing.assert_close(self.pool.v_cache(layer)[batch.out_cache_loc], v)
        assert not self.pool.kv_buffer[:, :, 0].any(), "dummy page 0 was written"
        start = 0
        for rid, n in new.items():
            old_k, old_v = self.history.get((rid, layer), (k[:0], v[:0]))
            keys = torch.cat([old_k, k[start : start + n]])
            values = torch.cat([old_v, v[start : start + n]])
            self.history[(rid, layer)] = (keys, values)
            want = _reference(q[start : start + n], keys, values)
            torch.testing.assert_close(out[start : start + n].double(), want, atol=1e-5, rtol=1e-5)
            start += n


@pytest.mark.parametrize("strategy", ["auto", "padded", "loop"])
def test_extend_with_prefixes_then_decode(strategy: str) -> None:
    w = _World(strategy, seed=1)
    w.cache_prefix(1, 7)
    w.cache_prefix(2, 13)
    w.cache_prefix(4, 1)
    # fresh prompt, chunk after a prefix, single token after a prefix, long chunk after a prefix
    w.step(ForwardMode.EXTEND, {0: 9, 1: 5, 2: 1, 3: 17, 4: 6}, layer=1)
    w.step(ForwardMode.EXTEND, {3: 3}, layer=1)  # a second chunk of a request on its own
    for _ in range(3):
        w.step(ForwardMode.DECODE, {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}, layer=1)
    w.step(ForwardMode.DECODE, {4: 1, 2: 1}, layer=1)  # a subset, in another order


def test_equal_fresh_prompts_use_causal_fast_path() -> None:
    w = _World("auto", seed=2)
    w.step(ForwardMode.EXTEND, {0: 6, 1: 6, 2: 6}, layer=0)
    w.step(ForwardMode.DECODE, {0: 1, 1: 1, 2: 1}, layer=0)


def test_auto_loops_when_padding_would_waste_work() -> None:
    w = _World("auto", seed=3)
    w.cache_prefix(0, 60)
    batch = w.reqs.batch(ForwardMode.EXTEND, {0: [0] * 40, 1: [0], 2: [0] * 2})
    w.backend.init_forward_metadata(batch)
    assert batch.attn_metadata.requests is not None
    batch = w.reqs.batch(ForwardMode.EXTEND, {3: [0] * 8, 4: [0] * 7})
    w.backend.init_forward_metadata(batch)
    assert batch.attn_metadata.requests is None


def test_auto_loops_over_prompts_of_different_lengths_unless_tiny() -> None:
    """An explicit mask keeps SDPA off its causal kernel: 'auto' pads fresh prompts of one
    length (no mask) and tiny ones only; 40 and 30 tokens (padding wastes 1.4x) loop."""
    w = _World("auto", seed=4)
    cases = [({0: 40, 1: 30}, True), ({2: 24, 3: 24, 4: 24}, False), ({5: 12, 6: 9, 7: 16}, False)]
    for new, loops in cases:
        batch = w.reqs.batch(ForwardMode.EXTEND, {rid: [0] * n for rid, n in new.items()})
        w.backend.init_forward_metadata(batch)
        assert (batch.attn_metadata.requests is not None) == loops, new


def test_registry_builds_torch_backend() -> None:
    assert isinstance(create_attention_backend("torch"), TorchAttnBackend)
    with pytest.raises(ValueError, match="extend_strategy"):
        TorchAttnBackend("bogus")


def test_bfloat16_pool() -> None:
    pool = make_pool(1, HKV, D, num_pages=16, page_size=4, dtype=torch.bfloat16)
    backend = TorchAttnBackend()
    reqs = PagedRequests(pool, backend)
    batch = reqs.batch(ForwardMode.EXTEND, {0: [0] * 5, 1: [0] * 3})
    backend.init_forward_metadata(batch)
    q, k, v = (torch.randn(8, h, D, dtype=torch.bfloat16) for h in (HQ, HKV, HKV))
    out = backend.forward(q, k, v, 0, batch, SCALE)
    assert out.dtype == torch.bfloat16
    want = _reference(q[:5].float(), k[:5].float(), v[:5].float())
    torch.testing.assert_close(out[:5].double(), want, atol=3e-2, rtol=3e-2)
