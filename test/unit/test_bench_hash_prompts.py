"""bench_serving's Mooncake replay builds native prompts from hash_ids (one deterministic
512-token block per id), so requests sharing leading ids share prefixes token for token and
the engine's prefix cache sees real hits."""

from __future__ import annotations

from sglang_pd.bench.datasets import DatasetSpec, WorkItem, build_items
from sglang_pd.bench.prompts import PromptFactory
from sglang_pd.bench.workload import build_sessions


def test_shared_hash_ids_give_shared_prefixes() -> None:
    items = [WorkItem(1200, 4, hash_ids=(7, 8, 9)), WorkItem(1100, 4, hash_ids=(7, 8, 11)),
             WorkItem(300, 4, hash_ids=(5,)), WorkItem(40, 4)]
    a, b, c, d = (s.turns[0].new_prompt for s in build_sessions(items, [0.0] * 4, PromptFactory(vocab_size=5000), True))
    assert (len(a), len(b), len(c), len(d)) == (1200, 1100, 300, 40)
    assert a[:1024] == b[:1024] and a[1024:1100] != b[1024:1100]
    again = PromptFactory(vocab_size=5000, seed=99).block_ids((5,), 300)  # any factory, any seed
    assert c == again and a[:512] != c[:512]
    assert len(PromptFactory(vocab_size=5000).block_ids((1,), 700)) == 700  # past the last block


def test_mooncake_trace_items_carry_hash_ids_through_clamping() -> None:
    items = build_items(DatasetSpec(name="mooncake", num_prompts=50, max_input_len=2048))
    assert all(it.hash_ids for it in items) and max(it.input_len for it in items) <= 2048
    firsts = [it.hash_ids[0] for it in items]
    assert len(set(firsts)) < len(firsts)  # conversations share leading blocks
