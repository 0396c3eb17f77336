"""Correctness anchor: greedy outputs equal HF transformers' generate, token for token, for all
three architectures; a batch of mixed lengths (some longer than the chunk size), with requests
joining while others decode. Runs the real EngineCore (the server's engine) in-process."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.protocol import GenerateReq, SamplingParams
from sglang_pd.server_args import ServerArgs

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 24
CHUNK = 64


def _prompts(vocab: int, n: int = 18, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [rng.choice([3, 9, 17, 40, 63, 64, 65, 130, 257]) for _ in range(n)]
    # ids from the ordinary (non-special) range of the tiny tokenizer
    return [[rng.randrange(10, vocab - 10) for _ in range(L)] for L in lengths]


def _hf_greedy(model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    # like our ignore_eos: EOS is an ordinary token that does not stop generation
    # (min_new_tokens would instead forbid EOS and change the greedy choice)
    model.generation_config.eos_token_id = None
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            res = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS,
                                 do_sample=False, pad_token_id=0)
            outs.append(res[0, len(ids):].tolist())
    return outs


def _ours(model_dir: str, prompts: list[list[int]], join_after: int,
          mixed: bool = False) -> list[list[int]]:
    core = EngineCore(ServerArgs(model_path=model_dir, page_size=4, chunked_prefill_size=CHUNK,
                                 max_total_tokens=16384, dtype="float32", enable_mixed_chunk=mixed))
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    got: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    done: set[str] = set()

    def drain() -> None:
        for out in core.step():
            assert out.error_status == 0, out.finish_reason
            got[out.rid].extend(out.new_token_ids)
            if out.finish_reason is not None:
                done.add(out.rid)

    first, later = prompts[:join_after], prompts[join_after:]
    for i, ids in enumerate(first):
        core.add_request(GenerateReq(rid=str(i), input_ids=ids, sampling_params=params, stream=True))
    for _ in range(6):  # the first group is decoding when the second joins
        drain()
    assert core.scheduler.running, "first group should be decoding when the others join"
    for j, ids in enumerate(later, start=join_after):
        core.add_request(GenerateReq(rid=str(j), input_ids=ids, sampling_params=params, stream=True))
    for _ in range(10_000):
        if len(done) == len(prompts):
            break
        drain()
    core.scheduler.check_integrity()
    assert core.allocator.num_free == core.allocator.num_usable
    modes = {p.mode for p in core.step_profiles}
    assert (ForwardMode.MIXED in modes) == mixed, modes  # joiners' chunks rode with decodes
    return [got[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_matches_hf_generate(arch: str, tiny_model_factory) -> None:
    model_dir = tiny_model_factory(arch)
    vocab = transformers.AutoConfig.from_pretrained(model_dir).vocab_size
    prompts = _prompts(vocab)
    assert any(len(p) > CHUNK for p in prompts) and len(prompts) >= 16
    ref = _hf_greedy(model_dir, prompts)
    for mixed in (False, True):  # --enable-mixed-chunk: prefill chunks and decodes in one forward
        ours = _ours(model_dir, prompts, join_after=8, mixed=mixed)
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert a == b, f"{arch} mixed={mixed} prompt {i} (len {len(prompts[i])}): ours {a} != HF {b}"
