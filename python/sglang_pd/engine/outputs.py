"""Turning a request's new tokens (or an error) into the ``ReqOutput`` the frontend gets."""

from __future__ import annotations

from sglang_pd.engine.request import Req
from sglang_pd.protocol import ReqOutput, TokenLogprob


def req_output(req: Req, status: int = 0) -> ReqOutput:
    """The tokens (and logprobs) not yet sent, with the finish reason once there is one.
    Marks them sent: each token goes out exactly once."""
    new = req.output_ids[req.sent_len:]
    req.sent_len = len(req.output_ids)
    out = ReqOutput(rid=req.rid, new_token_ids=new, prompt_tokens=req.prompt_len,
                    completion_tokens=len(req.output_ids), cached_tokens=req.cached_len,
                    finish_reason=req.finish_reason,
                    error_status=status)
    if req.return_logprob:
        out.output_token_logprobs = [TokenLogprob(lp, t) for lp, t in req.pending_logprobs]
        if req.top_logprobs_num:
            out.output_top_logprobs = [[TokenLogprob(lp, t) for lp, t in top]
                                       for top in req.pending_top_logprobs]
        req.pending_logprobs, req.pending_top_logprobs = [], []
    return out


def error_output(rid: str, prompt_tokens: int, message: str, status: int) -> ReqOutput:
    """The answer to a request refused or failed before it produced anything."""
    return ReqOutput(rid=rid, new_token_ids=[], prompt_tokens=prompt_tokens, completion_tokens=0,
                     finish_reason={"type": "abort", "message": message}, error_status=status)
