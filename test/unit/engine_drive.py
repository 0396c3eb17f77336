"""Drive a real EngineCore to the end of a few greedy requests (engine log tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_pd.engine.engine_core import EngineCore


def serve_greedy(core: EngineCore, prompts: list[list[int]], max_new_tokens: int,
                 max_steps: int = 200) -> dict[str, list[int]]:
    """Each prompt as request ``str(i)``, streamed; the tokens each got, once all are done."""
    from sglang_pd.protocol import GenerateReq, SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    got: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, ids in enumerate(prompts):
        core.add_request(GenerateReq(rid=str(i), input_ids=ids, sampling_params=params, stream=True))
    for _ in range(max_steps):
        for out in core.step():
            assert out.error_status == 0, out.finish_reason
            got[out.rid].extend(out.new_token_ids)
        if all(len(t) == max_new_tokens for t in got.values()):
            return got
    raise AssertionError(f"not finished: {got}")
