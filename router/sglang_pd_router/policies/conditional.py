"""Conditional disaggregation (issue 34 item 3): a short prompt is prefilled on its decode worker,
with no prefill leg and no KV transfer, when the prefill it would go to is loaded.

Disaggregation pays for itself on long prompts (a long prefill would stall every decode step it
shares an engine with) and costs the short ones: a short prompt's own prefill is a few
milliseconds, but through a prefill worker it waits behind that worker's queue, then for the
transfer. llm-d's PD decider and Dynamo both skip the prefill leg for prompts under a length
bound; Dynamo also when the prefill queue is long. Here both conditions must hold, plus a bound
on the decode worker's own queue of local prefills, because every local prefill step delays the
decode steps of the requests it runs (their TPOT):

- the prompt's new tokens are at most ``max_local_tokens`` (a decode step with one such prefill
  in it stays within one short chunk);
- the picked prefill has at least ``min_prefill_queue_tokens`` queued, and more than the decode
  worker (otherwise the prefill path is not slower for this prompt); 0 turns this condition off:
  short prompts are then prefilled on decode by length alone, as llm-d's PD decider does;
- the decode worker's own prefill queue plus this prompt stays within
  ``max_decode_queue_tokens``.

Token counts, not seconds: the router learns no per-worker prefill throughput yet
(``WorkerView.prefill_tokens_per_s`` is 0), and comparing the two queues in tokens is the same
comparison as in predicted seconds at one rate.

Pure: the router (proxy.py) and the simulator call ``prefill_on_decode`` with views they built.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import RouteRequest, RoutingConfig, WorkerView

# The bootstrap_host that tells a PD server to compute the request itself, with no transfer:
# SGLang's fake host, which our servers already honour for /health_generate. It must equal
# sglang_pd.protocol.FAKE_BOOTSTRAP_HOST (a unit test checks; the router never imports the server).
LOCAL_PREFILL_HOST = "2.2.2.2"


@dataclass(frozen=True)
class ConditionalConfig:
    max_local_tokens: int | None = None  # None: the short threshold (short prompts only)
    min_prefill_queue_tokens: int = 512  # "loaded": about one chunk queued ahead
    max_decode_queue_tokens: int = 512  # local prefills waiting on the decode worker, at most

    def __post_init__(self) -> None:
        for name in ("max_local_tokens", "min_prefill_queue_tokens", "max_decode_queue_tokens"):
            value = getattr(self, name)
            if value is None and name == "max_local_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"conditional disaggregation: {name} must be an int >= 0, "
                                 f"got {value!r}")


def prefill_on_decode(req: RouteRequest, prefill: WorkerView, decode: WorkerView,
                      cfg: ConditionalConfig, routing: RoutingConfig) -> bool:
    """True when ``req`` should be prefilled on ``decode`` rather than sent to ``prefill`` (the
    worker the prefill policy picked); ``routing`` gives the short threshold."""
    new_tokens = max(req.prompt_len - req.cached_len, 0)
    limit = routing.short_prefill_threshold if cfg.max_local_tokens is None else cfg.max_local_tokens
    if not decode.healthy or new_tokens > limit:
        return False
    if decode.queued_prefill_tokens + new_tokens > cfg.max_decode_queue_tokens:
        return False
    if cfg.min_prefill_queue_tokens == 0:  # by length alone
        return True
    queued = prefill.queued_prefill_tokens
    return queued >= cfg.min_prefill_queue_tokens and queued > decode.queued_prefill_tokens
