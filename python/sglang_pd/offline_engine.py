"""``sglang_pd.Engine``: the offline API (as ``sglang.Engine``), in-process.

It drives the very EngineCore that the server's engine process runs (same scheduler, model
runner and sampler), stepping it until the submitted requests finish.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from sglang_pd import request_params
from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.frontend.detokenizer import IncrementalDetokenizer, OutputText
from sglang_pd.frontend.tokenizer import TokenizerBundle, load_tokenizer
from sglang_pd.protocol import GenerateReq, ReqOutput, Slo
from sglang_pd.request_params import parse_sampling_params
from sglang_pd.server_args import ServerArgs


def parse_slo(slo: dict[str, float] | None, default: Slo | None = None) -> Slo | None:
    """``slo={"ttft_ms": .., "tpot_ms": ..}`` as the HTTP body's, resolved the same way."""
    return request_params.parse_slo(slo, None, default)


class Engine:
    def __init__(self, model_path: str | None = None, **server_args: Any) -> None:
        if model_path is not None:
            server_args["model_path"] = model_path
        self.server_args = ServerArgs(**server_args)
        self.core: EngineCore | None = EngineCore(self.server_args)
        self.tokenizer: TokenizerBundle | None = None
        if not self.server_args.skip_tokenizer_init:
            self.tokenizer = load_tokenizer(self.server_args.tokenizer_dir)
        self._ids = itertools.count()

    # ------------------------------------------------------------------ API
    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, return_logprob: bool = False,
                 top_logprobs_num: int = 0, slo: dict[str, float] | None = None,
                 ) -> dict[str, Any] | list[dict[str, Any]]:
        """``slo``: {"ttft_ms": .., "tpot_ms": ..} for every prompt (else the engine's defaults)."""
        prompts, single = self._normalize(prompt, input_ids)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts")
        resolved = parse_slo(slo, request_params.default_slo(self.server_args.slo_ttft_ms,
                                                             self.server_args.slo_tpot_ms))
        reqs = [GenerateReq(rid=f"offline-{next(self._ids)}", input_ids=ids,
                            sampling_params=parse_sampling_params(p), return_logprob=return_logprob,
                            top_logprobs_num=top_logprobs_num, arrival_time=time.time(),
                            slo=resolved)
                for ids, p in zip(prompts, params)]
        results = self._run(reqs)
        return results[0] if single else results

    def shutdown(self) -> None:
        if self.core is not None:
            self.core.close()  # PD mode: NIXL agent and bootstrap sockets
            self.core = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ internals
    def _normalize(self, prompt: Any, input_ids: Any) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt or input_ids")
        if input_ids is not None:
            single = bool(input_ids) and isinstance(input_ids[0], int)
            return ([list(input_ids)] if single else [list(x) for x in input_ids]), single
        if self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; this engine runs with skip_tokenizer_init")
        single = isinstance(prompt, str)
        texts = [prompt] if single else list(prompt)
        return [self.tokenizer.encode(t) for t in texts], single

    def _run(self, reqs: list[GenerateReq]) -> list[dict[str, Any]]:
        core = self.core
        if core is None:
            raise RuntimeError("engine is shut down")
        start = time.perf_counter()
        state: dict[str, dict[str, Any]] = {r.rid: {"ids": [], "out": None, "lp": [], "top": []} for r in reqs}
        for r in reqs:
            core.add_request(r)
        pending = set(state)
        while pending:
            wait = core.wait_s()
            if wait:  # a policy holds (batching window) or transfers must free pages: no spinning
                time.sleep(wait)
            for out in core.step():
                st = state[out.rid]
                st["ids"].extend(out.new_token_ids)
                st["lp"].extend(out.output_token_logprobs or [])
                st["top"].extend(out.output_top_logprobs or [])
                if out.finish_reason is not None:
                    st["out"] = out
                    st["latency"] = time.perf_counter() - start
                    pending.discard(out.rid)
        return [self._result(r, state[r.rid]) for r in reqs]

    def _result(self, req: GenerateReq, st: dict[str, Any]) -> dict[str, Any]:
        out: ReqOutput = st["out"]
        if out.error_status:
            raise ValueError(str((out.finish_reason or {}).get("message", "request failed")))
        ids: list[int] = st["ids"]
        text = ""
        if self.tokenizer is not None:  # the same final text as the HTTP server's
            sp = req.sampling_params
            visible = OutputText(IncrementalDetokenizer(self.tokenizer, sp.skip_special_tokens),
                                 list(sp.stop), sp.no_stop_trim)
            visible.finish(ids, (out.finish_reason or {}).get("matched"))
            text = visible.visible
        meta: dict[str, Any] = {"id": req.rid, "finish_reason": out.finish_reason,
                                "prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                                "cached_tokens": out.cached_tokens, "e2e_latency": st["latency"]}
        if req.return_logprob:
            meta["output_token_logprobs"] = [[lp.logprob, lp.token_id, None] for lp in st["lp"]]
            if req.top_logprobs_num:
                meta["output_top_logprobs"] = [[[x.logprob, x.token_id, None] for x in top] for top in st["top"]]
        return {"text": text, "output_ids": ids, "meta_info": meta}
