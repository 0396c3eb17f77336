"""Issue 22 item 4, engine side: a request whose own sampling fails fails alone; the others in
its batch go on. The real EngineCore on the tiny model; sampling made to fail for one request."""

from __future__ import annotations

from sglang_pd.engine import executor
from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.protocol import GenerateReq, SamplingParams
from sglang_pd.server_args import ServerArgs


def test_one_failing_request_does_not_fail_its_batch(tiny_model_dir: str, monkeypatch) -> None:
    real_sample = executor.sample

    def flaky(logits, reqs, eos_ids):
        if any(r.rid == "bad" for r in reqs):
            raise RuntimeError("this request's sampling parameters break the sampler")
        return real_sample(logits, reqs, eos_ids)

    monkeypatch.setattr(executor, "sample", flaky)
    core = EngineCore(ServerArgs(model_path=tiny_model_dir, page_size=4, max_total_tokens=4096))
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    for rid in ("a", "bad", "b"):
        core.add_request(GenerateReq(rid=rid, input_ids=[11, 12, 13], sampling_params=params))
    finished: dict[str, object] = {}
    for _ in range(50):
        for out in core.step():
            if out.finish_reason is not None:
                finished[out.rid] = out
        if len(finished) == 3:
            break
    assert finished["bad"].error_status == 500
    assert "sampling failed" in finished["bad"].finish_reason["message"]
    for rid in ("a", "b"):
        assert finished[rid].error_status == 0 and finished[rid].completion_tokens == 4
    core.check_integrity()
    assert core.allocator.num_free == core.allocator.num_usable
