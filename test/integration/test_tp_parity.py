"""Tensor parallelism, the correctness bar of issue 31: greedy outputs with --tp-size 2 equal
--tp-size 1 and HF transformers token for token, for llama, qwen2, qwen3 and a llama with one KV
head (fewer KV heads than ranks: replicated). Two processes on CPU with gloo: the test process
is rank 0 (the real EngineCore, scheduler and sampler), rank 1 is the real worker process.

The batch mixes prompt lengths (some longer than the chunk size, so chunked prefill runs on both
ranks) and a request that joins while others decode."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from sglang_pd.engine.tp.inprocess import engine_core
from sglang_pd.protocol import GenerateReq, SamplingParams
from sglang_pd.server_args import ServerArgs

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 12
CHUNK = 64


def prompts(vocab: int = 6144, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 10) for _ in range(n)] for n in (3, 17, 70, 130)]


def hf_greedy(model_dir: str, batch: list[list[int]]) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None  # as ignore_eos
    with torch.inference_mode():
        return [model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                               pad_token_id=0)[0, len(ids):].tolist() for ids in batch]


def greedy(model_dir: str, tp_size: int, batch: list[list[int]]) -> tuple[list[list[int]], int]:
    """(outputs, plans sent to rank 1)."""
    args = ServerArgs(model_path=model_dir, page_size=4, chunked_prefill_size=CHUNK,
                      max_total_tokens=4096, dtype="float32", tp_size=tp_size)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    got: dict[str, list[int]] = {str(i): [] for i in range(len(batch))}
    done: set[str] = set()
    with engine_core(args) as (core, ranks):
        def drain() -> None:
            for out in core.step():
                assert out.error_status == 0, out.finish_reason
                got[out.rid].extend(out.new_token_ids)
                if out.finish_reason is not None:
                    done.add(out.rid)

        for i, ids in enumerate(batch[:-1]):
            core.add_request(GenerateReq(rid=str(i), input_ids=ids, sampling_params=params))
        for _ in range(4):
            drain()
        last = len(batch) - 1  # joins while the others decode
        core.add_request(GenerateReq(rid=str(last), input_ids=batch[last], sampling_params=params))
        for _ in range(1000):
            if len(done) == len(batch):
                break
            drain()
        core.scheduler.check_integrity()
        assert core.allocator.num_free == core.allocator.num_usable
        plans = ranks.stats.plans if ranks else 0
        if ranks:
            assert ranks.dead_rank() is None
    assert not list(Path(args.ipc_dir).glob("tp_*"))  # the ranks' sockets and args file are gone
    return [got[str(i)] for i in range(len(batch))], plans


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "llama-kv1"])
def test_tp2_greedy_equals_tp1_and_hf(arch: str, tiny_model_factory, request) -> None:
    model_dir = request.getfixturevalue("tiny_llama_kv1") if arch == "llama-kv1" else tiny_model_factory(arch)
    batch = prompts()
    want = hf_greedy(model_dir, batch)
    one, _ = greedy(model_dir, 1, batch)
    two, plans = greedy(model_dir, 2, batch)
    assert one == want
    assert two == want
    assert plans > NEW_TOKENS  # every step went to rank 1 (prefill chunks + decodes)
    assert len({tuple(t) for t in two}) == len(two)  # the outputs depend on the prompt


def test_tp_size_the_heads_do_not_allow_is_refused(tiny_model_factory) -> None:
    model_dir = tiny_model_factory("llama")  # 8 heads, 2 KV heads
    with (pytest.raises(ValueError, match=r"--tp-size 3 cannot split .* 8 attention heads"),
          engine_core(ServerArgs(model_path=model_dir, tp_size=3))):
        pass
